package redteam

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// The DNS stream attacks run on the lab's FQDN scenario (x/a on
// node-1 may reach the names of rule "web"; the trusted DNS server is
// kube-system/dns on node-2) with one more pod on node-1, z/evil, that no
// policy selects: the spoofer. 192.0.2.14 is the denied address every
// forged answer names.
var (
	dnsstreamDenied  = netip.MustParseAddr("192.0.2.14")
	dnsstreamVictim  = netip.MustParseAddr("10.244.1.10")
	dnsstreamAttackr = "evil.attacker.test"
)

// dnsstreamForgedID is the transaction ID of the forged replies in TXT
// data, and of the query the attacker sends with them.
const dnsstreamForgedID = 0x4242

// dnsstreamLab is the scenario enforced, the DNS servers running.
type dnsstreamLab struct {
	t   *testing.T
	c   *lab.Lab
	pod netlab.Endpoint // x/a
	srv *dnsserver.Server
}

func newDNSStreamLab(t *testing.T, extra []dnsserver.Record) *dnsstreamLab {
	t.Helper()
	ctx := requireLab(t)
	text := strings.Replace(lab.FQDNScenario, "pods:\n",
		"pods:\n  - {namespace: z, name: evil, labels: {app: evil}, ip: 10.244.1.66, node: node-1}\n", 1)
	s, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	c, err := lab.New(ctx, s, lab.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := &dnsstreamLab{t: t, c: c}
	t.Cleanup(func() {
		if l.srv != nil {
			_ = l.srv.Close()
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if _, err := c.Apply(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	l.pod, _ = c.PodEndpoint("x/a")
	dns, _ := c.PodEndpoint("kube-system/dns")
	if err := c.Net().InNetns(dns, func() error {
		var err error
		l.srv, err = dnsserver.Listen(netip.IPv6Unspecified(), 53, append(append([]dnsserver.Record(nil), lab.FQDNRecords...), extra...))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if d := c.Agent(n).DNS(); d.Sources != nil {
			d.Sources.SetEndpoints([]netip.Addr{lab.FQDNServer})
		}
	}
	return l
}

// reaches reports whether x/a connects to addr:80.
func (l *dnsstreamLab) reaches(addr netip.Addr) bool {
	l.t.Helper()
	ok, err := l.c.Net().Probe(context.Background(), l.pod, addr, 80, netlab.TCP, time.Second)
	if err != nil {
		l.t.Fatal(err)
	}
	return ok
}

// notLearned reads node-1's nftpolicy_dns_replies_not_learned_total of a
// cause.
func (l *dnsstreamLab) notLearned(cause string) float64 {
	l.t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := l.c.Agent("node-1").DNS().Metrics.Register(reg); err != nil {
		l.t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		l.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nftpolicy_dns_replies_not_learned_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == cause {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// dnsstreamForged is a DNS response claiming name has address a.
func dnsstreamForged(t *testing.T, id uint16, name string, a netip.Addr) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, Response: true, Authoritative: true})
	_ = b.StartQuestions()
	q := dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	if err := b.Question(q); err != nil {
		t.Fatal(err)
	}
	_ = b.StartAnswers()
	if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 300}, dnsmessage.AResource{A: a.As4()}); err != nil {
		t.Fatal(err)
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dnsstreamQuery is a DNS query for name of type qt.
func dnsstreamQuery(id uint16, name string, qt dnsmessage.Type) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: qt, Class: dnsmessage.ClassINET})
	out, _ := b.Finish()
	return out
}

// dnsstreamTXTLookup asks the trusted server over TCP for name's TXT
// record from x/a, with the socket's MSS set to mss before it connects
// (the server then sends at most mss bytes a segment), and on the same
// connection, right after it, for www.example.com's A record with the ID
// of the forged replies: the forged frames answer a query the pod really
// has outstanding on that connection, so only reading the stream from its
// boundaries tells them from answers. It returns the TXT answer.
func (l *dnsstreamLab) dnsstreamTXTLookup(name string, mss int) ([]byte, error) {
	var out []byte
	err := l.c.Net().InNetns(l.pod, func() error {
		d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss) }); err != nil {
				return err
			}
			return serr
		}}
		c, err := d.Dial("tcp", netip.AddrPortFrom(lab.FQDNServer, 53).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		var qs []byte
		for _, q := range [][]byte{dnsstreamQuery(uint16(time.Now().UnixNano()), name, dnsmessage.TypeTXT), dnsstreamQuery(dnsstreamForgedID, "www.example.com", dnsmessage.TypeA)} {
			qs = append(append(qs, binary.BigEndian.AppendUint16(nil, uint16(len(q)))...), q...)
		}
		if _, err := c.Write(qs); err != nil {
			return err
		}
		for i := range 2 {
			var n [2]byte
			if _, err := readFull(c, n[:]); err != nil {
				return err
			}
			msg := make([]byte, binary.BigEndian.Uint16(n[:]))
			if _, err = readFull(c, msg); err != nil {
				return err
			}
			if i == 0 {
				out = msg
			}
		}
		return nil
	})
	return out, err
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestRedTeamDNSTCPMidStream: x/a asks the trusted DNS server over TCP for
// the TXT record of a name it controls, whose data holds length-framed
// forged replies "www.example.com A 192.0.2.14", and on the same connection
// for www.example.com with the forged replies' ID (so they answer a query
// x/a has outstanding); with TCP_MAXSEG 100 on its socket the server sends
// the answer in small segments, and the forged frames sit where segments
// start. The learner must read the stream as the
// pod does, from message boundaries, and learn nothing from it: the pod
// must not reach 192.0.2.14.
//
// The answer is long (more than the server's initial congestion window of
// ten segments), so the server sends it in bursts that start at segment
// boundaries, and every burst is a packet of its own on the forward hook
// even when the segments of one burst travel together (GSO). A segment
// is the MSS less the TCP options, so the attack is made for every
// segment size from 52 (the smallest that holds a frame) to 100 bytes: one
// TXT name per size, its data a forged frame at every multiple of it.
func TestRedTeamDNSTCPMidStream(t *testing.T) {
	forged := dnsstreamForged(t, dnsstreamForgedID, "www.example.com", dnsstreamDenied)
	frame := string(binary.BigEndian.AppendUint16(nil, uint16(len(forged)))) + string(forged)
	// The TXT data starts at a fixed offset of the stream: the length
	// prefix (2), the header (12), the question (the name, type, class),
	// the answer's compressed owner (2), type, class, TTL, length (10);
	// then each TXT string is a length byte and its bytes.
	qname := "s000." + dnsstreamAttackr
	rdata := 2 + 12 + len(qname) + 2 + 4 + 2 + 10
	var recs []dnsserver.Record
	var names []string
	for seg := len(frame) + 1; seg <= 100; seg++ {
		// A lead-in string up to the byte before a multiple of seg
		// (the next string's length byte), then strings of seg-1 bytes,
		// each a frame and padding: a frame at every multiple of seg.
		k := (rdata+1)/seg + 1
		txt := []string{strings.Repeat("-", k*seg-1-rdata-1)}
		for len(txt)*seg < 4000 {
			txt = append(txt, frame+strings.Repeat("x", seg-1-len(frame)))
		}
		name := fmt.Sprintf("s%03d.%s", seg, dnsstreamAttackr)
		names = append(names, name)
		recs = append(recs, dnsserver.Record{Name: name, TTL: 300, TXT: txt})
	}
	l := newDNSStreamLab(t, recs)
	if l.reaches(dnsstreamDenied) {
		t.Fatalf("x/a reaches %s before the attack", dnsstreamDenied)
	}
	before := l.notLearned(fqdn.CauseNoAddress)
	for _, name := range names {
		out, err := l.dnsstreamTXTLookup(name, 100)
		if err != nil {
			t.Fatalf("TXT lookup %s: %v", name, err)
		}
		if !strings.Contains(string(out), frame) {
			t.Fatalf("the TXT answer of %s does not carry the forged frame", name)
		}
	}
	t.Logf("%d TXT lookups over TCP with MSS 100, forged frames at every multiple of each segment size %d-100", len(names), len(frame)+1)
	// Each TXT answer was read whole, from its boundary: no address to
	// learn. (The A answers, 192.0.2.10, are learned.)
	if got := l.notLearned(fqdn.CauseNoAddress) - before; got != float64(len(names)) {
		t.Errorf("TXT answers read whole (no_address) = %v, want %d", got, len(names))
	}
	if l.reaches(dnsstreamDenied) {
		t.Errorf("x/a reaches %s: a forged reply inside a TXT record's data was learned\n%s", dnsstreamDenied, l.c.ListTable("node-1"))
	}
}

