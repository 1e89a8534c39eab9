package fqdn_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// testLearner is a learner of a program the test can replace.
type testLearner struct {
	*fqdn.Learner
	w       *fakeWriter
	m       *fqdn.Metrics
	prog    *compile.Program
	now     time.Time
	program func(yaml string) *compile.Program
}

func newTestLearner(t *testing.T, sc string, maxNames, maxAddrs int) *testLearner {
	t.Helper()
	tl := &testLearner{w: &fakeWriter{}, m: fqdn.NewMetrics(), now: time.Unix(1000, 0)}
	tl.program = func(yaml string) *compile.Program {
		s, err := scenario.Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return compile.Build(s.Input("n1", nil, nil))
	}
	tl.prog = tl.program(sc)
	l, err := fqdn.New(fqdn.Config{Program: func() *compile.Program { return tl.prog }, Writer: tl.w,
		Trusted: func(a netip.Addr) bool { return a == server }, MinTTL: 5 * time.Second, MaxTTL: time.Hour,
		Now: func() time.Time { return tl.now }, Metrics: tl.m, MaxNamesPerPod: maxNames, MaxAddrsPerPod: maxAddrs})
	if err != nil {
		t.Fatal(err)
	}
	tl.Learner = l
	return tl
}

// publish makes prog the program in force, as the controller does.
func (tl *testLearner) publish(prog *compile.Program) {
	old := tl.prog
	tl.prog = prog
	tl.OnProgram(old, prog)
}

func (tl *testLearner) learnA(t *testing.T, dst netip.Addr, name, addr string, ttl uint32) fqdn.Result {
	t.Helper()
	return tl.Learn(context.Background(), server, dst, reply(t, name+".", dnsmessage.TypeA, false, rr{name: name + ".", addr: addr, ttl: ttl}))
}

func elementStrings(batches [][]fqdn.Element) []string {
	var out []string
	for _, b := range batches {
		for _, e := range b {
			out = append(out, fmt.Sprintf("%s %s . %s", e.Set, e.Pod, e.Addr))
		}
	}
	sort.Strings(out)
	return out
}

// TestLearnCNAMEAttack: a reply whose question owns an address and is an
// alias of a rule's name admits nothing for the rule.
func TestLearnCNAMEAttack(t *testing.T) {
	w := &fakeWriter{}
	l, _, _ := newLearner(t, w, false)
	attacker := netip.MustParseAddr("203.0.113.77")
	r := l.Learn(context.Background(), server, podA4, reply(t, "x.attacker.test.", dnsmessage.TypeA, false,
		rr{name: "x.attacker.test.", addr: "203.0.113.77", ttl: 60}, rr{name: "x.attacker.test.", cname: "www.example.com.", ttl: 60}))
	if r.Cause != fqdn.CauseNoMatch || len(w.got) != 0 || l.Resolved(podA4, attacker, web) {
		t.Errorf("attack: Learn = %+v, wrote %v, resolved %v; want nothing learned", r, w.got, l.Resolved(podA4, attacker, web))
	}
	// The legitimate shape still works: the rule's name is an alias of the owner.
	r = l.Learn(context.Background(), server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false,
		rr{name: "edge.cdn.test.", addr: "192.0.2.1", ttl: 60}, rr{name: "www.example.com.", cname: "edge.cdn.test.", ttl: 60}))
	if r.Learned != 1 || !l.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("alias chain, target first: Learn = %+v", r)
	}
}

