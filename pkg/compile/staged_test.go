package compile_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

func TestStagedValues(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "True": false, "TRUE": false, "yes": false, "1": false, "": false, "false": false, " true": false} {
		np := ct.NetPol("x", "p", ct.Sel())
		np.Annotations = map[string]string{compile.StagedAnnotation: v}
		if got := compile.Staged(np); got != want {
			t.Errorf("Staged with %s=%q: %v, want %v", compile.StagedAnnotation, v, got, want)
		}
	}
	if compile.Staged(ct.NetPol("x", "p", ct.Sel())) {
		t.Error("Staged without annotations: true")
	}
	if !compile.NetworkPolicyStaged(ct.NetPol("x", "p", ct.Sel()), true) {
		t.Error("NetworkPolicyStaged in a staged namespace: false")
	}
}

// stagedInput is a cluster whose every policy isolates or denies one pod
// of namespace z's view: each staged one, if it were enforced, would deny
// what its probe tries (stagedCases).
func stagedInput() compile.Input {
	annotated := func(o metav1.Object, v string) {
		o.SetAnnotations(map[string]string{compile.StagedAnnotation: v, "other": "true"})
	}
	ns := func(name, staged string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{compile.NamespaceNameLabel: name}}}
		if staged != "" {
			annotated(n, staged)
		}
		return n
	}
	in := compile.Input{Namespaces: []*corev1.Namespace{ns("x", ""), ns("y", "true"), ns("z", ""), ns("w", "false")}}
	for i, key := range []string{"x/a", "x/b", "y/a", "y/b", "z/a", "z/b", "z/c", "w/a"} {
		nsName, name, _ := strings.Cut(key, "/")
		ip := netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: name, Labels: map[string]string{"pod": name}},
			Spec:       corev1.PodSpec{NodeName: "node-1"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}},
		})
	}
	denyIn := ct.Types(ct.PIn)
	stagedNP := ct.NetPol("x", "deny-a", ct.Sel("pod", "a"), denyIn)
	annotated(stagedNP, "true")
	notStaged := ct.NetPol("x", "deny-b", ct.Sel("pod", "b"), denyIn)
	annotated(notStaged, "True")
	in.Policies = ct.List(stagedNP, notStaged,
		ct.NetPol("y", "deny-a", ct.Sel("pod", "a"), denyIn), // staged by its namespace
		ct.NetPol("w", "deny-a", ct.Sel("pod", "a"), denyIn)) // its namespace's "false" stages nothing
	admin := ct.CNP("admin-deny", "Admin", 5, ct.PodsSubject(ct.Sel(ct.NSName, "z"), ct.Sel("pod", "a")),
		ct.CNPIngress(ct.CNPRule("all", "Deny", ct.ToNamespaces(ct.Sel()))))
	annotated(admin, "true")
	baseline := ct.CNP("baseline-deny", "Baseline", 5, ct.PodsSubject(ct.Sel(ct.NSName, "z"), ct.Sel("pod", "b")),
		ct.CNPIngress(ct.CNPRule("all", "Deny", ct.ToNamespaces(ct.Sel()))))
	annotated(baseline, "true")
	// A staged namespace stages its NetworkPolicies, not the cluster
	// policies whose subjects are in it.
	inStagedNS := ct.CNP("admin-deny-y-b", "Admin", 5, ct.PodsSubject(ct.Sel(ct.NSName, "y"), ct.Sel("pod", "b")),
		ct.CNPIngress(ct.CNPRule("all", "Deny", ct.ToNamespaces(ct.Sel()))))
	in.ClusterPolicies = append(in.ClusterPolicies, admin, baseline, inStagedNS)
	return in
}

// stagedCases are connections from z/c and their verdicts with staged
// policies left out and enforced.
var stagedCases = []struct {
	to, why        string
	allowed, would bool
}{
	{"x/a", "a staged NetworkPolicy", true, false},
	{"x/b", `a NetworkPolicy annotated "True"`, false, false},
	{"y/a", "a NetworkPolicy of a staged namespace", true, false},
	{"y/b", "a ClusterNetworkPolicy whose subject is in a staged namespace", false, false},
	{"z/a", "a staged Admin ClusterNetworkPolicy", true, false},
	{"z/b", "a staged Baseline ClusterNetworkPolicy", true, false},
	{"w/a", `a NetworkPolicy of a namespace annotated "false"`, false, false},
}

