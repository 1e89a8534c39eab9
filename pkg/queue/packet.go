package queue

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Packet is what the Runtime knows about a queued packet: the addresses, the
// transport protocol and, for TCP, UDP, UDP-Lite, SCTP and DCCP, the ports.
// Ports are 0 for other protocols and for non-first fragments.
type Packet struct {
	// Family is 4 or 6.
	Family uint8
	Src    netip.Addr
	Dst    netip.Addr
	// Proto is the IP protocol number (after IPv6 extension headers).
	Proto   uint8
	SrcPort uint16
	DstPort uint16
}

// Errors of ParsePacket.
var (
	ErrTruncated = errors.New("truncated packet")
	ErrVersion   = errors.New("not an IPv4 or IPv6 packet")
	ErrHeader    = errors.New("malformed IP header")
	ErrExtHeader = errors.New("too many IPv6 extension headers")
)

// maxIPv6ExtHeaders bounds the extension header walk.
const maxIPv6ExtHeaders = 8

// ParsePacket parses the IPv4 or IPv6 header at the start of b, skips IPv6
// extension headers (hop-by-hop, routing, fragment, destination options, AH)
// and reads the ports of TCP, UDP, UDP-Lite, SCTP and DCCP. It does not
// allocate. A non-first fragment has no transport header: it is returned with
// the fragment's protocol and ports 0. Lengths are checked against len(b) only
// (b is usually cut at the copy range), not against the IP total length.
func ParsePacket(b []byte) (Packet, error) {
	p, _, err := parsePacket(b)
	return p, err
}

// parsePacket is ParsePacket that also returns where the transport header
// starts (0 when there is none).
func parsePacket(b []byte) (p Packet, l4 int, err error) {
	if len(b) < 1 {
		return p, 0, ErrTruncated
	}
	var off int
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return p, 0, ErrTruncated
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 {
			return p, 0, ErrHeader
		}
		if len(b) < ihl {
			return p, 0, ErrTruncated
		}
		p.Family = 4
		p.Proto = b[9]
		p.Src = netip.AddrFrom4([4]byte(b[12:16]))
		p.Dst = netip.AddrFrom4([4]byte(b[16:20]))
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 {
			return p, 0, nil // non-first fragment
		}
		off = ihl
	case 6:
		if len(b) < 40 {
			return p, 0, ErrTruncated
		}
		p.Family = 6
		p.Src = netip.AddrFrom16([16]byte(b[8:24]))
		p.Dst = netip.AddrFrom16([16]byte(b[24:40]))
		next := b[6]
		off = 40
		for i := 0; ; i++ {
			var hlen int
			switch next {
			case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS:
				if len(b) < off+2 {
					return p, 0, ErrTruncated
				}
				hlen = (int(b[off+1]) + 1) * 8
			case unix.IPPROTO_AH:
				if len(b) < off+2 {
					return p, 0, ErrTruncated
				}
				hlen = (int(b[off+1]) + 2) * 4
			case unix.IPPROTO_FRAGMENT:
				if len(b) < off+8 {
					return p, 0, ErrTruncated
				}
				if binary.BigEndian.Uint16(b[off+2:off+4])&^7 != 0 {
					p.Proto = b[off] // non-first fragment
					return p, 0, nil
				}
				hlen = 8
			default:
				p.Proto = next
				goto l4
			}
			if i == maxIPv6ExtHeaders {
				return p, 0, ErrExtHeader
			}
			if len(b) < off+hlen {
				return p, 0, ErrTruncated
			}
			next = b[off]
			off += hlen
		}
	default:
		return p, 0, ErrVersion
	}
l4:
	switch p.Proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_UDPLITE, unix.IPPROTO_SCTP, unix.IPPROTO_DCCP:
		if len(b) < off+4 {
			return p, 0, ErrTruncated
		}
		p.SrcPort = binary.BigEndian.Uint16(b[off : off+2])
		p.DstPort = binary.BigEndian.Uint16(b[off+2 : off+4])
	}
	return p, off, nil
}