// TestLearnCNAMEFromOtherZone: an answer is learned for its question only.
// A chain that reaches a rule's name through a CNAME of another zone admits
// nothing, whatever address the reply gives that name; a question a rule
// matches is learned for itself, never for the names its chain passes
// through, in the store and in the sets of a later program.
func TestLearnCNAMEFromOtherZone(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	tl.OnProgram(nil, tl.prog)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		msg  []byte
		addr string
	}{
		{"alias of the rule's exact name", reply(t, "y.attacker.test.", dnsmessage.TypeA, false,
			rr{name: "y.attacker.test.", cname: "www.example.com.", ttl: 60}, rr{name: "www.example.com.", addr: "203.0.113.77", ttl: 60}), "203.0.113.77"},
		{"target record first", reply(t, "y.attacker.test.", dnsmessage.TypeA, false,
			rr{name: "www.example.com.", addr: "203.0.113.77", ttl: 60}, rr{name: "y.attacker.test.", cname: "www.example.com.", ttl: 60}), "203.0.113.77"},
		{"through a hop, under the wildcard", reply(t, "z.attacker.test.", dnsmessage.TypeA, false,
			rr{name: "z.attacker.test.", cname: "hop.attacker.test.", ttl: 60}, rr{name: "hop.attacker.test.", cname: "evil.example.org.", ttl: 60},
			rr{name: "evil.example.org.", addr: "203.0.113.78", ttl: 60}), "203.0.113.78"},
		{"AAAA", reply(t, "y.attacker.test.", dnsmessage.TypeAAAA, false,
			rr{name: "y.attacker.test.", cname: "www.example.com.", ttl: 60}, rr{name: "www.example.com.", addr: "2001:db8::77", ttl: 60}), "2001:db8::77"},
	} {
		tl.w.got = nil
		r := tl.Learn(ctx, server, podA4, tc.msg)
		if r.Cause != fqdn.CauseNoMatch || !r.Release || len(tl.w.got) != 0 {
			t.Errorf("%s: Learn = %+v, wrote %v; want released, nothing learned", tc.name, r, tl.w.got)
		}
		for _, pod := range []netip.Addr{podA4, podA6} {
			if tl.Resolved(pod, netip.MustParseAddr(tc.addr), web) {
				t.Errorf("%s: %s resolved for rule web", tc.name, tc.addr)
			}
		}
	}

	// The question is the rule's: learned for it, not for the target.
	tl.w.got = nil
	r := tl.Learn(ctx, server, podA4, reply(t, "www.example.com.", dnsmessage.TypeA, false,
		rr{name: "www.example.com.", cname: "a.example.org.", ttl: 300}, rr{name: "a.example.org.", addr: "192.0.2.5", ttl: 300}))
	addr := netip.MustParseAddr("192.0.2.5")
	if r.Learned != 1 || !tl.Resolved(podA4, addr, []compile.DomainPattern{{Suffix: "www.example.com"}}) {
		t.Fatalf("www.example.com -> a.example.org -> 192.0.2.5: Learn = %+v", r)
	}
	if tl.Resolved(podA4, addr, []compile.DomainPattern{{Suffix: "example.org", Wildcard: true}}) {
		t.Errorf("a.example.org, reached only through a CNAME, is resolved for *.example.org")
	}
	// A program whose rule names only *.example.org gets nothing of it.
	tl.w.got = nil
	only := strings.Replace(webScenario, `[Www.Example.com., "*.example.org"]`, `["*.example.org"]`, 1)
	if only == webScenario {
		t.Fatal("webScenario's rule changed")
	}
	tl.publish(tl.program(only))
	if len(tl.w.got) != 0 {
		t.Errorf("a rule naming only the CNAME target's wildcard got %v", elementStrings(tl.w.got))
	}
}

// TestLearnMappedAAAA: an IPv4-mapped AAAA answer is learned as neither
// family; it is counted.
func TestLearnMappedAAAA(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	r := tl.Learn(context.Background(), server, podA4, reply(t, "www.example.com.", dnsmessage.TypeAAAA, false,
		rr{name: "www.example.com.", addr: "::ffff:203.0.113.78", ttl: 60}))
	if r.Learned != 0 || len(tl.w.got) != 0 || r.Cause != fqdn.CauseNoAddress {
		t.Errorf("Learn = %+v, wrote %v; want nothing", r, tl.w.got)
	}
	for _, a := range []string{"203.0.113.78", "::ffff:203.0.113.78"} {
		if tl.Resolved(podA4, netip.MustParseAddr(a), web) {
			t.Errorf("%s resolved", a)
		}
	}
	if got := fqdn.MetricValue(tl.m, "nftpolicy_dns_answers_not_learned_total", fqdn.AnswerMapped); got != 1 {
		t.Errorf("mapped answers counted %v, want 1", got)
	}
}

