package fqdn

import (
	"encoding/binary"
)

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// segment is what the learner reads of a queued packet: the ports, for TCP
// the sequence numbers and flags, and the payload.
type segment struct {
	proto        uint8
	sport, dport uint16
	seq, ack     uint32
	flags        uint8
	data         []byte
	// cut: the packet is longer than what was queued (the copy range):
	// part of its payload is missing.
	cut bool
}

// parseSegment reads the UDP or TCP header at offset l4 of packet (which
// starts at the IP header). The payload ends where the IP header's length
// says, not at the end of the buffer.
func parseSegment(proto uint8, packet []byte, l4 int) (segment, error) {
	s := segment{proto: proto}
	if l4 <= 0 || l4 > len(packet) || len(packet) < 1 {
		return s, notLearnable(CauseMalformed)
	}
	var end int
	switch packet[0] >> 4 {
	case 4:
		if len(packet) < 20 {
			return s, notLearnable(CauseMalformed)
		}
		end = int(binary.BigEndian.Uint16(packet[2:4]))
	case 6:
		if len(packet) < 40 {
			return s, notLearnable(CauseMalformed)
		}
		// 0 is a jumbogram (or a GSO packet past 64 KiB): its length is
		// elsewhere; treat it as cut.
		end = 40 + int(binary.BigEndian.Uint16(packet[4:6]))
		if end == 40 {
			end = 1 << 30
		}
	default:
		return s, notLearnable(CauseMalformed)
	}
	if end > len(packet) {
		s.cut = true
		end = len(packet)
	}
	if end < l4 {
		return s, notLearnable(CauseMalformed)
	}
	seg := packet[l4:end]
	switch proto {
	case 17:
		if len(seg) < 8 {
			return s, notLearnable(CauseMalformed)
		}
		s.sport, s.dport = binary.BigEndian.Uint16(seg[0:2]), binary.BigEndian.Uint16(seg[2:4])
		n := int(binary.BigEndian.Uint16(seg[4:6]))
		if n < 8 || n > len(seg) {
			return s, notLearnable(CauseMalformed)
		}
		s.data = seg[8:n]
	case 6:
		if len(seg) < 20 {
			return s, notLearnable(CauseMalformed)
		}
		s.sport, s.dport = binary.BigEndian.Uint16(seg[0:2]), binary.BigEndian.Uint16(seg[2:4])
		s.seq, s.ack = binary.BigEndian.Uint32(seg[4:8]), binary.BigEndian.Uint32(seg[8:12])
		s.flags = seg[13]
		off := int(seg[12]>>4) * 4
		if off < 20 || off > len(seg) {
			return s, notLearnable(CauseMalformed)
		}
		s.data = seg[off:]
	default:
		return s, notLearnable(CauseMalformed)
	}
	return s, nil
}
