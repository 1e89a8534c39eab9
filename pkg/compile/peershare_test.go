package compile_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// Peer sets shared by content (peershare.go). The cluster is
// compiletest.Cluster's: 100 pods a namespace, labels app=app-<j%20> and
// tier web/api/db.

// peerSets lists a ruleset's peer sets (names starting "peers-") by name.
func peerSets(rs *compile.Ruleset) map[string]*compile.Set {
	out := map[string]*compile.Set{}
	for n, s := range rs.Sets {
		if strings.HasPrefix(n, "peers-") {
			out[n] = s
		}
	}
	return out
}

// TestPeersSharedByContent: issue 43's peers, each saying something else
// and each selecting every pod, and a peer of another policy that says
// "every namespace" plainly, use one set: the program holds one selector
// of every pod, which names the others as aliases and lists every rule as
// a user, and the ruleset one peer set per family whose comment says it
// is shared. The policy is charged for one set: with a budget that 40
// sets of every pod pass, it is built. Peers that select the same few
// pods (fewer than ShareMinMembers) keep a set each.
func TestPeersSharedByContent(t *testing.T) {
	const pods, peers = 1000, 40
	in := ct.Cluster(pods, 0, 2)
	in.NodeName = "node-0"
	in.Policies = []*networkingv1.NetworkPolicy{
		ct.CostAmplificationPolicy("ns-0001", "amp", "app-1", peers),
		ct.NetPol("ns-0002", "plain", ct.Sel("app", "app-2"), ct.Ingress(ct.Peers(ct.NSPeer(ct.Sel())))),
		// app-3 is 5 pods of ns-0003, said twice.
		ct.NetPol("ns-0003", "few", ct.Sel("app", "app-5"), ct.Ingress(ct.Peers(
			ct.PodPeer(ct.Sel("app", "app-3")),
			ct.PodPeer(ct.Expr("app", metav1.LabelSelectorOpIn, "app-3"))))),
	}
	// Matching (peers x pods) and one set fit; 40 sets would not.
	in.Budgets = compile.Budgets{Policy: (peers + 10) * pods}
	p := compile.Build(in)
	amp := findPolicy(t, p, "ns-0001/amp")
	if amp.Rejected {
		t.Fatalf("rejected, charged %d: %v", amp.Cost, amp.Problems)
	}
	var every []*compile.Selector
	for i := range p.Selectors {
		if len(p.Selectors[i].Members) == pods {
			every = append(every, &p.Selectors[i])
		}
	}
	if len(every) != 1 {
		t.Fatalf("%d peer sets of every pod, want 1 for %d peers", len(every), peers+1)
	}
	s := every[0]
	if len(s.Aliases) != peers || len(s.Users) != 2 {
		t.Errorf("the set of every pod: %d aliases (want %d), users %v", len(s.Aliases), peers, s.Users)
	}
	if r := amp.Ingress[0]; len(r.Selectors) != 1 {
		t.Errorf("amp's rule names %d selectors, want the one shared", len(r.Selectors))
	}
	if n := members(p); n > pods+100 {
		t.Errorf("%d peer set elements in the program, want at most %d", n, pods+100)
	}
	few := findPolicy(t, p, "ns-0003/few")
	if got := len(few.Ingress[0].Selectors); got != 2 {
		t.Errorf("two peers of %d pods (under ShareMinMembers) use %d sets, want 2", len(p.Selectors[few.Ingress[0].Selectors[0]].Members), got)
	}

	rs, err := compile.Render(p, compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat})
	if err != nil {
		t.Fatal(err)
	}
	shared := 0
	for n, set := range peerSets(rs) {
		if strings.HasPrefix(*set.Set.Comment, "shared with 40 other peers selecting the same pods: ") {
			shared++
			if n != compile.PeerSetName(s, strings.HasSuffix(n, "-v4")) {
				t.Errorf("shared set %s is not named after its first peer", n)
			}
		}
	}
	if len(peerSets(rs)) != 3*2 || shared != 2 {
		t.Errorf("ruleset peer sets: %d (want 6: one shared pair, two small pairs), %d shared", len(peerSets(rs)), shared)
	}
}

