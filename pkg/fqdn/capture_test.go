package fqdn_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
)

// handle hands one fuzzPacket-style entry to the learner.
func handle(l *fqdn.Learner, p []byte) fqdn.Result {
	src, dst := podA4, server
	if p[0]&1 == 0 {
		src, dst = server, podA4
	}
	proto := uint8(17)
	if p[0]&2 != 0 {
		proto = 6
	}
	return l.HandlePacket(context.Background(), proto, src, dst, ipv4(src, dst, proto, p[1:]), 20)
}

func replyWithID(t *testing.T, id uint16, name, addr string) []byte {
	t.Helper()
	r := reply(t, name, dnsmessage.TypeA, false, rr{name: name, addr: addr, ttl: 60})
	binary.BigEndian.PutUint16(r, id)
	return r
}

func framed(m []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(m))), m...) }

func TestUDPRepliesMatchQueries(t *testing.T) {
	w := &fakeWriter{}
	l, _, now := newLearner(t, w, false)
	r := replyWithID(t, 7, "www.example.com.", "192.0.2.1")

	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, r)); !res.Release || res.Cause != fqdn.CauseUnsolicited || len(w.got) != 0 {
		t.Fatalf("reply without a query: %+v, %d writes", res, len(w.got))
	}
	if res := handle(l, fuzzPacket(true, 17, 0, 0, 0, query(7, "www.example.com."))); !res.Release {
		t.Fatalf("query: %+v", res)
	}
	// Same ID, another question: not learned, the query stays.
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, replyWithID(t, 7, "a.example.org.", "192.0.2.2"))); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("reply to another question: %+v", res)
	}
	// Another ID: not learned.
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, replyWithID(t, 8, "www.example.com.", "192.0.2.1"))); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("reply with another ID: %+v", res)
	}
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, r)); res.Learned != 1 {
		t.Fatalf("reply to the query: %+v", res)
	}
	// The query is answered: the same reply again is not learned.
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, r)); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("second reply to one query: %+v", res)
	}
	// Expired.
	handle(l, fuzzPacket(true, 17, 0, 0, 0, query(9, "www.example.com.")))
	*now = now.Add(fqdn.DefaultQueryTimeout)
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, replyWithID(t, 9, "www.example.com.", "192.0.2.1"))); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("reply after the query expired: %+v", res)
	}
	// A pod's oldest queries go past the bound.
	for i := range fqdn.MaxQueriesPerPod + 1 {
		handle(l, fuzzPacket(true, 17, 0, 0, 0, query(uint16(1000+i), "www.example.com.")))
	}
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, replyWithID(t, 1000, "www.example.com.", "192.0.2.1"))); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("reply to an evicted query: %+v", res)
	}
	if res := handle(l, fuzzPacket(false, 17, 0, 0, 0, replyWithID(t, 1001, "www.example.com.", "192.0.2.1"))); res.Learned != 1 {
		t.Fatalf("reply to a kept query: %+v", res)
	}
}

// tcpLookup opens a connection (server ISN 100, pod ISN 500) and sends the
// query; the reply stream's data starts at sequence number 101.
func tcpLookup(t *testing.T, l *fqdn.Learner, id uint16, name string) {
	t.Helper()
	if res := handle(l, fuzzPacket(false, 6, 0x12, 100, 501, nil)); !res.Release {
		t.Fatalf("SYN-ACK: %+v", res)
	}
	if res := handle(l, fuzzPacket(true, 6, 0x18, 501, 101, framed(query(id, name)))); !res.Release {
		t.Fatalf("query: %+v", res)
	}
}

