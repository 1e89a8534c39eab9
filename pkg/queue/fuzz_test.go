package queue

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzParsePacket feeds arbitrary bytes, as a queued packet's copy range,
// to the header parser. Invariants: it never panics (an out-of-range read
// would), it is deterministic, and a packet it accepts is consistent with
// its bytes: the family is the version nibble, the addresses are the
// header's, the transport header lies inside the buffer and the ports are
// its first four bytes (0 for protocols without ports and non-first
// fragments), and bytes appended after the buffer change nothing (lengths
// are checked against the buffer only).
func FuzzParsePacket(f *testing.F) {
	for _, b := range [][]byte{
		ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0, nil, ports(1234, 80, 16)),
		ipv4(unix.IPPROTO_UDP, "10.0.0.1", "10.0.0.2", 0, []byte{1, 1, 1, 0}, ports(53, 53, 4)),
		ipv4(unix.IPPROTO_SCTP, "10.0.0.1", "10.0.0.2", 0x2000, nil, ports(5000, 5001, 8)),
		ipv4(unix.IPPROTO_TCP, "10.0.0.1", "10.0.0.2", 0x0010, nil, nil), // non-first fragment
		ipv4(unix.IPPROTO_ICMP, "10.0.0.1", "10.0.0.2", 0, nil, []byte{8, 0, 0, 0}),
		ipv6(unix.IPPROTO_TCP, "fd00::1", "fd00::2", ports(1234, 443, 16)),
		ipv6(unix.IPPROTO_HOPOPTS, "fd00::1", "fd00::2", cat(ext(unix.IPPROTO_ROUTING, 0), ext(unix.IPPROTO_UDP, 1), ports(53, 53, 4))),
		ipv6(unix.IPPROTO_FRAGMENT, "fd00::1", "fd00::2", cat(frag6(unix.IPPROTO_UDP, 0, true), ports(1, 2, 4))),
		ipv6(unix.IPPROTO_FRAGMENT, "fd00::1", "fd00::2", frag6(unix.IPPROTO_UDP, 8, false)),
		ipv6(unix.IPPROTO_AH, "fd00::1", "fd00::2", cat(ah(unix.IPPROTO_SCTP, 1), ports(7, 8, 4))),
		ipv6(unix.IPPROTO_ICMPV6, "fd00::1", "fd00::2", []byte{128, 0, 0, 0}),
		{0x45}, {0x60}, {0x4f, 0}, {},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, l4, err := parsePacket(b)
		p2, l42, err2 := parsePacket(b)
		if p != p2 || l4 != l42 || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %+v %d %v, then %+v %d %v", p, l4, err, p2, l42, err2)
		}
		if err != nil {
			return
		}
		if pub, perr := ParsePacket(b); pub != p || perr != nil {
			t.Fatalf("ParsePacket %+v %v, parsePacket %+v", pub, perr, p)
		}
		switch p.Family {
		case 4:
			if b[0]>>4 != 4 || !p.Src.Is4() || !p.Dst.Is4() || p.Src.As4() != [4]byte(b[12:16]) || p.Dst.As4() != [4]byte(b[16:20]) {
				t.Fatalf("IPv4 packet %+v inconsistent with its header % x", p, b[:20])
			}
		case 6:
			if b[0]>>4 != 6 || !p.Src.Is6() || !p.Dst.Is6() || p.Src.As16() != [16]byte(b[8:24]) || p.Dst.As16() != [16]byte(b[24:40]) {
				t.Fatalf("IPv6 packet %+v inconsistent with its header", p)
			}
		default:
			t.Fatalf("family %d", p.Family)
		}
		if l4 < 0 || l4 > len(b) {
			t.Fatalf("transport header at %d of %d bytes", l4, len(b))
		}
		switch p.Proto {
		case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_UDPLITE, unix.IPPROTO_SCTP, unix.IPPROTO_DCCP:
			if l4 != 0 && (l4+4 > len(b) || p.SrcPort != binary.BigEndian.Uint16(b[l4:]) || p.DstPort != binary.BigEndian.Uint16(b[l4+2:])) {
				t.Fatalf("ports %d->%d do not match the transport header at %d", p.SrcPort, p.DstPort, l4)
			}
			if l4 == 0 && (p.SrcPort != 0 || p.DstPort != 0) {
				t.Fatalf("ports %d->%d without a transport header", p.SrcPort, p.DstPort)
			}
		default:
			if p.SrcPort != 0 || p.DstPort != 0 {
				t.Fatalf("protocol %d has no ports, got %d->%d", p.Proto, p.SrcPort, p.DstPort)
			}
		}
		longer := append(append([]byte(nil), b...), 0xde, 0xad, 0xbe, 0xef)
		if p3, l43, err3 := parsePacket(longer); err3 != nil || p3 != p || l43 != l4 {
			t.Fatalf("trailing bytes changed the result: %+v %d %v, want %+v %d", p3, l43, err3, p, l4)
		}
	})
}

// FuzzParseQueueMsg feeds arbitrary bytes, as one read of the queue socket,
// to the netlink splitter and the NFQNL_MSG_PACKET parser. Invariants: no
// panic; every message body and payload lies inside the read; a message
// built from the fuzzed id, mark and payload parses back to them.
func FuzzParseQueueMsg(f *testing.F) {
	mark := uint32(0x4000)
	f.Add(packetMsg(1, &mark, []byte{0x45, 0, 0, 20}), uint32(7), uint32(0x100000), []byte{0x60, 1, 2})
	f.Add(packetMsg(2, nil, nil), uint32(0), uint32(0), []byte{})
	f.Add(append(packetMsg(3, nil, []byte{1}), packetMsg(4, &mark, []byte{2, 3})...), uint32(1), uint32(1), []byte{0})
	f.Add([]byte{16, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint32(0), uint32(0), []byte(nil))
	f.Add([]byte{255, 255, 0, 0}, uint32(0), uint32(0), []byte(nil))
	f.Fuzz(func(t *testing.T, read []byte, id, m uint32, payload []byte) {
		for rest := read; len(rest) > 0; {
			_, _, body, next, err := nextNetlinkMsg(rest)
			if err != nil {
				break
			}
			if !within(read, body) || len(next) >= len(rest) {
				t.Fatalf("body of %d bytes outside the read of %d, or no progress (%d left of %d)", len(body), len(read), len(next), len(rest))
			}
			var msg queueMsg
			if parseQueueMsg(body, &msg) == nil && !within(body, msg.Payload) {
				t.Fatalf("payload of %d bytes outside the body of %d", len(msg.Payload), len(body))
			}
			rest = next
		}
		if len(payload) > 0xffff-64 {
			return
		}
		built := packetMsg(id, &m, payload)
		_, _, body, _, err := nextNetlinkMsg(built)
		if err != nil {
			t.Fatalf("a built message does not split: %v", err)
		}
		var msg queueMsg
		if err := parseQueueMsg(body, &msg); err != nil || !msg.HasID || msg.ID != id || msg.Mark != m || !bytes.Equal(msg.Payload, payload) {
			t.Fatalf("built id %d mark %#x payload % x; parsed %+v, %v", id, m, payload, msg, err)
		}
	})
}

// within reports whether sub is a part of b's memory (an empty sub is).
func within(b, sub []byte) bool {
	if len(sub) == 0 {
		return true
	}
	for i := range b {
		if &b[i] == &sub[0] {
			return i+len(sub) <= len(b)
		}
	}
	return false
}
