package redteam

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// revokePinger sends echo requests with one identifier from a pod, at a
// steady pace, and records when each reply arrives.
type revokePinger struct {
	conn     *icmp.PacketConn
	src, dst netip.Addr
	id       int

	mu      sync.Mutex
	replies []time.Time
	done    chan struct{}
}

// startPinger opens a raw ICMP (ICMPv6) socket in ep's namespace and pings
// dst from src every interval until ctx ends.
func startPinger(ctx context.Context, l *netlab.Lab, ep netlab.Endpoint, src, dst netip.Addr, id int, interval time.Duration) (*revokePinger, error) {
	p := &revokePinger{src: src, dst: dst, id: id, done: make(chan struct{})}
	network := "ip4:icmp"
	if dst.Is6() {
		network = "ip6:ipv6-icmp"
	}
	if err := l.InNetns(ep, func() (err error) {
		p.conn, err = icmp.ListenPacket(network, src.String())
		return err
	}); err != nil {
		return nil, err
	}
	go p.read()
	go func() {
		defer p.conn.Close()
		t := time.NewTicker(interval)
		defer t.Stop()
		for seq := 1; ; seq++ {
			// A denied echo may come back as a send error: the pod
			// keeps pinging all the same.
			_ = p.send(seq)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p, nil
}

func (p *revokePinger) send(seq int) error {
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if p.dst.Is6() {
		typ = ipv6.ICMPTypeEchoRequest
	}
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: p.id, Seq: seq, Data: []byte("revoke")}}).Marshal(nil)
	if err != nil {
		return err
	}
	_, err = p.conn.WriteTo(b, &net.IPAddr{IP: p.dst.AsSlice()})
	return err
}

func (p *revokePinger) read() {
	defer close(p.done)
	proto := unix.IPPROTO_ICMP
	if p.dst.Is6() {
		proto = unix.IPPROTO_ICMPV6
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || (m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply) {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); !ok || e.ID != p.id || from.String() != p.dst.String() {
			continue
		}
		p.mu.Lock()
		p.replies = append(p.replies, time.Now())
		p.mu.Unlock()
	}
}

// after returns how many replies arrived after t, and when the last did.
func (p *revokePinger) after(t time.Time) (n int, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.replies {
		if r.After(t) {
			n++
		}
		last = r
	}
	return n, last
}

// echoEntries counts node-1's conntrack entries of echoes from src to dst
// with the identifier, read with the ctnetlink library (not the revoker's
// own decoder).
func (l *revokeLab) echoEntries(src, dst netip.Addr, id int) int {
	l.t.Helper()
	c, err := ct.Dial(&netlink.Config{NetNS: l.Agent(revokeNode).NetnsFD()})
	if err != nil {
		l.t.Fatal(err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		l.t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		o := f.TupleOrig
		if (o.Proto.Protocol == unix.IPPROTO_ICMP || o.Proto.Protocol == unix.IPPROTO_ICMPV6) && o.Proto.ICMPID == uint16(id) &&
			o.IP.SourceAddress == src && o.IP.DestinationAddress == dst {
			n++
		}
	}
	return n
}

// TestRedTeamRevokeICMP: x/a pings kube-system/dns over IPv4 and IPv6
// under rule "dns", which names no ports and so admits every protocol.
// The administrator narrows the rule to DNS's ports (TCP and UDP 53): a
// rule with ports admits no ICMP. Conntrack answers an established echo
// flow before any rule, so only the revoker can cut the pings that are
// going on: no reply may arrive a second after the change, and the echo
// flows' conntrack entries must be gone while the pod keeps pinging. A
// new ping is denied by the kernel; DNS still works.
func TestRedTeamRevokeICMP(t *testing.T) {
	l := newRevokeLab(t)
	l.withRevoker()
	type target struct{ src, dst netip.Addr }
	targets := []target{
		{netip.MustParseAddr("10.244.1.10"), lab.FQDNServer},
		{netip.MustParseAddr("fd00:10:244:1::10"), lab.FQDNServerV6},
	}
	pingCtx, stop := context.WithCancel(l.ctx)
	defer stop()
	var pingers []*revokePinger
	for i, tg := range targets {
		p, err := startPinger(pingCtx, l.Net(), l.Pod, tg.src, tg.dst, 0x5a00+i, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		pingers = append(pingers, p)
	}
	defer func() {
		stop()
		for _, p := range pingers {
			<-p.done
		}
	}()
	time.Sleep(time.Second)
	for _, p := range pingers {
		if n, _ := p.after(time.Time{}); n == 0 {
			t.Fatalf("x/a's ping to %s is not answered before the change", p.dst)
		}
		if n := l.echoEntries(p.src, p.dst, p.id); n != 1 {
			t.Fatalf("x/a's ping to %s: %d conntrack entries before the change, want 1", p.dst, n)
		}
	}

	changed := time.Now()
	s := lab.CloneScenario(l.s)
	port53 := &npav1beta1.Port{Number: 53}
	s.ClusterNetworkPolicies[0].Spec.Egress[0].Protocols = []npav1beta1.ClusterNetworkPolicyProtocol{
		{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port53}},
		{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: port53}},
	}
	if _, err := l.Apply(l.ctx, s, false); err != nil {
		t.Fatal(err)
	}
	l.s = s
	time.Sleep(2 * time.Second)
	for _, p := range pingers {
		if n, last := p.after(changed.Add(time.Second)); n > 0 {
			t.Errorf("x/a's ping to %s, admitted before rule dns was narrowed to port 53, is still answered: %d replies more than a second after the change, the last %v after it: not revoked",
				p.dst, n, last.Sub(changed).Round(time.Millisecond))
		} else {
			_, last := p.after(changed)
			t.Logf("x/a's ping to %s: the last reply came %v after the change (negative: before)", p.dst, last.Sub(changed).Round(time.Millisecond))
		}
		if n := l.echoEntries(p.src, p.dst, p.id); n != 0 {
			t.Errorf("x/a's ping to %s: %d conntrack entries after the change, want none", p.dst, n)
		}
	}
	// The narrowed rule is in force: a new ping is denied by the kernel,
	// DNS is still admitted.
	fresh, err := startPinger(pingCtx, l.Net(), l.Pod, targets[0].src, targets[0].dst, 0x5aff, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	pingers = append(pingers, fresh)
	time.Sleep(time.Second)
	if n, _ := fresh.after(time.Time{}); n > 0 {
		t.Errorf("a new ping from x/a to %s is answered after rule dns was narrowed to port 53", fresh.dst)
	}
	l.lookup("www.example.com", "192.0.2.10")
}
