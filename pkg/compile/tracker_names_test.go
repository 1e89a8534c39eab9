package compile_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestTrackerInAnotherNameFormat: the tracker knows nothing of how names
// are made. With the default name format and with another one
// (export_test.go), after every pod, NetworkPolicy and
// ClusterNetworkPolicy change of random sequences, the tracked ruleset
// (what the renderer records on its objects included) equals the full
// build's.
func TestTrackerInAnotherNameFormat(t *testing.T) {
	for _, format := range []string{"default", "test"} {
		t.Run(format, func(t *testing.T) {
			if format == "test" {
				compile.UseTestNameFormat(t)
			}
			for _, cfg := range []compile.RenderConfig{{Mode: compile.ModeHybrid}, {Mode: compile.ModeKernel, DenyLogGroup: 3}} {
				for seed := uint64(1); seed <= 3; seed++ {
					trackRandomChanges(t, cfg, seed, 40)
				}
			}
		})
	}
}

// changeWorld is the objects a random sequence changes: Cluster's, with
// ClusterNetworkPolicies whose combinations have tier-skip sets.
type changeWorld struct {
	r        *rand.Rand
	in       compile.Input
	pols     []*networkingv1.NetworkPolicy
	cnps     []*npav1beta1.ClusterNetworkPolicy
	gone     []*corev1.Pod
	nextAddr int
}

func newChangeWorld(seed uint64) *changeWorld {
	in := ct.Cluster(120, 12, 3)
	in.NodeName = "node-0"
	cnps := append(ct.DevCNPs(),
		ct.CNP("no-db-egress", "Admin", 20, ct.PodsSubject(ct.Sel("env", "dev"), ct.Sel("tier", "web")),
			ct.CNPEgress(ct.CNPRule("to-db", "Deny", ct.ToPods(ct.Sel(), ct.Sel("tier", "db"))),
				ct.CNPRule("to-net", "Accept", ct.ToNetworks("192.0.2.0/24")).On(ct.Proto("TCP", 443)))),
		ct.CNP("api-from-web", "Baseline", 30, ct.PodsSubject(ct.Sel(), ct.Sel("tier", "api")),
			ct.CNPIngress(ct.CNPRule("web", "Accept", ct.ToPods(ct.Sel(), ct.Sel("tier", "web"))).On(ct.DestinationNamedPort("http")))))
	in.ClusterPolicies = slices.Clone(cnps)
	return &changeWorld{r: rand.New(rand.NewPCG(seed, 26)), in: in, pols: slices.Clone(in.Policies), cnps: cnps}
}

// change makes one random change and applies it to the tracker; it
// returns what it did and the tracker's answer.
func (w *changeWorld) change(tr *compile.Tracker) (string, compile.Fallback) {
	switch x := w.r.IntN(10); {
	case x < 2:
		np := w.pols[w.r.IntN(len(w.pols))]
		key := np.Namespace + "/" + np.Name
		if i := slices.Index(w.in.Policies, np); i >= 0 {
			w.in.Policies = slices.Delete(w.in.Policies, i, i+1)
			return "delete policy " + key, tr.ApplyPolicy(key, nil)
		}
		w.in.Policies = append(w.in.Policies, np)
		return "add policy " + key, tr.ApplyPolicy(key, np)
	case x < 4:
		cnp := w.cnps[w.r.IntN(len(w.cnps))]
		if i := slices.Index(w.in.ClusterPolicies, cnp); i >= 0 {
			w.in.ClusterPolicies = slices.Delete(w.in.ClusterPolicies, i, i+1)
			return "delete cluster policy " + cnp.Name, tr.ApplyClusterPolicy(cnp.Name, nil)
		}
		w.in.ClusterPolicies = append(w.in.ClusterPolicies, cnp)
		return "add cluster policy " + cnp.Name, tr.ApplyClusterPolicy(cnp.Name, cnp)
	}
	return w.podChange(tr)
}

// podChange deletes, brings back, relabels or readdresses a pod.
func (w *changeWorld) podChange(tr *compile.Tracker) (string, compile.Fallback) {
	if len(w.gone) > 0 && w.r.IntN(4) == 0 {
		p := w.gone[len(w.gone)-1]
		w.gone = w.gone[:len(w.gone)-1]
		w.in.Pods = append(w.in.Pods, p)
		_, f := tr.ApplyPod(p.Namespace+"/"+p.Name, p)
		return "add pod " + p.Name, f
	}
	i := w.r.IntN(len(w.in.Pods))
	p := w.in.Pods[i]
	key := p.Namespace + "/" + p.Name
	if w.r.IntN(3) == 0 {
		w.in.Pods = slices.Delete(w.in.Pods, i, i+1)
		w.gone = append(w.gone, p)
		_, f := tr.ApplyPod(key, nil)
		return "delete pod " + key, f
	}
	p = p.DeepCopy()
	what := "relabel pod "
	if w.r.IntN(2) == 0 {
		p.Labels["tier"] = []string{"web", "api", "db", "cache"}[w.r.IntN(4)]
		p.Labels["app"] = fmt.Sprintf("app-%d", w.r.IntN(20))
	} else {
		w.nextAddr++
		ip := fmt.Sprintf("10.99.%d.%d", w.nextAddr/250, w.nextAddr%250+1)
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		what = "readdress pod "
	}
	w.in.Pods[i] = p
	_, f := tr.ApplyPod(key, p)
	return what + key, f
}

// trackRandomChanges applies a random sequence of changes through a
// tracker, rebuilding where it falls back, and compares the tracked
// ruleset with the full build's after each.
func trackRandomChanges(t *testing.T, cfg compile.RenderConfig, seed uint64, steps int) {
	t.Helper()
	w := newChangeWorld(seed)
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Rebuild(w.in); err != nil {
		t.Fatal(err)
	}
	tracked := 0
	for step := 0; step < steps; step++ {
		what, f := w.change(tr)
		if f == compile.NoFallback {
			tracked++
		} else if _, _, err := tr.Rebuild(w.in); err != nil {
			t.Fatal(err)
		}
		want, err := compile.Render(compile.Build(w.in), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(want, tr.Ruleset()) {
			continue
		}
		if diff := cmp.Diff(want, tr.Ruleset(), cmpopts.EquateEmpty(), cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
			t.Fatalf("mode %s seed %d step %d (%s, fallback %q): tracked ruleset differs from the full build (-full +tracked):\n%s",
				cfg.Mode, seed, step, what, f, diff)
		}
	}
	if tracked < steps/2 {
		t.Errorf("mode %s seed %d: %d of %d changes tracked: the test exercises the rebuild", cfg.Mode, seed, tracked, steps)
	}
}