// TestStoreBounds: past its bounds a pod's least recently learned names
// are evicted, counted, and their addresses' elements deleted unless a
// kept name resolves to them; other pods are untouched.
func TestStoreBounds(t *testing.T) {
	// x/c, a second subject of rule web.
	sc := strings.Replace(webScenario, "pods:\n", "pods:\n  - {namespace: x, name: c, ip: 10.0.0.3, node: n1}\n", 1)
	tl := newTestLearner(t, sc, 4, 6)
	podB := netip.MustParseAddr("10.0.0.3")
	set := tl.prog.FQDNRules()[0].SetV4
	tl.learnA(t, podB, "b.example.org", "192.0.2.200", 60)
	// n0 and n1 share 192.0.2.100; n2..n9 have addresses of their own.
	tl.learnA(t, podA4, "n0.example.org", "192.0.2.100", 60)
	tl.learnA(t, podA4, "n1.example.org", "192.0.2.100", 60)
	for i := 2; i < 10; i++ {
		tl.now = tl.now.Add(time.Second)
		tl.learnA(t, podA4, fmt.Sprintf("n%d.example.org", i), fmt.Sprintf("192.0.2.%d", i), 60)
	}
	if got := fqdn.MetricValue(tl.m, "nftpolicy_dns_learned_evictions_total", ""); got != 6 {
		t.Errorf("evictions counted %v, want 6", got)
	}
	for i := 0; i < 10; i++ {
		addr := netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", i))
		if i < 2 {
			addr = netip.MustParseAddr("192.0.2.100")
		}
		if got, want := tl.Resolved(podA4, addr, web), i >= 6; got != want {
			t.Errorf("n%d: resolved %v, want %v", i, got, want)
		}
	}
	// n0's eviction kept 192.0.2.100 (n1 still resolved to it); n1's
	// deleted it.
	want := []string{set + " 10.0.0.1 . 192.0.2.100", set + " 10.0.0.1 . 192.0.2.2", set + " 10.0.0.1 . 192.0.2.3",
		set + " 10.0.0.1 . 192.0.2.4", set + " 10.0.0.1 . 192.0.2.5"}
	if got := elementStrings(tl.w.deleted); !slices.Equal(got, want) {
		t.Errorf("deleted %v, want %v", got, want)
	}
	if !tl.Resolved(podB, netip.MustParseAddr("192.0.2.200"), web) {
		t.Errorf("another pod's answer was evicted")
	}
	// One reply larger than the bounds is cut, not stored past them.
	big := []rr{}
	for i := 0; i < 8; i++ {
		big = append(big, rr{name: "big.example.org.", addr: fmt.Sprintf("198.51.100.%d", i), ttl: 60})
	}
	tl.Learn(context.Background(), server, podA4, reply(t, "big.example.org.", dnsmessage.TypeA, false, big...))
	if got := fqdn.MetricValue(tl.m, "nftpolicy_dns_answers_not_learned_total", fqdn.AnswerOverBound); got != 8 {
		t.Errorf("answers over the bound counted %v, want 8", got)
	}
}

// TestStoreExpiry: an expired answer is not resolved, and a name learned
// again gets the new expiry.
func TestStoreExpiry(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	addr := netip.MustParseAddr("192.0.2.1")
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 10)
	tl.now = tl.now.Add(11 * time.Second)
	if tl.Resolved(podA4, addr, web) {
		t.Errorf("resolved after its TTL")
	}
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 10)
	if !tl.Resolved(podA4, addr, web) {
		t.Errorf("not resolved after a new lookup")
	}
}

