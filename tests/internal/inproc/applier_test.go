package inproc

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// TestHarnessRunsTheAgentsApplier: what the harness applies goes through
// the agent's controller.Applier: the program it publishes is the
// Applier's, pod changes go through the Applier's tracker (whose derived
// program is then the one in force) and reach the agent's pod hooks
// before that program is published, and the program hooks run after each
// publication with the program replaced.
func TestHarnessRunsTheAgentsApplier(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace and its nftables table")
	}
	lab, err := netlab.New(netlab.Config{Prefix: netlab.RandomPrefix("iprt"), Nodes: []netlab.NodeSpec{{Name: "n1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	nodeIPs, err := lab.IPs(netlab.Node("n1"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(lab, "n1", compile.RenderConfig{Mode: compile.ModeKernel}, Quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	type publication struct{ old, cur *compile.Program }
	var published []publication
	var podsApplied []string
	a.Hooks().OnProgram(func(old, cur *compile.Program) { published = append(published, publication{old, cur}) })
	a.Hooks().OnPodApplied(func(key string, pod *compile.PodInfo) {
		if _, known := a.Evaluator().Program().PodByKey(key); pod == nil && !known {
			t.Errorf("the pod hook saw %s removed after a program without it was published", key)
		}
		podsApplied = append(podsApplied, key)
	})

	ctx := context.Background()
	before := applierInput(nodeIPs, "a", "b")
	first := compile.Build(before)
	if _, err := a.Apply(ctx, first, nil, false); err != nil {
		t.Fatal(err)
	}
	if got := a.Applier().Program(); got != first || a.Evaluator().Program() != first || a.Program != first {
		t.Fatalf("after Apply the Applier's program is %p, the evaluator's %p, the harness's %p; want the program applied, %p",
			got, a.Evaluator().Program(), a.Program, first)
	}
	after := applierInput(nodeIPs, "a")
	tracked, rebuilt, err := a.ApplyPodEvents(ctx, before, after, compile.Build(after))
	if err != nil {
		t.Fatal(err)
	}
	if tracked != 1 || rebuilt != 0 {
		t.Fatalf("ApplyPodEvents: %d changes tracked, %d rebuilt; want the removal of x/b tracked", tracked, rebuilt)
	}
	if !slices.Equal(podsApplied, []string{"x/b"}) {
		t.Errorf("the agent's pod hooks saw %v, want [x/b]", podsApplied)
	}
	cur := a.Evaluator().Program()
	if tr := a.Applier().Tracker(); tr.Program() != cur || a.Applier().Program() != cur || a.Program != cur {
		t.Errorf("after the pod change the program in force (%p) is not the one the Applier's tracker derived (%p) and published (%p)",
			cur, tr.Program(), a.Applier().Program())
	}
	if _, ok := cur.PodByKey("x/b"); ok {
		t.Errorf("x/b is still in the program in force")
	}
	want := []publication{{nil, first}, {first, cur}}
	if !slices.Equal(published, want) {
		t.Errorf("the program hooks saw %v, want %v", published, want)
	}
}

// applierInput is node n1's input: the pods of namespace x named, on n1,
// and a policy isolating them.
func applierInput(nodeIPs []netip.Addr, pods ...string) compile.Input {
	in := compile.Input{NodeName: "n1", NodeIPs: nodeIPs,
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}}},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny", ResourceVersion: "1"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}}}
	for i, name := range pods {
		ip := netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)})
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, UID: types.UID("uid-x-" + name), ResourceVersion: "1", Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{NodeName: "n1"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}},
		})
	}
	return in
}
