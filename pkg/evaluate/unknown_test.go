package evaluate_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

type unknownRecorder struct {
	mu      sync.Mutex
	results []string
}

func (r *unknownRecorder) ObserveUnknownPod(result string, _ time.Duration) {
	r.mu.Lock()
	r.results = append(r.results, result)
	r.mu.Unlock()
}

// unknownInput: x/a (10.244.1.10) is known, x/new (10.244.1.20) only once
// added; a default-deny ingress policy in x isolates every pod of x.
func unknownInput(withNew bool) compile.Input {
	in := compile.Input{
		NodeName:   "n1",
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x"}}},
		Pods:       []*corev1.Pod{mkPod("x/a", []string{"10.244.1.10"})},
		Nodes: []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
			Spec:   corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}}}}},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}},
	}
	if withNew {
		in.Pods = append(in.Pods, mkPod("x/new", []string{"10.244.1.20"}))
	}
	return in
}

func conn(src, dst string) evaluate.Conn {
	return evaluate.Conn{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: compile.ProtoTCP, Port: 80}
}

func TestUnknownPodWaitsForProgram(t *testing.T) {
	rec := &unknownRecorder{}
	e := &evaluate.Evaluator{UnknownPodWait: time.Minute, UnknownPods: rec}
	e.Swap(compile.Build(unknownInput(false)))

	toNew := conn("10.244.1.10", "10.244.1.20")
	if !e.Unknown(toNew) {
		t.Fatal("a connection to an unknown address in the pod range is not Unknown")
	}
	for _, p := range []evaluate.Conn{conn("10.244.1.10", "192.168.0.1"), conn("192.168.0.1", "10.244.1.10"), conn("10.244.1.10", "10.9.9.9")} {
		if e.Unknown(p) {
			t.Errorf("%v -> %v Unknown: both ends are known or outside the pod ranges", p.Src, p.Dst)
		}
	}
	// Not waited for (the runtime held too many): decided as at the bound, fail closed.
	if allow, reason := e.Decide(toNew); allow || reason != evaluate.ReasonUnknownPod {
		t.Errorf("Decide on an unknown address: %v %q, want a fail-closed drop", allow, reason)
	}

	type res struct {
		allow  bool
		reason string
	}
	done := make(chan res, 1)
	go func() {
		a, r := e.DecideHeld(context.Background(), toNew)
		done <- res{a, r}
	}()
	select {
	case r := <-done:
		t.Fatalf("decided before the pod was programmed: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	e.Swap(compile.Build(unknownInput(true)))
	var r res
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not decided after the pod was programmed")
	}
	// x/deny isolates x/new for ingress: the full program denies.
	if r.allow || r.reason == evaluate.ReasonUnknownPod {
		t.Errorf("after programming: %+v, want denied by x/deny", r)
	}
	if e.Unknown(toNew) {
		t.Error("a programmed pod is still Unknown")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.results) != 2 || rec.results[0] != evaluate.UnknownPodTimeoutDropped || rec.results[1] != evaluate.UnknownPodProgrammed {
		t.Errorf("observed %v", rec.results)
	}
}

// TestUnknownPodBound: at the wait's bound a connection to an unknown pod
// address (its source known) gets the fail mode's verdict; one from an
// unknown source is dropped whatever the fail mode (issue 43, item 4: an
// address a pod took was admitted by --fail-open).
func TestUnknownPodBound(t *testing.T) {
	for _, open := range []bool{false, true} {
		for _, c := range []struct {
			conn       evaluate.Conn
			allow      bool
			reason     string
			observed   string
			unknownSrc bool
		}{
			{conn: conn("10.244.1.10", "10.244.1.20"), allow: open, reason: evaluate.ReasonUnknownPod},
			{conn: conn("10.244.1.20", "10.244.1.10"), unknownSrc: true, reason: evaluate.ReasonUnknownPod},
		} {
			if c.unknownSrc && open {
				c.reason = evaluate.ReasonUnknownSource
			}
			rec := &unknownRecorder{}
			e := &evaluate.Evaluator{UnknownPodWait: 30 * time.Millisecond, UnknownPods: rec, OpenWithoutProgram: open}
			e.Swap(compile.Build(unknownInput(false)))
			// A program without the pod changes nothing: still waiting.
			go e.Swap(compile.Build(unknownInput(false)))
			allow, reason := e.DecideHeld(context.Background(), c.conn)
			if allow != c.allow || reason != c.reason {
				t.Errorf("failOpen=%v %v -> %v: at the bound %v %q, want %v %q", open, c.conn.Src, c.conn.Dst, allow, reason, c.allow, c.reason)
			}
			want := evaluate.UnknownPodTimeoutDropped
			if c.allow {
				want = evaluate.UnknownPodTimeoutAllowed
			}
			if len(rec.results) != 1 || rec.results[0] != want {
				t.Errorf("failOpen=%v %v -> %v: observed %v, want [%s]", open, c.conn.Src, c.conn.Dst, rec.results, want)
			}
		}
	}
}