// TestOnProgramPodGone: a pod that leaves the program loses its answers,
// in the store and in the kernel; a new pod given its address inherits
// nothing.
func TestOnProgramPodGone(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	set := tl.prog.FQDNRules()[0].SetV4
	tl.OnProgram(nil, tl.prog)
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 300)
	gone := `
pods:
  - {namespace: y, name: b, ip: 10.0.0.2, node: n1}
  - {namespace: x, name: c, ip: 10.0.0.9, node: n1}
` + webScenario[len("\npods:\n  - {namespace: x, name: a, ips: [10.0.0.1, \"fd00::1\"], node: n1}\n  - {namespace: y, name: b, ip: 10.0.0.2, node: n1}\n"):]
	tl.publish(tl.program(gone))
	if got, want := elementStrings(tl.w.deleted), []string{set + " 10.0.0.1 . 192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("deleted %v, want %v", got, want)
	}
	reused := `
pods:
  - {namespace: y, name: b, ip: 10.0.0.2, node: n1}
  - {namespace: x, name: new, ips: [10.0.0.1, "fd00::1"], node: n1}
` + webScenario[len("\npods:\n  - {namespace: x, name: a, ips: [10.0.0.1, \"fd00::1\"], node: n1}\n  - {namespace: y, name: b, ip: 10.0.0.2, node: n1}\n"):]
	tl.publish(tl.program(reused))
	if tl.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("the pod now at 10.0.0.1 inherited x/a's answer")
	}
	// Replaced at once, in one program change: the same.
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 300)
	tl.w.deleted = nil
	tl.publish(tl.program(webScenario))
	if got, want := elementStrings(tl.w.deleted), []string{set + " 10.0.0.1 . 192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("x/new replaced by x/a at its address: deleted %v, want %v", got, want)
	}
	if tl.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("x/a inherited x/new's answer")
	}
}

// TestOnPodAppliedPodGone: the controller applies x/a's deletion to the
// kernel before it publishes a program without x/a: its elements go at
// once, not at the publication, and nothing is learned for x/a again. A
// change that keeps the pod's addresses deletes nothing.
func TestOnPodAppliedPodGone(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	set := tl.prog.FQDNRules()[0].SetV4
	tl.OnProgram(nil, tl.prog)
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 300)
	a, _ := tl.prog.PodByKey("x/a")
	kept := &compile.PodInfo{Key: "x/a", Eligible: true, IPs: tl.prog.Pods[a].IPs}
	tl.OnPodApplied("x/a", kept)
	if len(tl.w.deleted) != 0 || !tl.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Fatalf("a change that keeps x/a's addresses deleted %v", elementStrings(tl.w.deleted))
	}
	tl.OnPodApplied("x/a", nil)
	if got, want := elementStrings(tl.w.deleted), []string{set + " 10.0.0.1 . 192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("x/a's deletion applied: deleted %v, want %v", got, want)
	}
	if tl.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("x/a's answer still resolves after its deletion was applied")
	}
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 300)
	if tl.Resolved(podA4, netip.MustParseAddr("192.0.2.1"), web) {
		t.Errorf("a reply to x/a's former address was learned before the program without x/a")
	}
}

// listingWriter is a fakeWriter whose sets hold elements already.
type listingWriter struct {
	*fakeWriter
	sets  map[string][]fqdn.Element
	lists int
}

func (w *listingWriter) ListElements(_ context.Context, set string) ([]fqdn.Element, error) {
	w.lists++
	return w.sets[set], nil
}

