package fqdn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// FuzzParseReply: any bytes as a DNS reply. ParseReply never panics; what
// it returns is well formed: each answer names a chain (at most 16 names,
// a question of the reply first) and holds valid addresses. ReplyQuestion
// and ParseQuery never panic on the same bytes. Learn writes elements only
// for a reply one of whose questions a rule of the pod matches: no name
// reached through a CNAME admits anything.
func FuzzParseReply(f *testing.F) {
	t := &testing.T{}
	f.Add(reply(t, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", cname: "edge.cdn.test.", ttl: 60},
		rr{name: "edge.cdn.test.", addr: "192.0.2.1", ttl: 2}))
	f.Add(reply(t, "a.example.org.", dnsmessage.TypeAAAA, false, rr{name: "a.example.org.", addr: "2001:db8::1", ttl: 30}))
	f.Add(reply(t, "loop.test.", dnsmessage.TypeA, false, rr{name: "loop.test.", cname: "loop.test.", ttl: 1}))
	f.Add(reply(t, "t.test.", dnsmessage.TypeA, true))
	f.Add(reply(t, "y.attacker.test.", dnsmessage.TypeA, false, rr{name: "y.attacker.test.", cname: "www.example.com.", ttl: 60},
		rr{name: "www.example.com.", addr: "203.0.113.77", ttl: 60}))
	f.Add([]byte{})
	sc, err := scenario.Parse([]byte(webScenario))
	if err != nil {
		f.Fatal(err)
	}
	prog := compile.Build(sc.Input("n1", nil, nil))
	w := &fakeWriter{}
	l, err := fqdn.New(fqdn.Config{Program: func() *compile.Program { return prog }, Writer: w,
		Trusted: func(a netip.Addr) bool { return a == server }, Logger: logr.Discard()})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		w.got = nil
		_ = l.Learn(context.Background(), server, podA4, msg)
		if len(w.got) > 0 && !anyQuestionMatches(msg, web) {
			t.Fatalf("learned %v from a reply none of whose questions rule web matches", w.got)
		}
		answers, err := fqdn.ParseReply(msg)
		_, _, _ = fqdn.ReplyQuestion(msg)
		_, _, _ = fqdn.ParseQuery(msg)
		if err != nil {
			if len(answers) != 0 {
				t.Fatalf("answers %v with error %v", answers, err)
			}
			return
		}
		for _, a := range answers {
			if len(a.Names) == 0 || len(a.Names) > 16 || len(a.Addrs) == 0 || a.TTL < 0 || a.Question() != a.Names[0] {
				t.Fatalf("malformed answer %+v", a)
			}
			if !anyQuestionMatches(msg, []compile.DomainPattern{{Suffix: a.Question()}}) {
				t.Fatalf("answer %+v: its chain does not start at a question of the reply", a)
			}
			for _, ad := range a.Addrs {
				if !ad.IsValid() || ad.Is4In6() {
					t.Fatalf("answer address %v", ad)
				}
			}
		}
	})
}

// anyQuestionMatches reports whether a pattern matches the name of a
// question of msg.
func anyQuestionMatches(msg []byte, ps []compile.DomainPattern) bool {
	var p dnsmessage.Parser
	if _, err := p.Start(msg); err != nil {
		return false
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return false
	}
	for _, q := range qs {
		if compile.DomainsMatch(ps, compile.NormalizeDomain(q.Name.String())) {
			return true
		}
	}
	return false
}

// FuzzDNSPayload: any packet, any transport offset. DNSPayload never
// panics and returns bytes of the packet after the offset.
func FuzzDNSPayload(f *testing.F) {
	udp := append(make([]byte, 20), 0, 53, 0x30, 0x39, 0, 12, 0, 0, 'd', 'n', 's', '!')
	tcp := append(make([]byte, 20), make([]byte, 20)...)
	tcp[20+12] = 5 << 4
	tcp = append(tcp, 0, 4, 'd', 'n', 's', '!')
	f.Add(uint8(17), udp, 20)
	f.Add(uint8(6), tcp, 20)
	f.Add(uint8(6), tcp[:30], 20)
	f.Fuzz(func(t *testing.T, proto uint8, packet []byte, l4 int) {
		msg, err := fqdn.DNSPayload(proto, packet, l4)
		if err != nil || msg == nil {
			return
		}
		if len(msg) > len(packet)-l4 {
			t.Fatalf("payload of %d bytes from a packet of %d after offset %d", len(msg), len(packet), l4)
		}
	})
}

