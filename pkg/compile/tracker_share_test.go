package compile_test

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestApplyPolicyEditsSharedSets: issue 43's churning policy (peers that
// each say something else and each select every pod, one set shared by
// content, at the real ShareMinMembers) is edited as its user would: its
// ports, then its podSelector so that no local pod is its subject (its
// chain goes, and with it the shared set it was the last user of), then
// back, and its metadata. Each edit keeps the peers and is applied by the tracker alone,
// and the ruleset equals the full build's after each. Deleting it, or
// dropping one of its peers, may change which peer names the set and is
// left to the build (FallbackSharedSet).
func TestApplyPolicyEditsSharedSets(t *testing.T) {
	const pods, peers = 400, 12
	in := ct.Cluster(pods, 30, 2)
	in.NodeName = "node-0"
	churn := ct.CostAmplificationPolicy("ns-0001", "churn", "app-1", peers)
	in.Policies = append(in.Policies, churn)
	tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid})
	if err != nil {
		t.Fatal(err)
	}
	prog, rs, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	if !usesSharedSet(prog, "ns-0001/churn") {
		t.Fatal("the churning policy's peers share no set")
	}
	shared := sharedPeerSetName(t, prog, "ns-0001/churn")
	if rs.Sets[shared] == nil {
		t.Fatalf("no set %s in the built ruleset", shared)
	}
	edit := func(what string, change func(np *networkingv1.NetworkPolicy), want compile.Fallback) {
		t.Helper()
		np := churn.DeepCopy()
		change(np)
		if f := tr.ApplyPolicy("ns-0001/churn", np); f != want {
			t.Fatalf("%s: fallback %q, want %q", what, f, want)
		}
		if want != compile.NoFallback {
			return
		}
		churn = np
		in.Policies[len(in.Policies)-1] = np
		full, err := compile.Render(compile.Build(in), compile.RenderConfig{Mode: compile.ModeHybrid})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(full, tr.Ruleset(), cmpopts.EquateEmpty(), cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
			t.Fatalf("%s: tracked ruleset differs from the full build (-full +tracked):\n%s", what, diff)
		}
	}
	for i, port := range []int32{81, 80, 8080} {
		p := intstr.FromInt32(port)
		edit("ports", func(np *networkingv1.NetworkPolicy) {
			np.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{{Port: &p}}
		}, compile.NoFallback)
		if i == 0 && tr.Ruleset().Sets[shared] == nil {
			t.Fatalf("the shared set %s went with a ports edit", shared)
		}
	}
	edit("no local subject", func(np *networkingv1.NetworkPolicy) { np.Spec.PodSelector = ct.Sel("app", "none") }, compile.NoFallback)
	if tr.Ruleset().Sets[shared] != nil {
		t.Fatalf("the shared set %s outlived its last user", shared)
	}
	edit("subjects again", func(np *networkingv1.NetworkPolicy) { np.Spec.PodSelector = ct.Sel("app", "app-1") }, compile.NoFallback)
	if s := tr.Ruleset().Sets[shared]; s == nil || len(s.Elements) == 0 {
		t.Fatalf("the shared set %s is not back, filled", shared)
	}
	edit("a peer dropped", func(np *networkingv1.NetworkPolicy) {
		np.Spec.Ingress[0].From = np.Spec.Ingress[0].From[1:]
	}, compile.FallbackSharedSet)
	edit("metadata only", func(np *networkingv1.NetworkPolicy) { np.Labels = map[string]string{"rev": "2"} }, compile.NoFallback)
	if f := tr.ApplyPolicy("ns-0001/churn", nil); f != compile.FallbackSharedSet {
		t.Fatalf("deleting the policy that names the shared set: fallback %q, want %q", f, compile.FallbackSharedSet)
	}
}

// TestApplyPolicyEditsOverBudget: issue 43's churning policy as the churn
// benchmark has it, past its budget (rejected, fail-closed: it isolates
// its pods and allows nothing), edited every 100 ms. The build rejects
// each version again; the tracker proves it without matching a pod (its
// peers' matching alone passes the budget) and applies the edit alone,
// the ruleset equal to the full build's; while the rejected policy
// compiles alike, the program does not lag (no refresh follows). A
// version that may fit goes to the build.
func TestApplyPolicyEditsOverBudget(t *testing.T) {
	in := ct.Cluster(400, 30, 2)
	in.NodeName = "node-0"
	in.Budgets = compile.Budgets{Policy: 5000}
	churn := ct.CostAmplificationPolicy("ns-0001", "churn", "app-1", 40)
	in.Policies = append(in.Policies, churn)
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prog, _, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	if !rejectedForBudget(prog, "ns-0001/churn") {
		t.Fatal("the churning policy is not rejected for its budget")
	}
	apply := func(np *networkingv1.NetworkPolicy, want compile.Fallback) {
		t.Helper()
		if f := tr.ApplyPolicy("ns-0001/churn", np); f != want {
			t.Fatalf("fallback %q, want %q", f, want)
		}
		if want != compile.NoFallback {
			return
		}
		in.Policies[len(in.Policies)-1] = np
		built := compile.Build(in)
		if !rejectedForBudget(built, "ns-0001/churn") {
			t.Fatal("the build admits the edited policy")
		}
		full, err := compile.Render(built, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(full, tr.Ruleset(), cmpopts.EquateEmpty(), cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
			t.Fatalf("tracked ruleset differs from the full build (-full +tracked):\n%s", diff)
		}
	}
	for _, port := range []int32{81, 80, 81} {
		np := churn.DeepCopy()
		p := intstr.FromInt32(port)
		np.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{{Port: &p}}
		apply(np, compile.NoFallback)
	}
	// Rejected before and after, alike: the program does not lag, and
	// needs no refresh (a full build).
	if tr.Stale() || tr.Program() != prog {
		t.Fatal("edits that compile to the same rejected policy made the program lag")
	}
	np := churn.DeepCopy()
	np.Spec.PodSelector = ct.Sel("app", "app-2")
	apply(np, compile.NoFallback)
	if !tr.Stale() {
		t.Fatal("the program does not lag a change of the policy's subjects")
	}
	// Ten peers: their matching alone fits the budget, and their sets'
	// members may not: the build decides.
	np = np.DeepCopy()
	np.Spec.Ingress[0].From = np.Spec.Ingress[0].From[:10]
	apply(np, compile.FallbackCost)
}

// sharedPeerSetName returns the IPv4 set name of the shared set a
// policy's first ingress rule uses.
func sharedPeerSetName(t *testing.T, p *compile.Program, key string) string {
	t.Helper()
	for i := range p.Policies {
		if pol := &p.Policies[i]; pol.Key == key {
			for _, sid := range pol.Ingress[0].Selectors {
				if s := &p.Selectors[sid]; s.Shared() {
					return compile.PeerSetName(s, true)
				}
			}
		}
	}
	t.Fatalf("%s uses no shared set", key)
	return ""
}
