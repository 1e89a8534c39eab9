package compile_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// findPolicy returns the program's policy with the key.
func findPolicy(t *testing.T, p *compile.Program, key string) *compile.Policy {
	t.Helper()
	for i := range p.Policies {
		if p.Policies[i].Key == key {
			return &p.Policies[i]
		}
	}
	t.Fatalf("no policy %s in the program", key)
	return nil
}

// members counts the program's peer set elements.
func members(p *compile.Program) int {
	n := 0
	for i := range p.Selectors {
		n += len(p.Selectors[i].Members)
	}
	return n
}

// TestBudgetRejectsCostAmplification: issue 43's policy (2,300 peers, each
// selecting every pod, under MaxPolicyCost for what it says) at 3,000 pods
// would make 6.9 million elements. It is rejected for what it makes, having
// made nothing: no peer set is left of it, the build's sets hold what the
// other policies make, and what it was charged is its budget. It isolates
// its pods (fail closed); the other namespaces' policies are compiled.
func TestBudgetRejectsCostAmplification(t *testing.T) {
	in := ct.Cluster(3000, 30, 3)
	attack := ct.CostAmplificationPolicy("ns-0005", "amp", "app-1", 2300)
	if c := compile.NetworkPolicyCost(attack); c > compile.MaxPolicyCost {
		t.Fatalf("the attack says %d, over MaxPolicyCost: not the attack of issue 43", c)
	}
	clean := compile.Build(in)
	in.Policies = append(in.Policies, attack)
	p := compile.Build(in)
	pol := findPolicy(t, p, "ns-0005/amp")
	if !pol.Rejected || pol.RejectedFor != compile.RejectedBudget {
		t.Fatalf("the attack is not rejected for its budget: rejected %v (%q), cost %d", pol.Rejected, pol.RejectedFor, pol.Cost)
	}
	if len(pol.Ingress)+len(pol.Egress) != 0 || len(pol.Selected) == 0 || !pol.IsolatesIngress {
		t.Errorf("the rejected policy is not enforced fail-closed: %d rules, %d pods selected, isolates ingress %v",
			len(pol.Ingress)+len(pol.Egress), len(pol.Selected), pol.IsolatesIngress)
	}
	if pol.Cost != compile.DefaultPolicyBudget {
		t.Errorf("charged %d, want its budget %d", pol.Cost, compile.DefaultPolicyBudget)
	}
	if got, want := members(p), members(clean); got != want || len(p.Selectors) != len(clean.Selectors) {
		t.Errorf("the rejected policy left sets behind: %d sets of %d elements, %d of %d without it", len(p.Selectors), got, len(clean.Selectors), want)
	}
	for i := range p.Policies {
		if q := &p.Policies[i]; q.Key != "ns-0005/amp" && q.Rejected {
			t.Errorf("%s rejected too: %v", q.Key, q.Problems)
		}
	}
	if len(pol.Problems) != 1 {
		t.Fatalf("problems: %v", pol.Problems)
	}
	t.Logf("%s", pol.Problems[0].Message)
}

// namespacePolicy is a policy of ns selecting app=<app> that admits the
// pods of every namespace (a set of every pod).
func namespacePolicy(ns, name, app string) *networkingv1.NetworkPolicy {
	return ct.NetPol(ns, name, ct.Sel("app", app), ct.Ingress(ct.Peers(ct.NSPeer(ct.Sel()))))
}

