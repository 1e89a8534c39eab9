package redteam

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// revokeLab is the lab's FQDN lab (x/a on node-1 may reach the names
// of rule "web" on TCP 80 and 8080, kube-system, and nothing else) with
// its scenario, which the attacks edit.
type revokeLab struct {
	*lab.FQDNLab
	t   *testing.T
	ctx context.Context
	s   *scenario.Scenario
}

func newRevokeLab(t *testing.T) *revokeLab {
	t.Helper()
	ctx, fl := openFQDNLab(t)
	s, err := scenario.Parse([]byte(lab.FQDNScenario))
	if err != nil {
		t.Fatal(err)
	}
	return &revokeLab{FQDNLab: fl, t: t, ctx: ctx, s: s}
}

// revokeNode is the node of x/a, the attacker.
const revokeNode = "node-1"

// withRevoker runs a conntrack revoker on node-1 after each publication,
// wired as the agent wires it (the evaluator's decision, with what pods
// resolved).
func (l *revokeLab) withRevoker() *conntrack.Revoker {
	l.t.Helper()
	a := l.Agent(revokeNode)
	table, err := conntrack.Dial(a.NetnsFD())
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { table.Close() })
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: a.Evaluator().DecideSides, DecideBefore: a.Evaluator().DecideSidesBefore, Table: table, Logger: inproc.Quiet})
	if err != nil {
		l.t.Fatal(err)
	}
	a.OnProgram = func(old, cur *compile.Program) {
		if old != nil {
			if _, err := r.Revoke([]*compile.Program{old}, cur); err != nil {
				l.t.Errorf("revocation pass: %v", err)
			}
		}
	}
	return r
}

// edit publishes the scenario changed by f; rule "web" is f's argument.
func (l *revokeLab) edit(f func(web *npav1beta1.ClusterNetworkPolicyEgressRule)) {
	l.t.Helper()
	s := lab.CloneScenario(l.s)
	f(&s.ClusterNetworkPolicies[0].Spec.Egress[1])
	if _, err := l.Apply(l.ctx, s, false); err != nil {
		l.t.Fatal(err)
	}
	l.s = s
}

// narrow publishes the scenario with name dropped from rule "web".
func (l *revokeLab) narrow(name string) {
	l.t.Helper()
	l.edit(func(web *npav1beta1.ClusterNetworkPolicyEgressRule) {
		web.To[0].DomainNames = slices.DeleteFunc(slices.Clone(web.To[0].DomainNames), func(n npav1beta1.DomainName) bool { return string(n) == name })
	})
}

func (l *revokeLab) lookup(name, want string) {
	l.t.Helper()
	got, err := l.Lookup(lab.FQDNServer, name, false, false)
	if err != nil || len(got) != 1 || got[0].String() != want {
		l.t.Fatalf("lookup %s = %v, %v; want %s", name, got, err, want)
	}
}

func (l *revokeLab) connects(addr string) bool {
	l.t.Helper()
	ok, err := l.Net().Probe(l.ctx, l.Pod, netip.MustParseAddr(addr), 80, netlab.TCP, time.Second)
	if err != nil {
		l.t.Fatal(err)
	}
	return ok
}

// external is the lab's external host with the address.
func (l *revokeLab) external(addr netip.Addr) netlab.Endpoint {
	l.t.Helper()
	ep, ok := l.ExternalEndpoint(addr)
	if !ok {
		l.t.Fatalf("no external host has %s", addr)
	}
	return ep
}

