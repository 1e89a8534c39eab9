package redteam

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// dnsstoreLab is the lab's FQDN lab (x/a on node-1 may reach the
// names of rule "web": www.example.com, *.example.org, api.example.com, on
// TCP 80; everything else is denied) with a second subject pod, x/c, and
// external hosts at the attack's addresses.
type dnsstoreLab struct {
	*lab.FQDNLab
	t   *testing.T
	ctx context.Context
}

// dnsstoreTargets are the external hosts the attacks try to reach.
var dnsstoreTargets = []string{"203.0.113.77", "203.0.113.78", "203.0.113.79"}

// dnsstoreScenario is the FQDN scenario with x/c and the targets' probes;
// with rename, x/a is gone and a pod of that name has its addresses
// (address reuse).
func dnsstoreScenario(t *testing.T, rename string) *scenario.Scenario {
	t.Helper()
	const podA = `{namespace: x, name: a, labels: {app: a}, ips: [10.244.1.10, "fd00:10:244:1::10"], node: node-1}`
	y := lab.FQDNScenario
	if !strings.Contains(y, podA) {
		t.Fatalf("FQDNScenario no longer has the pod %s", podA)
	}
	if rename != "" {
		y = strings.Replace(y, podA, strings.Replace(podA, "name: a,", "name: "+rename+",", 1), 1)
		y = strings.ReplaceAll(y, "{pod: x/a}", "{pod: x/"+rename+"}")
	}
	y = strings.Replace(y, "pods:\n", "pods:\n  - {namespace: x, name: c, labels: {app: c}, ip: 10.244.1.11, node: node-1}\n", 1)
	for _, a := range dnsstoreTargets {
		y += fmt.Sprintf("  - {from: {pod: x/c}, to: {ip: %s}, port: 80}\n", a)
	}
	s, err := scenario.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newDNSStoreLab(t *testing.T, records ...dnsserver.Record) *dnsstoreLab {
	t.Helper()
	ctx, fl := openFQDNLab(t)
	if _, err := fl.Apply(ctx, dnsstoreScenario(t, ""), false); err != nil {
		t.Fatal(err)
	}
	fl.SetClusterDNS(append(slices.Clone(lab.FQDNRecords), records...))
	return &dnsstoreLab{FQDNLab: fl, t: t, ctx: ctx}
}

// lookup resolves name from the pod key through the cluster DNS.
func (l *dnsstoreLab) lookup(key, name string, v6 bool) []netip.Addr {
	l.t.Helper()
	ep := l.endpoint(key)
	var out []netip.Addr
	if err := l.Net().InNetns(ep, func() error {
		var err error
		out, err = dnsserver.Lookup(netip.AddrPortFrom(lab.FQDNServer, 53), name, v6, false, 2*time.Second)
		return err
	}); err != nil {
		l.t.Fatalf("%s: lookup %s: %v", key, name, err)
	}
	return out
}

func (l *dnsstoreLab) endpoint(key string) netlab.Endpoint {
	l.t.Helper()
	ep, ok := l.PodEndpoint(key)
	if !ok {
		l.t.Fatalf("no pod %s in the lab", key)
	}
	return ep
}

// connects reports whether the pod's TCP connection to addr:80 succeeds.
func (l *dnsstoreLab) connects(key, addr string) bool {
	l.t.Helper()
	ok, err := l.Net().Probe(l.ctx, l.endpoint(key), netip.MustParseAddr(addr), 80, netlab.TCP, time.Second)
	if err != nil {
		l.t.Fatal(err)
	}
	return ok
}

// metric reads one counter of node-1's learner metrics.
func (l *dnsstoreLab) metric(name, label string) float64 {
	l.t.Helper()
	v, err := lab.FQDNCounter(l.Agent("node-1").DNS().Metrics, name, label)
	if err != nil {
		l.t.Fatal(err)
	}
	return v
}

// webDomains are rule "web"'s names.
var webDomains = []compile.DomainPattern{{Suffix: "www.example.com"}, {Suffix: "example.org", Wildcard: true}, {Suffix: "api.example.com"}}

// TestRedTeamDNSCNAMEChain: the pod asks the trusted resolver for a name of
// a zone it controls, whose answer holds "x.attacker.test A 203.0.113.77"
// and "x.attacker.test CNAME www.example.com". 203.0.113.77 is not what
// www.example.com resolves to: the connection must fail. Alias chains
// that do lead to the address (in either record order) still work.
func TestRedTeamDNSCNAMEChain(t *testing.T) {
	l := newDNSStoreLab(t,
		dnsserver.Record{Name: "x.attacker.test", Raw: []dnsserver.RawRecord{
			{Name: "x.attacker.test", Addr: netip.MustParseAddr("203.0.113.77"), TTL: 300},
			{Name: "x.attacker.test", CNAME: "www.example.com", TTL: 300},
		}},
		dnsserver.Record{Name: "alias.example.org", Raw: []dnsserver.RawRecord{
			{Name: "edge.cdn2.test", Addr: netip.MustParseAddr("203.0.113.79"), TTL: 300},
			{Name: "alias.example.org", CNAME: "edge.cdn2.test", TTL: 300},
		}})
	if got := l.lookup("x/a", "x.attacker.test", false); !slices.Contains(got, netip.MustParseAddr("203.0.113.77")) {
		t.Fatalf("the attacker's lookup got %v", got)
	}
	if l.connects("x/a", "203.0.113.77") {
		t.Errorf("x/a reached 203.0.113.77, which only x.attacker.test resolves to, after a CNAME x.attacker.test -> www.example.com\n%s", l.ListTable("node-1"))
	}
	if l.Agent("node-1").DNS().Learner.Resolved(netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr("203.0.113.77"), webDomains) {
		t.Errorf("the evaluator takes 203.0.113.77 for a name of rule web")
	}
	// Legitimate chains.
	l.lookup("x/a", "api.example.com", false)
	if !l.connects("x/a", "192.0.2.13") {
		t.Errorf("api.example.com -> lb.cdn.test -> 192.0.2.13: denied")
	}
	l.lookup("x/a", "alias.example.org", false)
	if !l.connects("x/a", "203.0.113.79") {
		t.Errorf("alias.example.org -> edge.cdn2.test -> 203.0.113.79 (target record first): denied")
	}
}

// TestRedTeamDNSCNAMEFromOtherZone: the pod asks the trusted resolver
// for names of a zone it controls, which the resolver relays with their
// records as the attacker's zone wrote them: "y.attacker.test CNAME
// www.example.com" and "www.example.com A 203.0.113.77" (and the same
// shape under rule web's wildcard). The pod never asked a name rule web
// admits: nothing may be learned, whatever names the chain passes
// through. The rule's names asked directly still work.
func TestRedTeamDNSCNAMEFromOtherZone(t *testing.T) {
	l := newDNSStoreLab(t,
		dnsserver.Record{Name: "y.attacker.test", Raw: []dnsserver.RawRecord{
			{Name: "y.attacker.test", CNAME: "www.example.com", TTL: 300},
			{Name: "www.example.com", Addr: netip.MustParseAddr("203.0.113.77"), TTL: 300},
		}},
		dnsserver.Record{Name: "z.attacker.test", Raw: []dnsserver.RawRecord{
			{Name: "z.attacker.test", CNAME: "hop.attacker.test", TTL: 300},
			{Name: "hop.attacker.test", CNAME: "evil.example.org", TTL: 300},
			{Name: "evil.example.org", Addr: netip.MustParseAddr("203.0.113.78"), TTL: 300},
		}})
	for _, c := range []struct{ name, addr string }{{"y.attacker.test", "203.0.113.77"}, {"z.attacker.test", "203.0.113.78"}} {
		if got := l.lookup("x/a", c.name, false); !slices.Contains(got, netip.MustParseAddr(c.addr)) {
			t.Fatalf("the attacker's lookup of %s got %v", c.name, got)
		}
		if l.connects("x/a", c.addr) {
			t.Errorf("x/a reached %s after asking %s, whose chain passes through a name of rule web\n%s", c.addr, c.name, l.ListTable("node-1"))
		}
		if l.Agent("node-1").DNS().Learner.Resolved(netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr(c.addr), webDomains) {
			t.Errorf("the evaluator takes %s (asked as %s) for a name of rule web", c.addr, c.name)
		}
	}
	// The names asked directly resolve as the zone that owns them says.
	l.lookup("x/a", "www.example.com", false)
	if !l.connects("x/a", "192.0.2.10") {
		t.Errorf("www.example.com -> 192.0.2.10: denied")
	}
	if l.connects("x/a", "203.0.113.77") {
		t.Errorf("x/a reached 203.0.113.77 after asking www.example.com, which the cluster DNS answers with 192.0.2.10")
	}
}

// TestRedTeamDNSMappedAAAA: the pod resolves a name of rule web whose AAAA
// record is ::ffff:203.0.113.78 (the zone is the attacker's, under a
// wildcard the rule admits) and connects to 203.0.113.78 over IPv4, as a
// dual-stack socket connecting to the mapped address does. No A record
// says so: the connection must fail.
func TestRedTeamDNSMappedAAAA(t *testing.T) {
	l := newDNSStoreLab(t, dnsserver.Record{Name: "mapped.example.org", Addrs: []netip.Addr{netip.MustParseAddr("::ffff:203.0.113.78")}, TTL: 300})
	before := l.metric("nftpolicy_dns_answers_not_learned_total", fqdn.AnswerMapped)
	if got := l.lookup("x/a", "mapped.example.org", true); len(got) != 1 || !got[0].Is4In6() {
		t.Fatalf("AAAA lookup got %v, want the mapped address", got)
	}
	if l.connects("x/a", "203.0.113.78") {
		t.Errorf("x/a reached 203.0.113.78 after an AAAA answer ::ffff:203.0.113.78\n%s", l.ListTable("node-1"))
	}
	if got := l.metric("nftpolicy_dns_answers_not_learned_total", fqdn.AnswerMapped); got != before+1 {
		t.Errorf("mapped answers counted %v, want %v", got, before+1)
	}
}

// TestRedTeamDNSAddressReuse: x/a resolves www.example.com and is deleted;
// a new pod, x/b, gets its addresses. x/b never resolved the name: its
// connection must fail until it does.
func TestRedTeamDNSAddressReuse(t *testing.T) {
	l := newDNSStoreLab(t)
	l.lookup("x/a", "www.example.com", false)
	if !l.connects("x/a", "192.0.2.10") {
		t.Fatalf("x/a cannot reach www.example.com after resolving it\n%s", l.ListTable("node-1"))
	}
	if err := l.RemovePod("x/a"); err != nil {
		t.Fatal(err)
	}
	// x/a deleted and x/b created at its addresses, seen in one program
	// change (the harder case: no program without a pod at the address).
	reused := dnsstoreScenario(t, "b")
	if _, err := l.Apply(l.ctx, reused, false); err != nil {
		t.Fatal(err)
	}
	if l.connects("x/b", "192.0.2.10") {
		t.Errorf("x/b, at x/a's former address, reached www.example.com without resolving it\n%s", l.ListTable("node-1"))
	}
	l.lookup("x/b", "www.example.com", false)
	if !l.connects("x/b", "192.0.2.10") {
		t.Errorf("x/b cannot reach www.example.com after resolving it")
	}
}

// TestRedTeamDNSNameFlood: x/a resolves more names under *.example.org than
// a pod may keep. Its store and kernel elements stay within the bound, the
// evictions are counted, and x/c's lookups are learned meanwhile (their
// hold times are logged: tests assert no timings). The lookups are paced
// under the pod's share of the DNS queue (TestRedTeamDNSQueryFlood floods it).
func TestRedTeamDNSNameFlood(t *testing.T) {
	const names = fqdn.DefaultMaxNamesPerPod + 200
	var recs []dnsserver.Record
	for i := 0; i < names; i++ {
		recs = append(recs, dnsserver.Record{Name: fmt.Sprintf("f%d.example.org", i), Addrs: []netip.Addr{netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)})}, TTL: 300})
	}
	l := newDNSStoreLab(t, recs...)
	var (
		mu    sync.Mutex
		holds []time.Duration
	)
	dns := l.Agent("node-1").DNS()
	dns.ObserveHolds(func(d time.Duration) {
		mu.Lock()
		holds = append(holds, d)
		mu.Unlock()
	})
	// x/a's lookups stay under its share of the DNS queue
	// (compile.DefaultDNSPodRate queries a second): past it the kernel
	// drops queries, which a resolver retries and this test's lookups do
	// not. The store's bounds, not the queue's, are under test here.
	pace := time.NewTicker(2 * time.Second / compile.DefaultDNSPodRate)
	defer pace.Stop()
	for i := 0; i < names; i++ {
		<-pace.C
		if i%50 == 0 {
			// x/c's lookups go on during the flood.
			l.lookup("x/c", "www.example.com", false)
		}
		l.lookup("x/a", fmt.Sprintf("f%d.example.org", i), false)
	}
	dns.ObserveHolds(nil)
	if !l.connects("x/c", "192.0.2.10") {
		t.Errorf("x/c cannot reach www.example.com during x/a's flood")
	}
	set := compile.FQDNSetName(&l.Agent("node-1").Program.ClusterPolicies[0], 1, true)
	out, err := l.Net().NodeExec("node-1", "nft", "list", "set", "inet", compile.TableName, set)
	if err != nil {
		t.Fatalf("list %s: %v: %s", set, err, out)
	}
	if n := strings.Count(string(out), "10.244.1.10 . 100.64."); n > fqdn.DefaultMaxNamesPerPod {
		t.Errorf("x/a holds %d kernel elements of the flood, more than the bound %d", n, fqdn.DefaultMaxNamesPerPod)
	}
	if last := fmt.Sprintf("10.244.1.10 . 100.64.%d.%d ", (names-1)>>8, (names-1)&0xff); !strings.Contains(string(out), last) {
		t.Errorf("the name x/a resolved last is not in the kernel (%s)", last)
	}
	if strings.Contains(string(out), "10.244.1.10 . 100.64.0.0 ") {
		t.Errorf("the name x/a resolved first is still in the kernel, past the bound")
	}
	if got := l.metric("nftpolicy_dns_learned_evictions_total", ""); got < names-fqdn.DefaultMaxNamesPerPod {
		t.Errorf("evictions counted %v, want at least %d", got, names-fqdn.DefaultMaxNamesPerPod)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(holds)
	if len(holds) > 0 {
		t.Logf("%d replies held while learned: p50 %v, p99 %v, max %v", len(holds), holds[len(holds)/2], holds[len(holds)*99/100], holds[len(holds)-1])
	}
}