func TestTCPStreamIsReassembled(t *testing.T) {
	w := &fakeWriter{}
	l, _, _ := newLearner(t, w, false)
	tcpLookup(t, l, 5, "www.example.com.")
	// The reply carries, inside its TXT-like padding, nothing; a forged
	// frame starts a segment of its own mid-stream.
	forged := framed(replyWithID(t, 5, "www.example.com.", "203.0.113.7"))
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101+3, 501, forged)); res.Release || res.Cause != fqdn.CauseOutOfOrder {
		t.Fatalf("a segment beyond the next byte: %+v", res)
	}
	msg := framed(replyWithID(t, 5, "www.example.com.", "192.0.2.1"))
	a, b, c := msg[:1], msg[1:20], msg[20:]
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101, 501, a)); !res.Release || len(w.got) != 0 {
		t.Fatalf("first byte: %+v", res)
	}
	if res := handle(l, fuzzPacket(false, 6, 0x18, 102, 501, b)); !res.Release || len(w.got) != 0 {
		t.Fatalf("second piece: %+v", res)
	}
	// A retransmission of read bytes is released.
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101, 501, msg[:20])); !res.Release || len(w.got) != 0 {
		t.Fatalf("retransmission: %+v", res)
	}
	// The completing segment is written before it is released; a write
	// error drops it and leaves the stream as it was.
	w.err = errors.New("netlink says no")
	if res := handle(l, fuzzPacket(false, 6, 0x18, 121, 501, c)); res.Release {
		t.Fatalf("completing segment with a failing write: %+v", res)
	}
	w.err = nil
	if res := handle(l, fuzzPacket(false, 6, 0x18, 121, 501, c)); !res.Release || res.Learned != 1 {
		t.Fatalf("its retransmission: %+v", res)
	}
	if got := w.got[0][0].Addr.String(); got != "192.0.2.1" {
		t.Fatalf("learned %s", got)
	}
	// Answered: a second reply with the same question is unsolicited.
	end := uint32(121 + len(c))
	if res := handle(l, fuzzPacket(false, 6, 0x18, end, 501, msg)); res.Cause != fqdn.CauseUnsolicited {
		t.Fatalf("a second reply to one query: %+v", res)
	}
}

func TestTCPUntrackedStreams(t *testing.T) {
	w := &fakeWriter{}
	l, _, _ := newLearner(t, w, false)
	msg := framed(replyWithID(t, 5, "www.example.com.", "192.0.2.1"))
	// No SYN-ACK seen (the connection predates the agent).
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101, 501, msg)); !res.Release || res.Cause != fqdn.CauseUntracked {
		t.Fatalf("segment of an unknown connection: %+v", res)
	}
	// A second SYN-ACK with another sequence number: no longer followed.
	tcpLookup(t, l, 5, "www.example.com.")
	handle(l, fuzzPacket(false, 6, 0x12, 9999, 501, nil))
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101, 501, msg)); !res.Release || res.Cause != fqdn.CauseUntracked {
		t.Fatalf("segment after a conflicting SYN-ACK: %+v", res)
	}
	// RST ends the state; a new connection on the same ports starts
	// afresh.
	handle(l, fuzzPacket(false, 6, 0x14, 101, 501, nil))
	tcpLookup(t, l, 5, "www.example.com.")
	if res := handle(l, fuzzPacket(false, 6, 0x18, 101, 501, msg)); res.Learned != 1 {
		t.Fatalf("reply on a new connection: %+v", res)
	}
	if len(w.got) != 1 {
		t.Fatalf("%d writes", len(w.got))
	}
}

// onPort moves a fuzzPacket entry to the pod's port.
func onPort(p []byte, port uint16) []byte {
	p = append([]byte(nil), p...)
	off := 3 // the server's packet: the destination port
	if p[0]&1 != 0 {
		off = 1
	}
	binary.BigEndian.PutUint16(p[off:], port)
	return p
}

func TestTCPStreamBounds(t *testing.T) {
	w := &fakeWriter{}
	l, _, _ := newLearner(t, w, false)
	q := framed(query(5, "www.example.com."))
	msg := framed(replyWithID(t, 5, "www.example.com.", "192.0.2.1"))
	// One connection more than a pod may have followed: its oldest is no
	// longer followed, the others are.
	for i := range fqdn.MaxStreamsPerPod + 1 {
		port := uint16(40000 + i)
		handle(l, onPort(fuzzPacket(false, 6, 0x12, 100, 501, nil), port))
		handle(l, onPort(fuzzPacket(true, 6, 0x18, 501, 101, q), port))
	}
	if res := handle(l, onPort(fuzzPacket(false, 6, 0x18, 101, 501, msg), 40000)); res.Cause != fqdn.CauseUntracked {
		t.Fatalf("reply on the evicted connection: %+v", res)
	}
	if res := handle(l, onPort(fuzzPacket(false, 6, 0x18, 101, 501, msg), 40001)); res.Learned != 1 {
		t.Fatalf("reply on a followed connection: %+v", res)
	}
	// A query longer than a query may be: the connection is not followed.
	handle(l, onPort(fuzzPacket(false, 6, 0x12, 100, 501, nil), 41000))
	big := binary.BigEndian.AppendUint16(nil, fqdn.MaxQueryMessage+1)
	handle(l, onPort(fuzzPacket(true, 6, 0x18, 501, 101, big), 41000))
	if res := handle(l, onPort(fuzzPacket(false, 6, 0x18, 101, 501, msg), 41000)); res.Cause != fqdn.CauseUntracked {
		t.Fatalf("reply after an over-long query: %+v", res)
	}
}
