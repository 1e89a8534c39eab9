package controller

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// These tests drive the sync loop with client-go's fake clientset: they are
// about the loop (ordering, publishing, retries), not about API behaviour,
// which tests/agent covers against a real API server.

// flakyNFT is a knftables Fake that can be told to fail transactions.
type flakyNFT struct {
	*knftables.Fake
	mu   sync.Mutex
	fail int
	runs int
}

func (f *flakyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs++
	if f.fail > 0 {
		f.fail--
		return errors.New("injected transaction failure")
	}
	return f.Fake.Run(ctx, tx)
}

func (f *flakyNFT) failNext(n int) {
	f.mu.Lock()
	f.fail = n
	f.mu.Unlock()
}

func (f *flakyNFT) dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Dump()
}

func testPod(ns, name, node, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func denyAll(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deny-all", ResourceVersion: "1"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
}

type harness struct {
	client *fake.Clientset
	nft    *flakyNFT
	eval   *queue.Evaluator
	ctrl   *Controller
	events *record.FakeRecorder
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{nft: &flakyNFT{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}, eval: &queue.Evaluator{}, events: record.NewFakeRecorder(10)}
	h.client = fake.NewClientset(objs...)
	syncer, err := sets.New(sets.Config{NFT: h.nft})
	if err != nil {
		t.Fatal(err)
	}
	h.ctrl, err = New(Config{Client: h.client, NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		Syncer: syncer, Evaluator: h.eval, Recorder: h.events, MinRetryDelay: 10 * time.Millisecond, MaxRetryDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.ctrl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if f() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestSyncsAfterCachesAndFollowsChanges(t *testing.T) {
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), testPod("y", "b", "n2", "10.0.2.1", nil))
	if h.eval.Program() != nil {
		// Nothing may be published before the first commit.
		if !h.ctrl.Ready() {
			t.Fatal("program published before the controller was ready")
		}
	}
	eventually(t, "first sync", h.ctrl.Ready)
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); !v.Allowed {
		t.Fatalf("no policy yet, but denied: %s", v.Reason())
	}
	ctx := context.Background()
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(ctx, denyAll("x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "policy programmed", func() bool {
		return strings.Contains(h.nft.dump(), "ingress-isolated-") && h.eval.Program() != nil && len(h.eval.Program().Policies) == 1
	})
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); v.Allowed {
		t.Fatalf("deny-all programmed, but allowed: %s", v.Reason())
	}
	if err := h.client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "deny-all", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "policy removed", func() bool {
		return !strings.Contains(h.nft.dump(), "ingress-isolated-") && len(h.eval.Program().Policies) == 0
	})
}

func TestFailedTransactionIsNotPublishedAndIsRetried(t *testing.T) {
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil))
	eventually(t, "first sync", h.ctrl.Ready)
	before := h.eval.Program()
	h.nft.failNext(2)
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), denyAll("x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// While transactions fail, the evaluator keeps the program the kernel has.
	eventually(t, "failures consumed", func() bool {
		h.nft.mu.Lock()
		defer h.nft.mu.Unlock()
		return h.nft.fail == 0
	})
	eventually(t, "retry commits the policy", func() bool {
		p := h.eval.Program()
		return p != before && len(p.Policies) == 1 && strings.Contains(h.nft.dump(), "ingress-isolated-")
	})
}

func TestInvalidPolicyIsReportedOnce(t *testing.T) {
	bad := denyAll("x")
	bad.Name = "bad"
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"192.168.0.0/16"}}}}}}
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), bad)
	eventually(t, "first sync", h.ctrl.Ready)
	select {
	case e := <-h.events.Events:
		if !strings.Contains(e, "InvalidNetworkPolicy") || !strings.Contains(e, "strict subset") {
			t.Errorf("event %q does not explain the problem", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the invalid policy")
	}
	// An unrelated change must not repeat the event.
	if _, err := h.client.CoreV1().Pods("x").Create(context.Background(), testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod programmed", func() bool { _, ok := h.eval.Program().PodByKey("x/b"); return ok })
	select {
	case e := <-h.events.Events:
		t.Errorf("event repeated: %s", e)
	case <-time.After(200 * time.Millisecond):
	}
}