// dnsstreamSpoof sends, from z/evil's network namespace through a raw
// socket, a UDP datagram from src to dst carrying payload: the source
// address is the attacker's choice.
func (l *dnsstreamLab) dnsstreamSpoof(src, dst netip.AddrPort, payload []byte) error {
	evil, _ := l.c.PodEndpoint("z/evil")
	return l.c.Net().InNetns(evil, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		pkt := make([]byte, 28, 28+len(payload))
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(28+len(payload)))
		pkt[8] = 64
		pkt[9] = unix.IPPROTO_UDP
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		copy(pkt[12:16], s4[:])
		copy(pkt[16:20], d4[:])
		binary.BigEndian.PutUint16(pkt[20:], src.Port())
		binary.BigEndian.PutUint16(pkt[22:], dst.Port())
		binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload)))
		// UDP checksum 0: none (IPv4).
		pkt = append(pkt, payload...)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: d4})
	})
}

// TestRedTeamDNSSpoofedReply: x/a has a UDP socket talking to the trusted
// DNS server (it looked a.b.example.org up and waits on the same port).
// z/evil, a pod of the same node with a raw socket, sends x/a's port a
// reply with the server's address, port 53, the transaction ID of x/a's
// query even, for www.example.com -> 192.0.2.14, a name x/a never asked.
// It must not be learned: x/a must not reach 192.0.2.14. (This branch has
// no kernel source-address validation: the spoofed datagram is delivered,
// and the learner alone must refuse it.)
func TestRedTeamDNSSpoofedReply(t *testing.T) {
	l := newDNSStreamLab(t, nil)
	if l.reaches(dnsstreamDenied) {
		t.Fatalf("x/a reaches %s before the attack", dnsstreamDenied)
	}
	const id = 0x5151
	var conn *net.UDPConn
	if err := l.c.Net().InNetns(l.pod, func() error {
		var err error
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.FQDNServer, 53)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(dnsstreamQuery(id, "a.b.example.org", dnsmessage.TypeA)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Read(buf); err != nil {
		t.Fatalf("x/a's own lookup: %v", err)
	}
	port := netip.MustParseAddrPort(conn.LocalAddr().String()).Port()
	before := l.notLearned(fqdn.CauseUnsolicited)
	forged := dnsstreamForged(t, id, "www.example.com", dnsstreamDenied)
	for i := 0; i < 3; i++ {
		if err := l.dnsstreamSpoof(netip.AddrPortFrom(lab.FQDNServer, 53), netip.AddrPortFrom(dnsstreamVictim, port), forged); err != nil {
			t.Fatalf("spoof: %v", err)
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	delivered := 0
	for {
		n, err := conn.Read(buf)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
			break
		}
		if string(buf[:n]) == string(forged) {
			delivered++
		}
	}
	t.Logf("spoofed replies delivered to x/a's socket: %d of 3; counted unsolicited: %v", delivered, l.notLearned(fqdn.CauseUnsolicited)-before)
	if l.reaches(dnsstreamDenied) {
		t.Errorf("x/a reaches %s: a spoofed reply for a name it never asked was learned\n%s", dnsstreamDenied, l.c.ListTable("node-1"))
	}
	if delivered > 0 && l.notLearned(fqdn.CauseUnsolicited) < before+float64(delivered) {
		t.Errorf("%d spoofed replies delivered, %v counted unsolicited", delivered, l.notLearned(fqdn.CauseUnsolicited)-before)
	}
}

// TestRedTeamDNSLegitLookups: what the defences must not break. x/a's
// lookups over UDP and TCP, a TCP answer split over several small
// segments, and two queries on one TCP connection are learned: x/a
// reaches each answer right after its lookup.
func TestRedTeamDNSLegitLookups(t *testing.T) {
	split := dnsserver.Record{Name: "split.example.org", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, TTL: 300, TCPChunk: 7}
	l := newDNSStreamLab(t, []dnsserver.Record{split})
	lookup := func(name string, tcp bool) {
		t.Helper()
		var got []netip.Addr
		err := l.c.Net().InNetns(l.pod, func() error {
			var err error
			got, err = dnsserver.Lookup(netip.AddrPortFrom(lab.FQDNServer, 53), name, false, tcp, 2*time.Second)
			return err
		})
		if err != nil || len(got) != 1 {
			t.Fatalf("lookup %s (tcp %v) = %v, %v", name, tcp, got, err)
		}
	}
	for _, c := range []struct {
		name string
		tcp  bool
		addr string
	}{
		{"www.example.com", false, "192.0.2.10"},
		{"tcp.example.org", true, "192.0.2.15"},
		{"split.example.org", true, "192.0.2.11"},
	} {
		a := netip.MustParseAddr(c.addr)
		if l.reaches(a) {
			t.Fatalf("x/a reaches %s before looking %s up", a, c.name)
		}
		lookup(c.name, c.tcp)
		if !l.reaches(a) {
			t.Errorf("x/a cannot reach %s after looking %s up (tcp %v)\n%s", a, c.name, c.tcp, l.c.ListTable("node-1"))
		}
	}
	// Two queries pipelined on one TCP connection, answers in small
	// segments: both are learned.
	l.srv.Set(append(append([]dnsserver.Record(nil), lab.FQDNRecords...),
		dnsserver.Record{Name: "one.example.org", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.12")}, TTL: 300, TCPChunk: 5},
		dnsserver.Record{Name: "two.example.org", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.13")}, TTL: 300}))
	err := l.c.Net().InNetns(l.pod, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(lab.FQDNServer, 53).String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		var out []byte
		for i, n := range []string{"one.example.org", "two.example.org"} {
			q := dnsstreamQuery(uint16(100+i), n, dnsmessage.TypeA)
			out = append(append(out, binary.BigEndian.AppendUint16(nil, uint16(len(q)))...), q...)
		}
		if _, err := c.Write(out); err != nil {
			return err
		}
		for range 2 {
			var n [2]byte
			if _, err := readFull(c, n[:]); err != nil {
				return err
			}
			if _, err := readFull(c, make([]byte, binary.BigEndian.Uint16(n[:]))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("two queries on one TCP connection: %v", err)
	}
	for _, a := range []string{"192.0.2.12", "192.0.2.13"} {
		if !l.reaches(netip.MustParseAddr(a)) {
			t.Errorf("x/a cannot reach %s after its lookup on a shared TCP connection", a)
		}
	}
}