// TestOnProgramSweep: the first publication deletes the elements a previous
// agent wrote for pods that are not subjects of the set's rule (deleted
// while no agent ran); later ones read nothing.
func TestOnProgramSweep(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	set := tl.prog.FQDNRules()[0].SetV4
	el := func(pod string) fqdn.Element {
		return fqdn.Element{Set: set, Pod: netip.MustParseAddr(pod), Addr: netip.MustParseAddr("192.0.2.1")}
	}
	lw := &listingWriter{fakeWriter: tl.w, sets: map[string][]fqdn.Element{set: {el("10.0.0.1"), el("10.0.0.2"), el("10.0.0.7")}}}
	l, err := fqdn.New(fqdn.Config{Program: func() *compile.Program { return tl.prog }, Writer: lw, Trusted: func(netip.Addr) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	l.OnProgram(nil, tl.prog)
	// 10.0.0.1 is x/a, a subject; y/b (10.0.0.2) is not, 10.0.0.7 no pod.
	if got, want := elementStrings(lw.deleted), []string{set + " 10.0.0.2 . 192.0.2.1", set + " 10.0.0.7 . 192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("swept %v, want %v", got, want)
	}
	lists := lw.lists
	l.OnProgram(tl.prog, tl.prog)
	if lw.lists != lists {
		t.Errorf("a later publication read the sets again")
	}
}

// TestOnProgramRewrite: when a pod's rules get new sets, the answers the
// new rules still match are written into them with their remaining TTL,
// and nothing else.
func TestOnProgramRewrite(t *testing.T) {
	tl := newTestLearner(t, webScenario, 0, 0)
	tl.OnProgram(nil, tl.prog)
	tl.learnA(t, podA4, "www.example.com", "192.0.2.1", 300)
	tl.learnA(t, podA4, "a.example.org", "192.0.2.2", 300)
	tl.w.got = nil
	tl.now = tl.now.Add(100 * time.Second)
	// The rule moves to index 1 (a new set) and keeps only www.example.com.
	narrowed := webScenario[:len(webScenario)-len("        - {name: names, action: Accept, to: [{domainNames: [Www.Example.com., \"*.example.org\"]}]}\n")] +
		"        - {name: first, action: Accept, to: [{networks: [198.51.100.0/24]}]}\n" +
		"        - {name: names, action: Accept, to: [{domainNames: [www.example.com]}]}\n"
	p := tl.program(narrowed)
	set := p.FQDNRules()[0].SetV4
	if set == tl.prog.FQDNRules()[0].SetV4 {
		t.Fatalf("the test needs a new set, got %s again", set)
	}
	tl.publish(p)
	if len(tl.w.got) != 1 || len(tl.w.got[0]) != 1 {
		t.Fatalf("re-written %v, want one element", tl.w.got)
	}
	if e := tl.w.got[0][0]; e.Set != set || e.Pod != podA4 || e.Addr != netip.MustParseAddr("192.0.2.1") || e.Timeout != 200*time.Second {
		t.Errorf("re-written %+v, want %s 10.0.0.1 . 192.0.2.1 with 200s left", e, set)
	}
}

// BenchmarkLearn40kNames: one pod holding 40k learned names; each reply
// learns one more name. Reports the 99th percentile of one Learn, in µs
// (hack/bench.sh: dns_learn_us_p99_40k_names).
func BenchmarkLearn40kNames(b *testing.B) {
	const stored = 40000
	t := &testing.T{}
	tl := newTestLearner(t, webScenario, 2*stored, 4*stored)
	tl.w.discard = true
	msg := func(i int) []byte {
		n := fmt.Sprintf("n%d.example.org.", i)
		return reply(t, n, dnsmessage.TypeA, false, rr{name: n, addr: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}).String(), ttl: 3600})
	}
	ctx := context.Background()
	for i := 0; i < stored; i++ {
		if r := tl.Learn(ctx, server, podA4, msg(i)); r.Learned != 1 {
			b.Fatalf("prefill: %+v", r)
		}
	}
	msgs := make([][]byte, b.N)
	for i := range msgs {
		msgs[i] = msg(stored + i%stored)
	}
	d := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		tl.Learn(ctx, server, podA4, msgs[i])
		d[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1e3, "us-p99")
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1e3, "us-p50")
	b.ReportMetric(float64(d[len(d)-1].Nanoseconds())/1e3, "us-max")
}
