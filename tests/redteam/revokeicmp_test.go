package redteam

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// echoEntries counts node-1's conntrack entries of echoes from src to dst
// with the identifier, read with the ctnetlink library (not the revoker's
// own decoder).
func (l *revokeLab) echoEntries(src, dst netip.Addr, id uint16) int {
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
		if (o.Proto.Protocol == unix.IPPROTO_ICMP || o.Proto.Protocol == unix.IPPROTO_ICMPV6) && o.Proto.ICMPID == id &&
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
	var pingers []*lab.Pinger
	for i, tg := range targets {
		p, err := lab.StartPinger(pingCtx, l.Net(), l.Pod, tg.src, tg.dst, uint16(0x5a00+i), 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		pingers = append(pingers, p)
	}
	defer func() {
		stop()
		for _, p := range pingers {
			p.Wait()
		}
	}()
	time.Sleep(time.Second)
	for _, p := range pingers {
		if n, _ := p.After(time.Time{}); n == 0 {
			t.Fatalf("x/a's ping to %s is not answered before the change", p.Dst)
		}
		if n := l.echoEntries(p.Src, p.Dst, p.ID); n != 1 {
			t.Fatalf("x/a's ping to %s: %d conntrack entries before the change, want 1", p.Dst, n)
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
		if n, last := p.After(changed.Add(time.Second)); n > 0 {
			t.Errorf("x/a's ping to %s, admitted before rule dns was narrowed to port 53, is still answered: %d replies more than a second after the change, the last %v after it: not revoked",
				p.Dst, n, last.Sub(changed).Round(time.Millisecond))
		} else {
			_, last := p.After(changed)
			t.Logf("x/a's ping to %s: the last reply came %v after the change (negative: before)", p.Dst, last.Sub(changed).Round(time.Millisecond))
		}
		if n := l.echoEntries(p.Src, p.Dst, p.ID); n != 0 {
			t.Errorf("x/a's ping to %s: %d conntrack entries after the change, want none", p.Dst, n)
		}
	}
	// The narrowed rule is in force: a new ping is denied by the kernel,
	// DNS is still admitted.
	fresh, err := lab.StartPinger(pingCtx, l.Net(), l.Pod, targets[0].src, targets[0].dst, 0x5aff, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	pingers = append(pingers, fresh)
	time.Sleep(time.Second)
	if n, _ := fresh.After(time.Time{}); n > 0 {
		t.Errorf("a new ping from x/a to %s is answered after rule dns was narrowed to port 53", fresh.Dst)
	}
	l.lookup("www.example.com", "192.0.2.10")
}