// TestNamespaceBudget: a namespace's policies share its budget in name
// order. Three policies of ns-0001, each charged a little under half of
// the budget, fit two; the third by name is rejected for the namespace's
// budget, isolating its pods, and two such policies in another namespace
// are compiled. With the budget raised, all are.
func TestNamespaceBudget(t *testing.T) {
	in := ct.Cluster(400, 0, 2)
	for i := range 3 {
		in.Policies = append(in.Policies, namespacePolicy("ns-0001", fmt.Sprintf("p%d", i), fmt.Sprintf("app-%d", i)))
	}
	for i := range 2 {
		in.Policies = append(in.Policies, namespacePolicy("ns-0002", fmt.Sprintf("p%d", i), fmt.Sprintf("app-%d", i)))
	}
	// Each is charged 23 (NetworkPolicyCost: 1, podSelector 11, rule 1,
	// namespaceSelector 10), its namespace's 100 pods its podSelector is
	// matched against, 4 namespaces and 400 pods matched, 400 members:
	// 927.
	in.Budgets = compile.Budgets{Policy: 1000, Namespace: 2000}
	p := compile.Build(in)
	for _, key := range []string{"ns-0001/p0", "ns-0001/p1", "ns-0002/p0", "ns-0002/p1"} {
		if pol := findPolicy(t, p, key); pol.Rejected || pol.Cost != 927 {
			t.Errorf("%s: rejected %v (%v), cost %d, want 927", key, pol.Rejected, pol.Problems, pol.Cost)
		}
	}
	pol := findPolicy(t, p, "ns-0001/p2")
	if !pol.Rejected || pol.RejectedFor != compile.RejectedNamespaceBudget || len(pol.Ingress) != 0 || len(pol.Selected) == 0 {
		t.Fatalf("ns-0001/p2: rejected %v for %q, %d rules, %d pods selected; want rejected for the namespace's budget, isolating",
			pol.Rejected, pol.RejectedFor, len(pol.Ingress), len(pol.Selected))
	}
	if got := p.NamespaceCosts["ns-0001"]; got != 2000 {
		t.Errorf("ns-0001 charged %d, want its budget 2000", got)
	}
	if got := p.NamespaceCosts["ns-0002"]; got != 2*927 {
		t.Errorf("ns-0002 charged %d, want %d", got, 2*927)
	}
	in.Budgets.Namespace = 3000
	if pol := findPolicy(t, compile.Build(in), "ns-0001/p2"); pol.Rejected {
		t.Errorf("ns-0001/p2 rejected within a namespace budget of 3000: %v", pol.Problems)
	}
}