// TestRejectedPolicyLeavesNoAlias: a policy rejected for its budget after
// its peers were interned as aliases of another policy's set leaves no
// alias behind: the build's selectors are those of the build without it,
// and a later policy that says what one of its peers said gets its own
// selector key resolved again.
func TestRejectedPolicyLeavesNoAlias(t *testing.T) {
	in := ct.Cluster(500, 0, 2)
	in.NodeName = "node-0"
	first := ct.NetPol("ns-0001", "a", ct.Sel("app", "app-1"), ct.Ingress(ct.Peers(ct.NSPeer(ct.Sel()))))
	last := ct.NetPol("ns-0001", "c", ct.Sel("app", "app-2"), ct.Ingress(ct.Peers(
		ct.PodNSPeer(ct.Expr("nope-0", metav1.LabelSelectorOpDoesNotExist), ct.Sel()))))
	in.Policies = []*networkingv1.NetworkPolicy{first, last}
	clean := compile.Build(in)
	in.Policies = append(in.Policies, ct.CostAmplificationPolicy("ns-0001", "b", "app-3", 2300))
	p := compile.Build(in)
	if b := findPolicy(t, p, "ns-0001/b"); !b.Rejected {
		t.Fatalf("ns-0001/b not rejected (charged %d)", b.Cost)
	}
	if len(p.Selectors) != len(clean.Selectors) {
		t.Fatalf("%d selectors, %d without the rejected policy", len(p.Selectors), len(clean.Selectors))
	}
	for i := range p.Selectors {
		got, want := &p.Selectors[i], &clean.Selectors[i]
		if got.Key != want.Key || strings.Join(got.Aliases, ",") != strings.Join(want.Aliases, ",") || len(got.Members) != len(want.Members) {
			t.Errorf("selector %d: %s aliases %v (%d pods); without the rejected policy %s aliases %v (%d pods)",
				i, got.Key, got.Aliases, len(got.Members), want.Key, want.Aliases, len(want.Members))
		}
	}
	if c := findPolicy(t, p, "ns-0001/c"); c.Rejected || len(c.Ingress[0].Selectors) != 1 {
		t.Fatalf("ns-0001/c: rejected %v, %d selectors", c.Rejected, len(c.Ingress[0].Selectors))
	}
}

// TestTrackerSplitsSharedSet: two peers that say different things share
// the set of every pod. A pod that both select is applied in place (the
// set grows); a pod that one selects and the other does not would split
// the set, which the tracker leaves to the build (FallbackSharedSet); a
// pod that makes a small set hold what the shared one holds would merge
// them, likewise. After each change the tracked ruleset is the full
// build's.
func TestTrackerSplitsSharedSet(t *testing.T) {
	in := ct.Cluster(200, 0, 2)
	in.NodeName = "node-0"
	// odd selects every pod but those labelled odd: one.
	odd := addPods("ns-0003", "odd", 1, 9)[0]
	odd.Labels["odd"] = "1"
	in.Pods = append(in.Pods, odd)
	in.Policies = []*networkingv1.NetworkPolicy{ct.CostAmplificationPolicy("ns-0001", "amp", "app-1", 2),
		ct.NetPol("ns-0001", "odd", ct.Sel("app", "app-1"), ct.Ingress(ct.Peers(ct.PodNSPeer(ct.Expr("odd", metav1.LabelSelectorOpDoesNotExist), ct.Sel()))))}
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(p.Selectors); n != 2 || len(p.Selectors[0].Aliases) != 1 {
		t.Fatalf("%d selectors, want one shared by amp's two peers and odd's", n)
	}
	same := func(step string) {
		t.Helper()
		want, err := compile.Render(compile.Build(in), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(elementsBySet(want), elementsBySet(tr.Ruleset())); diff != "" {
			t.Fatalf("%s: tracked ruleset's elements differ from the full build's (-full +tracked):\n%s", step, diff)
		}
	}
	apply := func(step string, pod *corev1.Pod, want compile.Fallback) {
		t.Helper()
		in.Pods = append(in.Pods, pod)
		if _, f := tr.ApplyPod(pod.Namespace+"/"+pod.Name, pod); f != want {
			t.Fatalf("%s: fallback %q, want %q", step, f, want)
		}
		if want != compile.NoFallback {
			if _, _, err := tr.Rebuild(in); err != nil {
				t.Fatal(err)
			}
		}
		same(step)
	}
	both := addPods("ns-0002", "both", 1, 0)[0]
	apply("a pod both peers select", both, compile.NoFallback)
	split := addPods("ns-0002", "split", 1, 1)[0]
	split.Labels["nope-1"] = "x" // peer 0 selects it, peer 1 does not
	apply("a pod one peer selects", split, compile.FallbackSharedSet)
	if n := len(tr.Program().Selectors); n != 3 {
		t.Fatalf("after the split: %d selectors, want 3", n)
	}
	// Without the odd pod, amp's first peer and odd's select the same.
	in.Pods = slices.DeleteFunc(in.Pods, func(p *corev1.Pod) bool { return p == odd })
	if _, f := tr.ApplyPod(odd.Namespace+"/"+odd.Name, nil); f != compile.FallbackSharedSet {
		t.Fatalf("a pod whose leaving makes two sets equal: fallback %q", f)
	}
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	same("the odd pod deleted")
	if n := len(tr.Program().Selectors); n != 2 {
		t.Fatalf("after the merge: %d selectors, want 2", n)
	}
}