// TestStagedPoliciesDoNotExist: a program leaves out every staged policy
// (its verdicts are those of the input without them), and with
// EnforceStaged enforces them all.
func TestStagedPoliciesDoNotExist(t *testing.T) {
	in := stagedInput()
	addr := func(p *compile.Program, key string) netip.Addr {
		for i := range p.Pods {
			if p.Pods[i].Key == key {
				return p.Pods[i].IPs[0]
			}
		}
		t.Fatalf("no pod %s", key)
		return netip.Addr{}
	}
	would := in
	would.EnforceStaged = true
	for _, c := range []struct {
		name string
		prog *compile.Program
	}{
		{"Build", compile.Build(in)},
		{"BuildCached", compile.BuildCached(in, compile.NewCache())},
		{"EnforceStaged", compile.Build(would)},
	} {
		for _, sc := range stagedCases {
			want := sc.allowed
			if c.name == "EnforceStaged" {
				want = sc.would
			}
			v := evaluate.Evaluate(c.prog, addr(c.prog, "z/c"), addr(c.prog, sc.to), compile.ProtoTCP, 80)
			if v.Allowed != want {
				t.Errorf("%s: z/c -> %s (%s): %s (%s), want %s", c.name, sc.to, sc.why, ct.VerdictWord(v.Allowed), v.Reason(), ct.VerdictWord(want))
			}
		}
	}

	// Staged policies do not exist: the program is the one of the input
	// without them (the Source aside, which keeps every object).
	without := in
	without.Policies = ct.List(in.Policies[1], in.Policies[3])
	without.ClusterPolicies = in.ClusterPolicies[2:]
	got, want := compile.Build(in), compile.Build(without)
	if len(got.Source.Policies) != 4 || len(got.Source.ClusterPolicies) != 3 {
		t.Errorf("the program's Source lost objects: %d policies, %d cluster policies", len(got.Source.Policies), len(got.Source.ClusterPolicies))
	}
	got.Source, want.Source = compile.Input{}, compile.Input{}
	for _, cfg := range []compile.RenderConfig{{Mode: compile.ModeHybrid}, {Mode: compile.ModeQueue}} {
		var dumps [2]string
		for i, p := range []*compile.Program{want, got} {
			rs, err := compile.Render(p, cfg)
			if err != nil {
				t.Fatal(err)
			}
			dumps[i] = renderDump(t, rs)
		}
		if diff := cmp.Diff(dumps[0], dumps[1]); diff != "" {
			t.Errorf("%s: the ruleset with staged policies differs from the one without them (-without +staged):\n%s", cfg.Mode, diff)
		}
	}
}

// TestTrackerStagedToggles: a policy change that only stages or unstages
// a policy is tracked, and the tracked ruleset is the full build's.
func TestTrackerStagedToggles(t *testing.T) {
	for _, enforce := range []bool{false, true} {
		in := stagedInput()
		in.EnforceStaged = enforce
		tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := tr.Rebuild(in); err != nil {
			t.Fatal(err)
		}
		check := func(what string) {
			t.Helper()
			want, err := compile.Render(compile.Build(in), compile.RenderConfig{Mode: compile.ModeHybrid})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, tr.Ruleset(), cmpopts.EquateEmpty(), cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
				t.Fatalf("EnforceStaged %v, %s: tracked ruleset differs from the full build (-full +tracked):\n%s", enforce, what, diff)
			}
		}
		for round := 0; round < 2; round++ {
			for i, np := range in.Policies {
				c := np.DeepCopy()
				c.Annotations = map[string]string{compile.StagedAnnotation: map[bool]string{true: "true", false: "no"}[!compile.Staged(np)]}
				pols := append(in.Policies[:i:i], c)
				in.Policies = append(pols, in.Policies[i+1:]...)
				if f := tr.ApplyPolicy(c.Namespace+"/"+c.Name, c); f != compile.NoFallback {
					t.Fatalf("staging %s: fallback %s", c.Name, f)
				}
				check("NetworkPolicy " + c.Namespace + "/" + c.Name + " toggled")
			}
			for i, cnp := range in.ClusterPolicies {
				c := cnp.DeepCopy()
				c.Annotations = map[string]string{compile.StagedAnnotation: map[bool]string{true: "true", false: ""}[!compile.Staged(cnp)]}
				cnps := append(in.ClusterPolicies[:i:i], c)
				in.ClusterPolicies = append(cnps, in.ClusterPolicies[i+1:]...)
				if f := tr.ApplyClusterPolicy(c.Name, c); f != compile.NoFallback {
					t.Fatalf("staging %s: fallback %s", c.Name, f)
				}
				check("ClusterNetworkPolicy " + c.Name + " toggled")
			}
		}
	}
}
