package controller

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// TestPolicyChangesGoThroughTheTracker adds, changes and deletes a
// NetworkPolicy and checks after each step that the table the syncs wrote
// equals a full sync of the full build of the same objects, that the
// change was a "policies" sync (not a rebuild), and that the fingerprint of
// the synced inputs follows.
func TestPolicyChangesGoThroughTheTracker(t *testing.T) {
	h := start(t,
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
		testPod("x", "b", "n1", "10.0.1.2", map[string]string{"app": "db"}),
		testPod("y", "c", "n2", "10.0.2.1", map[string]string{"app": "client"}))
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	ctx := context.Background()
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web", ResourceVersion: "1"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}, NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	step := func(what string, change func() error, programmed func(dump string) bool) {
		t.Helper()
		policyStep(t, h, what, change, programmed)
	}
	pols := h.client.NetworkingV1().NetworkPolicies("x")
	step("policy added", func() error {
		_, err := pols.Create(ctx, np, metav1.CreateOptions{})
		return err
	}, func(dump string) bool { return strings.Contains(dump, "ingress-x/web") })
	step("policy changed", func() error {
		np = np.DeepCopy()
		np.ResourceVersion = "2"
		np.Spec.PodSelector.MatchLabels = map[string]string{"app": "db"}
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels = map[string]string{"app": "web"}
		_, err := pols.Update(ctx, np, metav1.UpdateOptions{})
		return err
	}, func(dump string) bool { return strings.Contains(dump, "pods with app=web in all namespaces") })
	step("policy deleted", func() error {
		return pols.Delete(ctx, "web", metav1.DeleteOptions{})
	}, func(dump string) bool { return !strings.Contains(dump, "ingress-x/web") })
	eventually(t, "program refreshed", func() bool { return len(h.eval.Program().Policies) == 0 })
}

// policySyncs counts the "policies" syncs: changes the tracker applied.
func policySyncs(t *testing.T, h *harness) uint64 {
	t.Helper()
	return histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "policies")
}

// policyStep makes a policy change and checks that it was a "policies"
// sync (not a rebuild), that the table the syncs wrote equals a full sync
// of the full build of the same objects, and that the fingerprint of the
// synced inputs follows.
func policyStep(t *testing.T, h *harness, what string, change func() error, programmed func(dump string) bool) {
	t.Helper()
	trackedStep(t, h, "policies", what, change, programmed)
}

// trackedStep is policyStep for a change that the tracker applies in a
// sync of the kind given ("policies", "namespaces").
func trackedStep(t *testing.T, h *harness, kind, what string, change func() error, programmed func(dump string) bool) {
	t.Helper()
	ctx := context.Background()
	syncs := func() uint64 { return histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, kind) }
	before := syncs()
	if err := change(); err != nil {
		t.Fatal(err)
	}
	eventually(t, what, func() bool { return programmed(h.nft.dump()) && syncs() > before })
	in, err := h.ctrl.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.ctrl.SyncedInputs(), InputsFingerprint(in); got != want {
		t.Errorf("%s: synced inputs %x, want %x", what, got, want)
	}
	rs, err := compile.Render(compile.Build(in), h.ctrl.cfg.Render)
	if err != nil {
		t.Fatal(err)
	}
	fresh := knftables.NewFake(knftables.InetFamily, compile.TableName)
	syncer, err := sets.New(sets.Config{NFT: fresh})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := syncer.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if got, want := sortedElements(h.nft.dump()), sortedElements(fresh.Dump()); got != want {
		t.Fatalf("%s: the table differs from a full sync of the full build:\n--- synced\n%s\n--- full\n%s", what, got, want)
	}
	// The gauges count what the kernel has, not the lagging program.
	for _, g := range []struct {
		name  string
		gauge prometheus.Gauge
		want  int
	}{
		{"nftpolicy_programmed_policies", h.ctrl.cfg.Metrics.ProgrammedPolicies, len(in.Policies)},
		{"nftpolicy_programmed_cluster_policies", h.ctrl.cfg.Metrics.ProgrammedClusterPolicies, len(in.ClusterPolicies)},
	} {
		var m dto.Metric
		if err := g.gauge.Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetGauge().GetValue(); got != float64(g.want) {
			t.Errorf("%s: %s = %v, want %d", what, g.name, got, g.want)
		}
	}
}

// sortedElements puts a table dump's element lines in order: the fake
// lists a map's elements in insertion order, which the order of syncs
// decides; the kernel's lookups do not depend on it. Rules keep their order.
func sortedElements(dump string) string {
	var other, elems []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "add element ") {
			elems = append(elems, l)
		} else {
			other = append(other, l)
		}
	}
	slices.Sort(elems)
	return strings.Join(append(other, elems...), "\n")
}