// FuzzStream: any sequence of segments (any sequence numbers around the
// next byte, any data, some dropped instead of released) on a Stream. It
// never panics, its memory stays within one message (and slack), and the
// messages it delivers are exactly the frames of the byte stream it
// consumed, read from its start: every message starts at a boundary of
// the stream.
//
// The script is a list of segments: a flags byte (bit 0: the segment is
// dropped, not committed; bit 1: its length byte counts 256-byte units), a
// signed 16-bit offset of its sequence number from the stream's next byte,
// a length byte, then that many data bytes.
func FuzzStream(f *testing.F) {
	frame := func(b ...byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...) }
	seg := func(flags byte, rel int16, data []byte) []byte {
		out := []byte{flags, byte(uint16(rel) >> 8), byte(rel), byte(len(data))}
		return append(out, data...)
	}
	two := append(frame('a', 'b', 'c'), frame('d')...)
	f.Add(uint32(1000), uint16(0), seg(0, 0, two))
	f.Add(uint32(0xfffffffe), uint16(0), append(seg(0, 0, two[:3]), seg(0, 0, two[3:])...))
	f.Add(uint32(7), uint16(8), append(append(seg(0, 2, two[2:]), seg(1, 0, two[:4])...), seg(0, 0, two[:5])...))
	f.Add(uint32(7), uint16(2), seg(0, -3, append([]byte{9, 9, 9}, frame('x', 'y', 'z')...)))
	f.Fuzz(func(t *testing.T, isn uint32, limit uint16, script []byte) {
		var s fqdn.Stream
		s.Start(isn, int(limit))
		lim := int(limit)
		if lim == 0 {
			lim = 0xffff
		}
		var consumed []byte
		var got [][]byte
		tooLong := false
		for len(script) >= 4 && !tooLong {
			flags, rel, n := script[0], int16(binary.BigEndian.Uint16(script[1:3])), int(script[3])
			if flags&2 != 0 {
				n *= 256
			}
			script = script[4:]
			n = min(n, len(script))
			data := script[:n]
			script = script[n:]
			seq := s.Next() + uint32(int32(rel))
			fed := s.Feed(seq, data)
			switch fed.Kind {
			case fqdn.FeedOld, fqdn.FeedFuture:
				if len(fed.Msgs) != 0 {
					t.Fatalf("%v segment delivered messages", fed.Kind)
				}
				if fed.Kind == fqdn.FeedFuture && rel <= 0 {
					t.Fatalf("segment at offset %d from the next byte called future", rel)
				}
			case fqdn.FeedTooLong:
				tooLong = true
				continue
			case fqdn.FeedNew:
				if rel > 0 {
					t.Fatalf("segment at offset %d from the next byte read as new", rel)
				}
				if flags&1 != 0 {
					continue // dropped: the stream must not change
				}
				for _, m := range fed.Msgs {
					got = append(got, bytes.Clone(m))
				}
				consumed = append(consumed, data[-int(rel):]...)
				next := s.Next()
				s.Commit(fed)
				if s.Next()-next != uint32(len(data)+int(rel)) {
					t.Fatalf("next moved by %d for %d new bytes", s.Next()-next, len(data)+int(rel))
				}
			}
			if b := s.Buffered(); b > 2*(lim+2)+64 {
				t.Fatalf("stream buffers %d bytes, limit %d", b, lim)
			}
		}
		// The reference: frames of the consumed bytes from the start.
		var want [][]byte
		rest := consumed
		for len(rest) >= 2 {
			n := int(binary.BigEndian.Uint16(rest))
			if n > lim {
				if !tooLong {
					t.Fatalf("a frame of %d bytes over the limit %d was not refused", n, lim)
				}
				break
			}
			if len(rest) < 2+n {
				break
			}
			want = append(want, rest[2:2+n])
			rest = rest[2+n:]
		}
		if len(got) != len(want) {
			t.Fatalf("delivered %d messages, the stream holds %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("message %d = %x, the stream's is %x", i, got[i], want[i])
			}
		}
	})
}