// addPods returns n pods of namespace ns labelled app=<app>.
func addPods(ns, app string, n, first int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		ip := fmt.Sprintf("10.250.%d.%d", (first+i)/250, (first+i)%250+1)
		out = append(out, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("extra-%d", first+i), Labels: map[string]string{"app": app}},
			Spec:       corev1.PodSpec{NodeName: "node-0"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	return out
}

// TestRecostOnPodJoin: a policy admitted while it makes little is
// re-costed as pods join what it selects, before each is applied. The
// tracker applies pods in place while the charge it bounds fits the
// budget, and leaves the pod that might pass it to the build
// (FallbackCost): at no step does the tracked ruleset hold the sets of a
// policy the build rejects. Once rejected, the policy has no sets and
// pods are applied in place again. The build rejects it once the pods make it
// pass its budget, and admits it again once they left.
func TestRecostOnPodJoin(t *testing.T) {
	in := ct.Cluster(200, 0, 2)
	in.NodeName = "node-0"
	// Charged 1 + 11 + 1 + 21 per peer (NetworkPolicyCost), its
	// namespace's 100 pods, and per peer the namespaces and every pod, and
	// the one set the four peers share (every pod): 1,205 at 200 pods,
	// 2,717 at 500.
	in.Policies = []*networkingv1.NetworkPolicy{ct.CostAmplificationPolicy("ns-0001", "grows", "app-1", 4)}
	in.Budgets = compile.Budgets{Policy: 2000}
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	if pol := findPolicy(t, p, "ns-0001/grows"); pol.Rejected {
		t.Fatalf("rejected at 200 pods (cost %d): %v", pol.Cost, pol.Problems)
	}
	base := in.Pods
	extra := addPods("ns-0002", "joiner", 300, 0)
	var fallbacks int
	for i, pod := range extra {
		in.Pods = append(append([]*corev1.Pod(nil), base...), extra[:i+1]...)
		_, f := tr.ApplyPod(pod.Namespace+"/"+pod.Name, pod)
		switch f {
		case compile.NoFallback:
			// Applied in place while the tracked policy is admitted (it
			// has sets), the build must admit it too.
			tracked := findPolicy(t, tr.Program(), "ns-0001/grows")
			if pol := findPolicy(t, compile.Build(in), "ns-0001/grows"); pol.Rejected && !tracked.Rejected {
				t.Fatalf("pod %d applied in place, but with it the build rejects the policy (charged %d)", i, pol.Cost)
			}
		case compile.FallbackCost:
			fallbacks++
			if _, _, err := tr.Rebuild(in); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("pod %s not tracked: %s", pod.Name, f)
		}
	}
	pol := findPolicy(t, tr.Program(), "ns-0001/grows")
	if !pol.Rejected || pol.RejectedFor != compile.RejectedBudget {
		t.Fatalf("not rejected at 500 pods: rejected %v (%q), cost %d", pol.Rejected, pol.RejectedFor, pol.Cost)
	}
	t.Logf("%d of %d pods left to the build for the policy's budget", fallbacks, len(extra))
	for _, pod := range extra {
		if _, f := tr.ApplyPod(pod.Namespace+"/"+pod.Name, nil); f != compile.NoFallback {
			t.Fatalf("pod %s deletion not tracked: %s", pod.Name, f)
		}
	}
	in.Pods = base
	if p, _, err = tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	if pol := findPolicy(t, p, "ns-0001/grows"); pol.Rejected {
		t.Fatalf("still rejected once the pods left (cost %d): %v", pol.Cost, pol.Problems)
	}
}

// TestTrackerCostFallback: a NetworkPolicy change that might pass its
// budget is not tracked in place (FallbackCost), and the build rejects
// it; one that surely fits is tracked, and so is the same change once the
// budget is large enough. In a namespace where a policy waits for room in
// the namespace's budget, every change goes to the build.
func TestTrackerCostFallback(t *testing.T) {
	in := ct.Cluster(300, 10, 2)
	in.NodeName = "node-0"
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	attack := ct.CostAmplificationPolicy("ns-0001", "amp", "app-1", 2300)
	if f := tr.ApplyPolicy("ns-0001/amp", attack); f != compile.FallbackCost {
		t.Fatalf("the attack applied in place: fallback %q", f)
	}
	// Three peers of every pod: the build shares their set.
	if f := tr.ApplyPolicy("ns-0001/amp", ct.CostAmplificationPolicy("ns-0001", "amp", "app-1", 3)); f != compile.FallbackSharedSet {
		t.Fatalf("three peers selecting the same pods applied in place: fallback %q", f)
	}
	small := ct.CostAmplificationPolicy("ns-0001", "amp", "app-1", 1)
	if f := tr.ApplyPolicy("ns-0001/amp", small); f != compile.NoFallback {
		t.Fatalf("a small policy not tracked: %q", f)
	}

	in.Budgets = compile.Budgets{Policy: 2000, Namespace: 1000}
	in.Policies = append(in.Policies, namespacePolicy("ns-0002", "a", "app-1"), namespacePolicy("ns-0002", "b", "app-2"))
	p, _, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	if pol := findPolicy(t, p, "ns-0002/b"); pol.RejectedFor != compile.RejectedNamespaceBudget {
		t.Fatalf("ns-0002/b: rejected for %q, want the namespace's budget", pol.RejectedFor)
	}
	if f := tr.ApplyPolicy("ns-0002/a", nil); f != compile.FallbackCost {
		t.Errorf("deleting a policy of a namespace with a policy waiting for room applied in place: %q", f)
	}
	if f := tr.ApplyPolicy("ns-0003/c", namespacePolicy("ns-0003", "c", "app-1")); f != compile.NoFallback {
		t.Errorf("a policy of another namespace within its budgets not tracked: %q", f)
	}
}

// TestClusterPolicyBudget: a ClusterNetworkPolicy whose Accept rule has
// 200 pods peers, each selecting every pod, is charged for what it makes
// against Budgets.ClusterPolicy: over it, it is rejected, its Accept rule
// matching nothing and its Deny rule denying (fail closed), leaving no set
// behind; the tracker sends the same change to the build (FallbackCost).
// Under a budget it fits, it is compiled.
func TestClusterPolicyBudget(t *testing.T) {
	in := ct.Cluster(300, 10, 2)
	in.NodeName = "node-0"
	var peers []npav1beta1.ClusterNetworkPolicyEgressPeer
	for i := range 200 {
		peers = append(peers, ct.ToPods(ct.Sel(), ct.Expr(fmt.Sprintf("nope-%d", i), metav1.LabelSelectorOpDoesNotExist)))
	}
	cnp := ct.CNP("amp", "Admin", 5, ct.NamespacesSubject(ct.Sel("team", "t1")), ct.CNPEgress(
		ct.CNPRule("accept", "Accept", peers...), ct.CNPRule("deny", "Deny", ct.ToNetworks("192.0.2.0/24"))))
	clean := compile.Build(in)
	in.ClusterPolicies = []*npav1beta1.ClusterNetworkPolicy{cnp}
	in.Budgets = compile.Budgets{ClusterPolicy: 50000}
	p := compile.Build(in)
	cp := &p.ClusterPolicies[0]
	if !cp.Rejected || cp.RejectedFor != compile.RejectedBudget || cp.Cost != 50000 {
		t.Fatalf("not rejected for its budget: rejected %v (%q), cost %d", cp.Rejected, cp.RejectedFor, cp.Cost)
	}
	if a, d := cp.Egress[0], cp.Egress[1]; !a.Disabled || d.Action != compile.ActionDeny || !d.AllPeers {
		t.Errorf("not enforced fail-closed: accept disabled %v, deny %v all peers %v", a.Disabled, d.Action, d.AllPeers)
	}
	if members(p) != members(clean) || len(p.Selectors) != len(clean.Selectors) {
		t.Errorf("the rejected policy left sets behind: %d sets, %d without it", len(p.Selectors), len(clean.Selectors))
	}

	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.ClusterPolicies = nil
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	if f := tr.ApplyClusterPolicy("amp", cnp); f != compile.FallbackCost {
		t.Errorf("applied in place: fallback %q", f)
	}

	in.ClusterPolicies = []*npav1beta1.ClusterNetworkPolicy{cnp}
	in.Budgets.ClusterPolicy = 200000
	if cp := compile.Build(in).ClusterPolicies[0]; cp.Rejected {
		t.Errorf("rejected within its budget: cost %d, %v", cp.Cost, cp.Problems)
	}
}

// TestTrackerCostBoundFollowsNamespaces: the tracker bounds a namespace
// selector's peer by the pods of the namespaces it matches, not of the
// cluster: a policy of five such peers, each matching two namespaces of
// 2,000 pods, is tracked in place under a budget that every pod would
// pass, and the build admits it too.
func TestTrackerCostBoundFollowsNamespaces(t *testing.T) {
	in := ct.Cluster(2000, 0, 2)
	in.NodeName = "node-0"
	in.Budgets = compile.Budgets{Policy: 5000}
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	var peers []networkingv1.NetworkPolicyPeer
	for i := range 5 {
		peers = append(peers, ct.PodNSPeer(ct.Sel("app", fmt.Sprintf("app-%d", i)), ct.Sel("team", "t1")))
	}
	np := ct.NetPol("ns-0003", "teams", ct.Sel("app", "app-1"), ct.Ingress(ct.Peers(peers...)))
	if f := tr.ApplyPolicy("ns-0003/teams", np); f != compile.NoFallback {
		t.Errorf("not tracked in place: %q", f)
	}
	in.Policies = []*networkingv1.NetworkPolicy{np}
	if pol := findPolicy(t, compile.Build(in), "ns-0003/teams"); pol.Rejected {
		t.Errorf("the build rejects it: cost %d, %v", pol.Cost, pol.Problems)
	} else {
		t.Logf("charged %d of 5000", pol.Cost)
	}
}