// TestRedTeamRevokeDomainName: x/a resolves www.example.com and
// a.b.example.org, keeps a TCP connection open to each answer, and the
// administrator removes www.example.com from the rule. Conntrack accepts
// established connections before any rule, so only the revoker can cut
// the first one; the second, still allowed by a remaining name, must go
// on, until the rule itself is deleted.
func TestRedTeamRevokeDomainName(t *testing.T) {
	l := newRevokeLab(t)
	l.withRevoker()
	l.lookup("www.example.com", "192.0.2.10")
	l.lookup("a.b.example.org", "192.0.2.11")
	removed, kept := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	servers := map[netip.Addr]*lab.FlowServer{}
	flowCtx, stop := context.WithCancel(l.ctx)
	defer stop()
	for _, a := range []netip.Addr{removed, kept} {
		s, err := lab.StartFlowServer(l.Net(), l.external(a), a)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		servers[a] = s
		// TCP 8080 is one of the rule's ports (the UDP flow is denied).
		if err := lab.StartFlows(flowCtx, l.Net(), l.Pod, a); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	podIP := netip.MustParseAddr("10.244.1.10")
	for a, s := range servers {
		if _, n, _ := s.Log("tcp", podIP).Snapshot(); n == 0 {
			t.Fatalf("the connection to %s carries nothing before the change", a)
		}
	}
	_, keptBefore, _ := servers[kept].Log("tcp", podIP).Snapshot()

	changed := time.Now()
	l.narrow("www.example.com")
	time.Sleep(1500 * time.Millisecond)
	last, n, _ := servers[removed].Log("tcp", podIP).Snapshot()
	if last.After(changed.Add(time.Second)) {
		t.Errorf("the connection to %s (www.example.com, removed from the rule) still flows %v after the change (%d records): not revoked",
			removed, last.Sub(changed).Round(time.Millisecond), n)
	} else {
		t.Logf("the connection to the removed name stopped %v after the change", max(last.Sub(changed), 0).Round(time.Millisecond))
	}
	last, n, _ = servers[kept].Log("tcp", podIP).Snapshot()
	if last.Before(changed.Add(time.Second)) || n <= keptBefore {
		t.Errorf("the connection to %s (a.b.example.org, still in the rule) stopped: last record %v after the change",
			kept, last.Sub(changed).Round(time.Millisecond))
	}

	// The rule goes: x/a has no domainNames rule left, and the learner
	// forgets what it resolved; the connection the rule admitted goes too.
	changed = time.Now()
	s := lab.CloneScenario(l.s)
	egress := &s.ClusterNetworkPolicies[0].Spec.Egress
	*egress = slices.Delete(slices.Clone(*egress), 1, 2)
	if _, err := l.Apply(l.ctx, s, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if last, n, _ := servers[kept].Log("tcp", podIP).Snapshot(); last.After(changed.Add(time.Second)) {
		t.Errorf("the connection to %s still flows %v after its rule was deleted (%d records): not revoked",
			kept, last.Sub(changed).Round(time.Millisecond), n)
	}
}

// TestRedTeamRevokeReversePickup: x/a keeps a TCP connection open to
// a.b.example.org's address, whose server the attacker also runs, and the
// administrator deletes the rule that admitted it. The revoker deletes the
// conntrack entry; the server then writes first. Conntrack takes a packet
// without SYN for a new connection whose client is its sender (loose
// pickup), so the server's write would open it anew as ingress to x/a,
// which no policy isolates, and x/a's own writes would pass as replies:
// the egress denial undone. Nothing may reach the server after the change.
func TestRedTeamRevokeReversePickup(t *testing.T) {
	l := newRevokeLab(t)
	l.withRevoker()
	l.lookup("a.b.example.org", "192.0.2.11")
	srvAddr := netip.MustParseAddr("192.0.2.11")
	var ln net.Listener
	if err := l.Net().InNetns(l.external(srvAddr), func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(srvAddr, 8080).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var client net.Conn
	if err := l.Net().InNetns(l.Pod, func() (err error) {
		client, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", netip.AddrPortFrom(srvAddr, 8080).String())
		return err
	}); err != nil {
		t.Fatalf("x/a cannot connect to a.b.example.org while the rule admits it: %v", err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	buf := make([]byte, 16)
	exchange := func(from, to net.Conn, msg string) bool {
		if _, err := from.Write([]byte(msg)); err != nil {
			return false
		}
		_ = to.SetReadDeadline(time.Now().Add(time.Second))
		n, err := to.Read(buf)
		return err == nil && string(buf[:n]) == msg
	}
	if !exchange(client, server, "before") {
		t.Fatal("the connection carries nothing before the change")
	}

	s := lab.CloneScenario(l.s)
	egress := &s.ClusterNetworkPolicies[0].Spec.Egress
	*egress = slices.Delete(slices.Clone(*egress), 1, 2)
	if _, err := l.Apply(l.ctx, s, false); err != nil {
		t.Fatal(err)
	}
	// The attacker's server writes first, then x/a: each write is
	// retransmitted while the connection lives, so a second is enough for
	// any to arrive.
	_, _ = server.Write([]byte("wake"))
	time.Sleep(200 * time.Millisecond)
	if exchange(client, server, "after") {
		t.Errorf("x/a's connection to %s carried data after the rule that admitted it was deleted: reopened in reverse by the server's packet\n%s",
			srvAddr, l.ListTable(revokeNode))
	}
}

// TestRedTeamRevokeNarrowedNames: x/a resolves www.example.com, then the
// rule stops naming it. A new connection to the learned address must be
// denied at once, not when the answer's TTL (300 s here, up to the
// learner's clamp in general) expires: the learned set must not outlive the
// names it was learned for.
func TestRedTeamRevokeNarrowedNames(t *testing.T) {
	l := newRevokeLab(t)
	l.lookup("www.example.com", "192.0.2.10")
	if !l.connects("192.0.2.10") {
		t.Fatalf("x/a cannot reach www.example.com's address after resolving it\n%s", l.ListTable(revokeNode))
	}
	before := l.Agent(revokeNode).Program.FQDNRules()
	l.narrow("www.example.com")
	if l.connects("192.0.2.10") {
		t.Errorf("x/a still connects to 192.0.2.10 after www.example.com left the rule (the answer's TTL is 300 s)\n%s", l.ListTable(revokeNode))
	}
	after := l.Agent(revokeNode).Program.FQDNRules()
	listing := l.ListTable(revokeNode)
	for i := range before {
		for _, v4 := range []bool{true, false} {
			if old := before[i].Set(v4); old == after[i].Set(v4) || strings.Contains(listing, "set "+old+" {") {
				t.Errorf("the learned set %s of the rule's old names is still in use or in the kernel", old)
			}
		}
	}
	// The evaluator (queue mode, unknown pods) agrees with the lab.
	if v := l.Agent(revokeNode).Evaluator().Evaluate(netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr("192.0.2.10"), compile.ProtoTCP, 80); v.Allowed {
		t.Errorf("the evaluator admits x/a -> 192.0.2.10:80 after narrowing: %+v", v)
	}
}

// revokeInflation is how many UDP flows the attacker opens: a quarter of a
// million would fit the table, but a red-team run stays short.
const revokeInflation = 50000

// TestRedTeamConntrackInflation: x/a opens tens of thousands of UDP flows
// (to kube-system, which it may reach) to inflate node-1's conntrack
// table, then a policy change makes the revoker examine every one of
// them. The pass's allocations must not grow with the table: the old
// revoker materialized the dump (about 2 KB per entry).
func TestRedTeamConntrackInflation(t *testing.T) {
	l := newRevokeLab(t)
	a := l.Agent(revokeNode)
	table, err := conntrack.Dial(a.NetnsFD())
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: a.Evaluator().DecideSides, DecideBefore: a.Evaluator().DecideSidesBefore, Table: table, Logger: inproc.Quiet})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := revokeFloodUDP(l.Net(), l.Pod, lab.FQDNServer, revokeInflation); err != nil {
		t.Fatal(err)
	}
	t.Logf("x/a sent %d UDP flows in %v", revokeInflation, time.Since(start).Round(time.Millisecond))

	old := a.Program
	// x/a's policy changes (rule "web" gains a port): every entry of x/a
	// is examined.
	l.edit(func(web *npav1beta1.ClusterNetworkPolicyEgressRule) {
		web.Protocols = append(slices.Clone(web.Protocols), web.Protocols[0])
		web.Protocols[len(web.Protocols)-1].TCP = &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1beta1.Port{Number: 443}}
	})
	cur := a.Program
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	res, err := r.Revoke([]*compile.Program{old}, cur)
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatal(err)
	}
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("one pass: %+v, %d bytes allocated (%.0f per entry), heap in use %d -> %d MiB", res, alloc,
		float64(alloc)/float64(max(res.Dumped, 1)), m0.HeapInuse>>20, m1.HeapInuse>>20)
	if res.Dumped < revokeInflation*9/10 {
		t.Fatalf("the pass read %d entries: the flood did not inflate the table (%d flows sent)", res.Dumped, revokeInflation)
	}
	if res.Deleted != 0 {
		t.Errorf("the pass deleted %d entries; x/a may still reach kube-system", res.Deleted)
	}
	const bound = 8 << 20
	if alloc > bound {
		t.Errorf("one revocation pass over %d entries allocated %d MiB, want at most %d MiB whatever the table's size", res.Dumped, alloc>>20, bound>>20)
	}
}

// revokeFloodUDP sends one datagram from pod to each of n ports of dst,
// each a new conntrack entry on the pod's node.
func revokeFloodUDP(lab *netlab.Lab, pod netlab.Endpoint, dst netip.Addr, n int) error {
	return lab.InNetns(pod, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		b := []byte("x")
		for i, port := 0, 1024; i < n; port++ {
			if port == 53 {
				continue
			}
			if _, err := c.WriteToUDPAddrPort(b, netip.AddrPortFrom(dst, uint16(port))); err != nil {
				return err
			}
			i++
		}
		return nil
	})
}
