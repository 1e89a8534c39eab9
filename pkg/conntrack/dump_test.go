package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// attr encodes a netlink attribute (nested when it holds attributes).
func attr(typ uint16, nested bool, v []byte) []byte {
	if nested {
		typ |= unix.NLA_F_NESTED
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func tupleAttr(typ uint16, src, dst netip.Addr, proto uint8, sport, dport, zone uint16) []byte {
	st, dt := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Is6() {
		st, dt = ctaIPv6Src, ctaIPv6Dst
	}
	ip := append(attr(st, false, src.AsSlice()), attr(dt, false, dst.AsSlice())...)
	pr := append(append(attr(ctaProtoNum, false, []byte{proto}), attr(ctaProtoSrcPort, false, be16(sport))...), attr(ctaProtoDstPort, false, be16(dport))...)
	if proto == unix.IPPROTO_ICMP || proto == unix.IPPROTO_ICMPV6 {
		// An echo: its identifier (sport of the original tuple), the
		// request's type in the original tuple, the reply's in the reply.
		id, typ4, typ6 := sport, byte(8), byte(128)
		if typ == ctaTupleReply {
			id, typ4, typ6 = dport, 0, 129
		}
		pr = attr(ctaProtoNum, false, []byte{proto})
		if proto == unix.IPPROTO_ICMP {
			pr = append(pr, attr(ctaProtoICMPID, false, be16(id))...)
			pr = append(pr, attr(ctaProtoICMPType, false, []byte{typ4})...)
			pr = append(pr, attr(ctaProtoICMPCode, false, []byte{0})...)
		} else {
			pr = append(pr, attr(ctaProtoICMPv6ID, false, be16(id))...)
			pr = append(pr, attr(ctaProtoICMPv6Type, false, []byte{typ6})...)
			pr = append(pr, attr(ctaProtoICMPv6Code, false, []byte{0})...)
		}
	}
	v := append(attr(ctaTupleIP, true, ip), attr(ctaTupleProto, true, pr)...)
	if zone != 0 {
		v = append(v, attr(ctaTupleZone, false, be16(zone))...)
	}
	return attr(typ, true, v)
}

// entryMessage is a dump message of one entry, as the kernel sends it
// (with attributes the decoder skips: status, timeout, counters).
func entryMessage(seq, id uint32, src, dst netip.Addr, proto uint8, sport, dport, zone uint16) []byte {
	fam := byte(unix.AF_INET)
	if src.Is6() {
		fam = unix.AF_INET6
	}
	p := []byte{fam, unix.NFNETLINK_V0, 0, 0}
	p = append(p, tupleAttr(ctaTupleOrig, src, dst, proto, sport, dport, zone)...)
	p = append(p, tupleAttr(ctaTupleReply, dst, src, proto, dport, sport, zone)...)
	p = append(p, attr(3, false, binary.BigEndian.AppendUint32(nil, 0x18e))...)                                  // CTA_STATUS
	p = append(p, attr(7, false, binary.BigEndian.AppendUint32(nil, 120))...)                                    // CTA_TIMEOUT
	p = append(p, attr(9, true, append(attr(1, false, make([]byte, 8)), attr(2, false, make([]byte, 8))...))...) // CTA_COUNTERS_ORIG
	p = append(p, attr(ctaID, false, binary.BigEndian.AppendUint32(nil, id))...)
	if zone != 0 {
		p = append(p, attr(ctaZone, false, be16(zone))...)
	}
	return nlmsg(unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCtNew, netlink.Multi, seq, p)
}

func nlmsg(typ uint16, flags netlink.HeaderFlags, seq uint32, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(nlmsgHdrLen+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, uint16(flags))
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// TestDecodeFlowAgreesWithTheLibrary: the streaming decoder reads the
// fields the revoker uses as the ctnetlink library does, for both families
// and zones, and walks a datagram of several entries to the dump's end.
func TestDecodeFlowAgreesWithTheLibrary(t *testing.T) {
	const seq = 7
	var dgram []byte
	var want []ct.Flow
	for i, c := range []struct {
		src, dst     string
		proto        uint8
		sport, dport uint16
		zone         uint16
	}{
		{"10.244.1.10", "192.0.2.10", unix.IPPROTO_TCP, 40000, 8080, 0},
		{"fd00::10", "2001:db8::10", unix.IPPROTO_UDP, 5353, 53, 0},
		{"10.244.1.11", "10.96.0.10", unix.IPPROTO_SCTP, 1, 2, 7},
		{"10.244.1.12", "10.244.2.10", unix.IPPROTO_ICMP, 0x1234, 0, 0},
		{"fd00::12", "fd00::2:10", unix.IPPROTO_ICMPV6, 0x4321, 0, 3},
		{"10.244.1.13", "192.0.2.1", unix.IPPROTO_GRE, 0, 0, 0},
	} {
		m := entryMessage(seq, uint32(100+i), netip.MustParseAddr(c.src), netip.MustParseAddr(c.dst), c.proto, c.sport, c.dport, c.zone)
		var nm netlink.Message
		if err := nm.UnmarshalBinary(m); err != nil {
			t.Fatal(err)
		}
		var ev ct.Event
		if err := ev.Unmarshal(nm); err != nil {
			t.Fatalf("the library cannot read the test's message %d: %v", i, err)
		}
		want = append(want, *ev.Flow)
		dgram = append(dgram, m...)
	}
	// A message of an earlier dump is skipped; the end comes last.
	dgram = append(entryMessage(seq-1, 1, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), unix.IPPROTO_TCP, 1, 2, 0), dgram...)
	dgram = append(dgram, nlmsg(unix.NLMSG_DONE, netlink.Multi, seq, make([]byte, 4))...)

	var got []ct.Flow
	done, err := eachMessage(dgram, seq, func(payload []byte) error {
		var f ct.Flow
		if err := decodeFlow(payload, &f); err != nil {
			return err
		}
		got = append(got, f)
		return nil
	})
	if err != nil || !done {
		t.Fatalf("eachMessage: done %v, %v", done, err)
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.ID != w.ID || g.Zone != w.Zone || g.TupleOrig != w.TupleOrig || g.TupleReply != w.TupleReply {
			t.Errorf("entry %d: decoded\n%+v %+v %+v %+v\nthe library:\n%+v %+v %+v %+v", i, g.ID, g.Zone, g.TupleOrig, g.TupleReply, w.ID, w.Zone, w.TupleOrig, w.TupleReply)
		}
		if c, ok := Forwarded(&g); !ok || c.Src != w.TupleOrig.IP.SourceAddress || c.Proto != compile.Protocol(w.TupleOrig.Proto.Protocol) ||
			c.Port != w.TupleReply.Proto.SourcePort && c.HasPorts() || c.Port != 0 && !c.HasPorts() {
			t.Errorf("entry %d: forwarded as %v, %v", i, c, ok)
		}
	}
}

// TestDecodeRejectsMalformed: truncated or inconsistent messages are
// errors, never a panic or a wrong address.
func TestDecodeRejectsMalformed(t *testing.T) {
	m := entryMessage(1, 1, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), unix.IPPROTO_TCP, 1, 2, 0)
	payload := m[nlmsgHdrLen:]
	for n := 0; n < len(payload); n++ {
		var f ct.Flow
		_ = decodeFlow(payload[:n], &f) // must not panic
	}
	if _, err := eachMessage(m[:len(m)-4], 1, func([]byte) error { return nil }); err == nil {
		t.Errorf("a message longer than its datagram was accepted")
	}
	// An IPv4 attribute holding 16 bytes.
	bad := append([]byte{unix.AF_INET, 0, 0, 0}, attr(ctaTupleOrig, true, attr(ctaTupleIP, true, attr(ctaIPv4Src, false, make([]byte, 16))))...)
	var f ct.Flow
	if err := decodeFlow(bad, &f); err == nil {
		t.Errorf("an IPv4 source of 16 bytes was accepted: %+v", f.TupleOrig)
	}
	// A dump that ends in an error.
	errMsg := nlmsg(unix.NLMSG_DONE, netlink.Multi, 1, binary.NativeEndian.AppendUint32(nil, uint32(0xffffffff-uint32(unix.EINTR)+1)))
	if done, err := eachMessage(errMsg, 1, func([]byte) error { return nil }); !done || err == nil {
		t.Errorf("a dump ending in EINTR: done %v, %v", done, err)
	}
}

// TestDecodeDoesNotAllocate: a pass's cost per entry is no allocation.
func TestDecodeDoesNotAllocate(t *testing.T) {
	m := entryMessage(1, 1, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), unix.IPPROTO_TCP, 1, 2, 3)
	var f ct.Flow
	n := testing.AllocsPerRun(100, func() {
		_, _ = eachMessage(m, 1, func(p []byte) error {
			f = ct.Flow{}
			return decodeFlow(p, &f)
		})
	})
	if n != 0 {
		t.Errorf("%v allocations per entry", n)
	}
}