// FuzzHandlePacket: any sequence of IPv4 UDP and TCP packets between the
// learner's pod and the trusted server (queries, replies, SYN-ACKs, any
// flags, sequence numbers and payloads) reaches HandlePacket: it never
// panics, and nothing is learned before the pod sent something.
func FuzzHandlePacket(f *testing.F) {
	q := query(0x1234, "www.example.com.")
	r := reply(&testing.T{}, "www.example.com.", dnsmessage.TypeA, false, rr{name: "www.example.com.", addr: "192.0.2.1", ttl: 60})
	binary.BigEndian.PutUint16(r, 0x1234)
	f.Add(append(append(fuzzPacket(true, 17, 0, 0, 0, q), 0xff), fuzzPacket(false, 17, 0, 0, 0, r)...))
	synack := fuzzPacket(false, 6, 0x12, 100, 500, nil)
	tq := fuzzPacket(true, 6, 0x18, 500, 101, append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...))
	tr := fuzzPacket(false, 6, 0x18, 101, 500, append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...))
	f.Add(append(append(append(append(synack, 0xff), tq...), 0xff), tr...))
	sc, err := scenario.Parse([]byte(webScenario))
	if err != nil {
		f.Fatal(err)
	}
	prog := compile.Build(sc.Input("n1", nil, nil))
	f.Fuzz(func(t *testing.T, script []byte) {
		w := &fakeWriter{}
		l, err := fqdn.New(fqdn.Config{Program: func() *compile.Program { return prog }, Writer: w,
			Trusted: func(a netip.Addr) bool { return a == server }, Logger: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		asked := false
		for _, p := range bytes.Split(script, []byte{0xff}) {
			if len(p) < 21 {
				continue
			}
			// The first byte picks the direction, the rest is the
			// transport header and payload.
			src, dst := podA4, server
			if p[0]&1 == 0 {
				src, dst = server, podA4
			}
			proto := uint8(17)
			if p[0]&2 != 0 {
				proto = 6
			}
			pkt := ipv4(src, dst, proto, p[1:])
			before := len(w.got)
			_ = l.HandlePacket(context.Background(), proto, src, dst, pkt, 20)
			if len(w.got) > before && !asked {
				t.Fatalf("a reply was learned before any query was handled")
			}
			if src == podA4 {
				asked = true
			}
		}
	})
}

// fuzzPacket is one FuzzHandlePacket script entry: direction and
// protocol, then a UDP or TCP header (ports 53 and 40000) and the payload.
func fuzzPacket(fromPod bool, proto uint8, flags byte, seq, ack uint32, payload []byte) []byte {
	sel := byte(0)
	if fromPod {
		sel |= 1
	}
	sport, dport := uint16(53), uint16(40000)
	if fromPod {
		sport, dport = dport, sport
	}
	var h []byte
	if proto == 6 {
		sel |= 2
		h = binary.BigEndian.AppendUint16(nil, sport)
		h = binary.BigEndian.AppendUint16(h, dport)
		h = binary.BigEndian.AppendUint32(h, seq)
		h = binary.BigEndian.AppendUint32(h, ack)
		h = append(h, 5<<4, flags, 0xff, 0xff, 0, 0, 0, 0)
	} else {
		h = binary.BigEndian.AppendUint16(nil, sport)
		h = binary.BigEndian.AppendUint16(h, dport)
		h = binary.BigEndian.AppendUint16(h, uint16(8+len(payload)))
		h = append(h, 0, 0)
	}
	return append(append([]byte{sel}, h...), payload...)
}

// ipv4 is an IPv4 packet from src to dst carrying l4 (the header's length
// field set, nothing else checked).
func ipv4(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	h := make([]byte, 20, 20+len(l4))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
	h[8], h[9] = 64, proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return append(h, l4...)
}

// query is a DNS query for name's A record.
func query(id uint16, name string) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	out, _ := b.Finish()
	return out
}
