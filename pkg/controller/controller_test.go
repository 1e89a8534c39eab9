package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// These tests drive the sync loop with client-go's fake clientset: they are
// about the loop (ordering, publishing, retries), not about API behaviour,
// which tests/agent covers against a real API server.

// flakyNFT is a knftables Fake that can be told to fail transactions.
type flakyNFT struct {
	*knftables.Fake
	mu     sync.Mutex
	fail   int
	runs   int
	failed int
	// onFail, when set, runs (under mu) at each injected failure.
	onFail func()
	// onRun, when set, runs (under mu) before each transaction that is
	// not failed on purpose.
	onRun func()
}

func (f *flakyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs++
	if f.fail > 0 {
		f.fail--
		f.failed++
		if f.onFail != nil {
			f.onFail()
		}
		return errors.New("injected transaction failure")
	}
	if f.onRun != nil {
		f.onRun()
	}
	return f.Fake.Run(ctx, tx)
}

func (f *flakyNFT) failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
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
	eval   *evaluate.Evaluator
	ctrl   *Controller
	events *record.FakeRecorder
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	return startWith(t, nil, objs...)
}

// startWith is start with a configuration that set changes.
func startWith(t *testing.T, set func(*Config), objs ...runtime.Object) *harness {
	t.Helper()
	h := newHarness(t, set, objs...)
	h.run(t)
	return h
}

// newHarness is startWith without starting the controller (run).
func newHarness(t *testing.T, set func(*Config), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{nft: &flakyNFT{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}, eval: &evaluate.Evaluator{}, events: record.NewFakeRecorder(10)}
	h.client = fake.NewClientset(objs...)
	syncer, err := sets.New(sets.Config{NFT: h.nft})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Client: h.client, NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		Syncer: syncer, Evaluator: h.eval, Recorder: h.events, MinRetryDelay: 10 * time.Millisecond, MaxRetryDelay: 20 * time.Millisecond}
	if set != nil {
		set(&cfg)
	}
	h.ctrl, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// run starts the controller; it stops at the end of the test.
func (h *harness) run(t *testing.T) {
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
}

// counterValue reads a counter (or a gauge) without a registry.
func counterValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// expectEvent waits for the next Event and checks that it says each of want.
func (h *harness) expectEvent(t *testing.T, want ...string) {
	t.Helper()
	select {
	case e := <-h.events.Events:
		for _, w := range want {
			if !strings.Contains(e, w) {
				t.Errorf("event %q does not say %q", e, w)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no event saying %q", want)
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	if !poll(f) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll reports whether f became true within 10 seconds.
func poll(f func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if f() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func TestSyncsAfterCachesAndFollowsChanges(t *testing.T) {
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), testPod("y", "b", "n2", "10.0.2.1", nil))
	// Nothing may be published before the first commit. The controller
	// turns ready before it hands the program to the evaluator, so reading
	// the evaluator first and readiness second never sees a program without
	// readiness; and a program is only ever seen with the table committed.
	eventually(t, "first sync", func() bool {
		published := h.eval.Program() != nil
		ready := h.ctrl.Ready()
		if published && !ready {
			t.Fatal("program published before the controller was ready")
		}
		if published && !strings.Contains(h.nft.dump(), "table inet "+compile.TableName) {
			t.Fatal("program published before the table was committed")
		}
		return published
	})
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
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	before := h.eval.Program()
	if got := h.ctrl.Program(); got != before {
		t.Fatalf("controller's program %p, evaluator's %p: want the same committed program", got, before)
	}
	failuresBefore := counterValue(t, h.ctrl.cfg.Metrics.SyncFailures)
	// At each failed transaction (the fake's lock held, so the loop is inside
	// the sync), the published program must still be the committed one.
	var changed []string
	h.nft.mu.Lock()
	h.nft.onFail = func() {
		if p := h.eval.Program(); p != before {
			changed = append(changed, fmt.Sprintf("evaluator has %p, want %p", p, before))
		}
		if p := h.ctrl.Program(); p != before {
			changed = append(changed, fmt.Sprintf("controller has %p, want %p", p, before))
		}
	}
	h.nft.mu.Unlock()
	h.nft.failNext(1 << 30) // until told otherwise
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), denyAll("x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Several retries fail; meanwhile the evaluator keeps the program the
	// kernel has, which does not isolate x/a.
	eventually(t, "three failed transactions", func() bool { return h.nft.failures() >= 3 })
	for _, p := range []*compile.Program{h.eval.Program(), h.ctrl.Program()} {
		if p != before || len(p.Policies) != 0 {
			t.Fatalf("while transactions fail, the published program changed (%d policies)", len(p.Policies))
		}
	}
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); !v.Allowed {
		t.Fatalf("the uncommitted deny-all decides already: %s", v.Reason())
	}
	if strings.Contains(h.nft.dump(), "ingress-isolated-") {
		t.Fatal("a failed transaction changed the table")
	}
	if got := counterValue(t, h.ctrl.cfg.Metrics.SyncFailures) - failuresBefore; got < 3 {
		t.Errorf("nftpolicy_sync_failures_total grew by %v, want at least 3", got)
	}
	h.nft.failNext(0)
	eventually(t, "retry commits the policy", func() bool {
		p := h.eval.Program()
		return p != before && len(p.Policies) == 1 && strings.Contains(h.nft.dump(), "ingress-isolated-")
	})
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); v.Allowed {
		t.Fatalf("deny-all committed, but allowed: %s", v.Reason())
	}
	h.nft.mu.Lock()
	defer h.nft.mu.Unlock()
	if len(changed) > 0 {
		t.Errorf("published program changed during failed transactions: %s", strings.Join(changed, "; "))
	}
}

func TestInvalidPolicyIsReportedOnce(t *testing.T) {
	bad := denyAll("x")
	bad.Name = "bad"
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"192.168.0.0/16"}}}}}}
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), bad)
	eventually(t, "first sync", h.ctrl.Ready)
	h.expectEvent(t, "InvalidNetworkPolicy", "strict subset")
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

// TestTooLargePolicyIsRejected: a NetworkPolicy over compile.MaxPolicyCost
// is reported (Warning Event PolicyTooLarge, nftpolicy_rejected_policies,
// nftpolicy_policies_rejected_total) and enforced fail-closed: its pod is
// isolated with nothing allowed, while a policy next to it allows as
// written.
func TestTooLargePolicyIsRejected(t *testing.T) {
	huge := compiletest.HugeExceptPolicy("x", "huge", "a", compile.MaxPolicyCost, 80)
	huge.ResourceVersion = "1"
	allowB := denyAll("x")
	allowB.Name = "allow-b"
	allowB.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}
	allowB.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "a"}),
		testPod("x", "b", "n1", "10.0.1.2", map[string]string{"app": "b"}), testPod("y", "c", "n2", "10.0.2.1", nil), huge, allowB)
	eventually(t, "first sync", h.ctrl.Ready)
	h.expectEvent(t, "Warning PolicyTooLarge", "too large to compile")
	m := h.ctrl.cfg.Metrics
	if v := counterValue(t, m.RejectedPolicies.WithLabelValues("NetworkPolicy")); v != 1 {
		t.Errorf("nftpolicy_rejected_policies{kind=NetworkPolicy} = %v, want 1", v)
	}
	if v := counterValue(t, m.PoliciesRejected.WithLabelValues("NetworkPolicy", "cost")); v != 1 {
		t.Errorf("nftpolicy_policies_rejected_total{kind=NetworkPolicy,reason=cost} = %v, want 1", v)
	}
	// 10.0.2.1 is inside the huge policy's ipBlock 10.0.0.0/8 (its
	// exceptions have even last octets): compiled, it would be allowed.
	src := netip.MustParseAddr("10.0.2.1")
	if v := h.eval.Evaluate(src, netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); v.Allowed {
		t.Errorf("the rejected policy's pod is reachable: %s", v.Reason())
	}
	if v := h.eval.Evaluate(src, netip.MustParseAddr("10.0.1.2"), compile.ProtoTCP, 80); !v.Allowed {
		t.Errorf("the policy next to the rejected one does not allow: %s", v.Reason())
	}
	if d := h.nft.dump(); strings.Contains(d, "10.0.0.0-") || !strings.Contains(d, "ingress-isolated-") {
		t.Errorf("the rejected policy's ranges are in the table, or its pod is not isolated:\n%.2000s", d)
	}
}

// TestCostlyPolicyIsRejected: a NetworkPolicy whose peers each select
// every pod, within compile.MaxPolicyCost but over the agent's policy
// budget for what it makes (Config.Budgets), is reported (Warning Event
// PolicyTooLarge saying it is too costly, nftpolicy_policies_rejected_total
// with reason budget, nftpolicy_namespace_cost_max_ratio) and enforced
// fail-closed, while a policy of another namespace allows as written.
func TestCostlyPolicyIsRejected(t *testing.T) {
	amp := compiletest.CostAmplificationPolicy("x", "amp", "a", 40)
	amp.ResourceVersion = "1"
	allowC := denyAll("y")
	allowC.Name = "allow-c"
	allowC.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	h := startWith(t, func(c *Config) { c.Budgets = compile.Budgets{Policy: 100, Namespace: 1000} },
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "a"}), testPod("x", "b", "n1", "10.0.1.2", nil),
		testPod("y", "c", "n2", "10.0.2.1", nil), amp, allowC)
	eventually(t, "first sync", h.ctrl.Ready)
	h.expectEvent(t, "Warning PolicyTooLarge", "too costly to build")
	m := h.ctrl.cfg.Metrics
	if v := counterValue(t, m.PoliciesRejected.WithLabelValues("NetworkPolicy", "budget")); v != 1 {
		t.Errorf("nftpolicy_policies_rejected_total{kind=NetworkPolicy,reason=budget} = %v, want 1", v)
	}
	if v := counterValue(t, m.NamespaceCostMax); v != 0.1 {
		t.Errorf("nftpolicy_namespace_cost_max_ratio = %v, want 0.1 (x charged its policy budget, 100 of 1000)", v)
	}
	src := netip.MustParseAddr("10.0.2.1")
	if v := h.eval.Evaluate(src, netip.MustParseAddr("10.0.1.1"), compile.ProtoTCP, 80); v.Allowed {
		t.Errorf("the rejected policy's pod is reachable: %s", v.Reason())
	}
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.1.2"), src, compile.ProtoTCP, 80); !v.Allowed {
		t.Errorf("the other namespace's policy does not allow: %s", v.Reason())
	}
}

// TestHealthyWhileCachesSync holds the first list of pods, as a large
// cluster's API server would be slow to answer it: the controller is not
// ready, but it stays healthy for longer than a liveness budget of a few
// heartbeats; once the list is answered it commits and becomes ready.
func TestHealthyWhileCachesSync(t *testing.T) {
	release := make(chan struct{})
	client := fake.NewClientset(testPod("x", "a", "n1", "10.0.1.1", nil))
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil // on to the tracker
	})
	nft := &flakyNFT{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}
	syncer, err := sets.New(sets.Config{NFT: nft})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := New(Config{Client: client, NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}, Syncer: syncer})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	budget := MinHealthBudget
	for end := time.Now().Add(3 * budget); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !ctrl.Healthy(budget) {
			t.Fatalf("unhealthy while the informers wait for their first list (budget %v)", budget)
		}
		if ctrl.Ready() || nft.dump() != "" {
			t.Fatal("ready, or the kernel was written, before the caches synced")
		}
	}
	close(release)
	eventually(t, "first sync after the list", ctrl.Ready)
	if !ctrl.Healthy(budget) {
		t.Error("unhealthy after the first sync")
	}
}

// histogramCount reads the number of observations of one label of a
// histogram vector.
func histogramCount(t *testing.T, h *prometheus.HistogramVec, label string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.WithLabelValues(label).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.Histogram.GetSampleCount()
}

// TestPodChangesAreElementChanges: in hybrid mode a pod change reaches the
// kernel as its element changes (sync kind "pods"), the program follows
// within the refresh delay, and a failed element transaction is repaired by
// the retry's full build.
func TestPodChangesAreElementChanges(t *testing.T) {
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	pods := h.ctrl.cfg.Metrics.SyncDuration
	before := histogramCount(t, pods, "pods")
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/b in the kernel", func() bool { return strings.Contains(h.nft.dump(), `10.0.1.2 comment "x/b"`) })
	if got := histogramCount(t, pods, "pods"); got <= before {
		t.Errorf("sync kind pods observed %d times, before %d: the pod took a full build", got, before)
	}
	eventually(t, "x/b in the evaluator's program", func() bool { _, ok := h.eval.Program().PodByKey("x/b"); return ok })
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.2"), compile.ProtoTCP, 80); v.Allowed {
		t.Fatalf("x/b is isolated, but the evaluator allows: %s", v.Reason())
	}

	// A failed element transaction: the retry rebuilds and repairs.
	h.nft.failNext(1)
	if err := h.client.CoreV1().Pods("x").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/a gone from the kernel after a failure", func() bool {
		return h.nft.failures() >= 1 && !strings.Contains(h.nft.dump(), `"x/a"`)
	})
	fresh := h.freshLoad(t, []*corev1.Pod{testPod("x", "b", "n1", "10.0.1.2", nil)}, denyAll("x"))
	eventually(t, "the table equals a fresh load of the full build", func() bool { return h.nft.dump() == fresh })
}

// TestInitialListsAreNotChanges: the first sync builds from the informers'
// stores; the notifications of their initial lists, which can come after
// it, are not applied again as changes (on a large cluster, tens of
// thousands of no-op pod changes right after start-up).
func TestInitialListsAreNotChanges(t *testing.T) {
	objs := []runtime.Object{denyAll("x")}
	for i := range 1000 {
		objs = append(objs, testPod("x", fmt.Sprintf("p%d", i), "n2", fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), nil))
	}
	h := newHarness(t, nil, objs...)
	// Handlers as slow as on a large cluster: the initial list's
	// notifications take about a second.
	h.ctrl.podNoted = func() { time.Sleep(time.Millisecond) }
	h.run(t)
	eventually(t, "first sync", h.ctrl.Ready)
	// Notifications delivered after the first sync would be synced well
	// within this.
	time.Sleep(time.Second)
	syncs := h.ctrl.cfg.Metrics.SyncDuration
	for kind, want := range map[string]uint64{"full": 1, "incremental": 0, "pods": 0, "policies": 0} {
		if got := histogramCount(t, syncs, kind); got != want {
			t.Errorf("%d syncs of kind %s after start-up, want %d", got, kind, want)
		}
	}
}

// freshLoad is the table a fake nft holds after loading the full build of
// these objects on the harness's node.
func (h *harness) freshLoad(t *testing.T, pods []*corev1.Pod, policies ...*networkingv1.NetworkPolicy) string {
	t.Helper()
	want, err := compile.Render(compile.Build(compile.Input{NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		Pods: pods, Policies: policies, Namespaces: []*corev1.Namespace{}}), h.ctrl.cfg.Render)
	if err != nil {
		t.Fatal(err)
	}
	fresh := knftables.NewFake(knftables.InetFamily, compile.TableName)
	tx := fresh.NewTransaction()
	want.AddTo(tx)
	if err := fresh.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return fresh.Dump()
}

// TestTrackerCorrectionsCountOnlyChecks: a pod change the tracker cannot
// apply alone (a pod claims an address another pod holds: ownership is
// decided over all pods) rebuilds, and that rebuild writes the change
// itself. It is no correction of the incremental changes before it, and
// nftpolicy_tracker_corrections_total, whose rise tells operators of a
// compiler bug, must not count it.
func TestTrackerCorrectionsCountOnlyChecks(t *testing.T) {
	h := startWith(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour },
		testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	pods := h.ctrl.cfg.Metrics.SyncDuration
	before, rebuilds := histogramCount(t, pods, "pods"), histogramCount(t, pods, "incremental")
	// An incremental change, not checked by a rebuild yet (the refresh
	// delay is an hour).
	if _, err := h.client.CoreV1().Pods("y").Create(ctx, testPod("y", "c", "n1", "10.0.1.3", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "y/c applied as a pod change", func() bool { return histogramCount(t, pods, "pods") > before })
	// x/b claims y/c's address: a rebuild.
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "b", "n1", "10.0.1.3", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rebuild for x/b", func() bool { return histogramCount(t, pods, "incremental") > rebuilds })
	if got := counterValue(t, h.ctrl.cfg.Metrics.TrackerCorrections); got != 0 {
		t.Errorf("nftpolicy_tracker_corrections_total = %v after a rebuild that carried a new change, want 0", got)
	}
}

// TestPodChangesThatCreateChains: a pod that is the first or the last
// local pod of a combination of NetworkPolicies creates or deletes its
// isolation chain without a full build (sync kind "pods"), also when other
// pods' changes come before it in the same sync (their elements must
// reach the kernel too), and the table is then a fresh load of the full
// build. Each round holds the table's transaction so that two pod changes
// queue up for one sync, in either order.
func TestPodChangesThatCreateChains(t *testing.T) {
	h := startWith(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour },
		testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"), denyAll("y"))
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	syncs := h.ctrl.cfg.Metrics.SyncDuration
	rebuilds := histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full")
	pods := []*corev1.Pod{testPod("x", "a", "n1", "10.0.1.1", nil)}
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := h.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	remove := func(ns, name string) {
		t.Helper()
		if err := h.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = slices.DeleteFunc(pods, func(p *corev1.Pod) bool { return p.Namespace == ns && p.Name == name })
	}
	for round := 0; round < 6; round++ {
		before := histogramCount(t, syncs, "pods")
		h.nft.mu.Lock() // the next transaction waits
		// x/h<round> joins x's isolation chain (elements only).
		create(testPod("x", fmt.Sprintf("h%d", round), "n1", fmt.Sprintf("10.0.1.%d", 10+round), nil))
		if round%2 == 0 {
			// y/c is y's first local pod: its isolation chain is new.
			create(testPod("y", "c", "n1", "10.0.1.3", nil))
		} else {
			// ... and its last: the chain goes.
			remove("y", "c")
		}
		time.Sleep(50 * time.Millisecond) // both events reach the controller
		h.nft.mu.Unlock()
		fresh := h.freshLoad(t, pods, denyAll("x"), denyAll("y"))
		// Lines sorted: the fake lists elements in the order they came.
		lines := func(dump string) []string { l := strings.Split(dump, "\n"); slices.Sort(l); return l }
		var got []string
		if !poll(func() bool {
			got = lines(h.nft.dump())
			return histogramCount(t, syncs, "pods") > before && slices.Equal(got, lines(fresh))
		}) {
			t.Fatalf("round %d: the table is not a fresh load of the full build (-want +got):\n%s", round, cmp.Diff(lines(fresh), got))
		}
	}
	if got := histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full"); got != rebuilds {
		t.Errorf("%d rebuilds after the first sync: a pod change took a full build", got-rebuilds)
	}
	if got := counterValue(t, h.ctrl.cfg.Metrics.TrackerCorrections); got != 0 {
		t.Errorf("nftpolicy_tracker_corrections_total = %v", got)
	}
}

// TestPodRemovalHookBeforePublication: a pod deletion applied
// incrementally reaches the pod hooks (pod nil) before the program without
// the pod is published, which then comes with the kernel transaction, not
// with a refresh (an hour away here): DNS learning deletes the pod's
// learned elements before any reader of the program misses the pod.
func TestPodRemovalHookBeforePublication(t *testing.T) {
	var (
		mu      sync.Mutex
		removed []string
		// stillThere: at the hook, the published program had the pod.
		stillThere bool
		h          *harness
	)
	h = startWith(t, func(c *Config) {
		c.ProgramRefreshDelay = time.Hour
		c.Hooks = &Hooks{}
		c.Hooks.OnPodApplied(func(key string, pod *compile.PodInfo) {
			if pod == nil {
				mu.Lock()
				removed = append(removed, key)
				_, stillThere = h.eval.Program().PodByKey(key)
				mu.Unlock()
			}
		})
	}, testPod("x", "a", "n1", "10.0.1.1", nil), testPod("x", "b", "n1", "10.0.1.2", nil), denyAll("x"))
	eventually(t, "first sync", h.ctrl.Ready)
	if err := h.client.CoreV1().Pods("x").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/a gone from the kernel", func() bool { return !strings.Contains(h.nft.dump(), `"x/a"`) })
	eventually(t, "x/a gone from the evaluator's program", func() bool { _, ok := h.eval.Program().PodByKey("x/a"); return !ok })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(removed, []string{"x/a"}) {
		t.Errorf("the pod hook saw the removals %v, want [x/a]", removed)
	}
	if !stillThere {
		t.Errorf("the program without x/a was published before the pod hook ran")
	}
}

// TestPodChangesPublishTheirProgram: the program of a pod change applied
// incrementally is published with its kernel transaction, without a full
// build (the refresh is an hour away): the evaluator decides with the
// program the kernel enforces, and it equals the full build's.
func TestPodChangesPublishTheirProgram(t *testing.T) {
	h := startWith(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour },
		testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	syncs := h.ctrl.cfg.Metrics.SyncDuration
	rebuilds := histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full")
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/b in the evaluator's program", func() bool { _, ok := h.eval.Program().PodByKey("x/b"); return ok })
	if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.2"), compile.ProtoTCP, 80); v.Allowed {
		t.Fatalf("x/b is isolated, but the evaluator allows: %s", v.Reason())
	}
	if err := h.client.CoreV1().Pods("x").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/a gone from the evaluator's program", func() bool { _, ok := h.eval.Program().PodByKey("x/a"); return !ok })
	if got := histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full"); got != rebuilds {
		t.Errorf("%d full builds for two pod changes", got-rebuilds)
	}
	want := compile.Build(compile.Input{NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")},
		Pods: []*corev1.Pod{testPod("x", "b", "n1", "10.0.1.2", nil)}, Policies: []*networkingv1.NetworkPolicy{denyAll("x")}})
	got := h.eval.Program()
	if len(got.Pods) != 1 || got.Pods[0].Key != "x/b" || !slices.Equal(got.Pods[0].IngressPolicies, want.Pods[0].IngressPolicies) ||
		got.Pods[0].IngressDenied != want.Pods[0].IngressDenied || len(got.Tables) != len(want.Tables) {
		t.Errorf("the published program is not the full build's: pods %v", got.Pods)
	}
}

// TestDerivedProgramsArePaced: the program of pod changes is derived
// after their kernel transaction, at once when the last derivation is far
// enough behind, else when the pace allows (a timer): never later, and
// never by a full build.
func TestDerivedProgramsArePaced(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour }, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	h.ctrl.checkDelay = time.Hour
	h.ctrl.deriveGap = 1500 * time.Millisecond
	h.run(t)
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	inProgram := func(key string) func() bool {
		return func() bool { _, ok := h.eval.Program().PodByKey(key); return ok }
	}
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/b in the evaluator's program", inProgram("x/b"))
	published := time.Now()
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "c", "n1", "10.0.1.3", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/c in the kernel's ruleset", func() bool {
		return strings.Contains(h.nft.dump(), "10.0.1.3")
	})
	if inProgram("x/c")() && time.Since(published) < h.ctrl.deriveGap/2 {
		t.Fatalf("x/c was published %v after x/b, within the pace (%v)", time.Since(published), h.ctrl.deriveGap)
	}
	eventually(t, "x/c in the evaluator's program when the pace allows", inProgram("x/c"))
	if since := time.Since(published); since < h.ctrl.deriveGap/2 {
		t.Errorf("x/c published %v after x/b, within the pace (%v)", since, h.ctrl.deriveGap)
	}
}

// TestQueueModePodChangesThroughTheTracker: in queue mode a pod change is
// applied by the tracker, not by a full build, and its program is derived
// before its kernel transaction and published right after it, never paced
// (the evaluator decides every connection of the pods policies select); a
// policy change is a full build, counted as a queue-mode fallback.
func TestQueueModePodChangesThroughTheTracker(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.ProgramRefreshDelay = time.Hour
		c.Render.Mode = compile.ModeQueue
	}, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	h.ctrl.checkDelay = time.Hour
	// In hybrid mode the second derivation would wait this long.
	h.ctrl.deriveGap = time.Hour
	// The transactions run on the sync loop: what the tracker has not
	// derived yet when one commits, read there.
	var underived []int
	h.nft.onRun = func() {
		if h.ctrl.ready.Load() {
			underived = append(underived, h.ctrl.tracker.Pending())
		}
	}
	h.run(t)
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	syncs := h.ctrl.cfg.Metrics.SyncDuration
	rebuilds := func() uint64 { return histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full") }
	before := rebuilds()
	inProgram := func(key string) func() bool {
		return func() bool { _, ok := h.eval.Program().PodByKey(key); return ok }
	}
	for _, p := range []*corev1.Pod{testPod("x", "b", "n1", "10.0.1.2", nil), testPod("x", "c", "n1", "10.0.1.3", nil)} {
		if _, err := h.client.CoreV1().Pods("x").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, p.Name+" in the evaluator's program", inProgram("x/"+p.Name))
		if v := h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr(p.Status.PodIPs[0].IP), compile.ProtoTCP, 80); v.Allowed {
			t.Fatalf("x/%s is isolated, but the evaluator allows: %s", p.Name, v.Reason())
		}
	}
	if got := rebuilds(); got != before {
		t.Fatalf("%d full builds for two pod changes in queue mode", got-before)
	}
	h.nft.mu.Lock()
	if len(underived) < 2 || slices.ContainsFunc(underived, func(n int) bool { return n != 0 }) {
		t.Errorf("pod changes not derived yet at each transaction of theirs: %v, want two or more, all 0", underived)
	}
	h.nft.mu.Unlock()
	fallbacks := h.ctrl.cfg.Metrics.IncrementalFallbacks.WithLabelValues(string(compile.FallbackQueueMode))
	fell := counterValue(t, fallbacks)
	allow := denyAll("x")
	allow.Name = "allow"
	allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(ctx, allow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the evaluator allowing after the policy change", func() bool {
		return h.eval.Evaluate(netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.1.3"), compile.ProtoTCP, 80).Allowed
	})
	if got := counterValue(t, fallbacks) - fell; got != 1 {
		t.Errorf("%v queue-mode fallbacks for one policy change, want 1", got)
	}
	if got := rebuilds(); got != before+1 {
		t.Errorf("%d full builds for one policy change in queue mode, want 1", got-before)
	}
}

// TestProgramLagObserved: nftpolicy_program_lag_seconds counts each
// publication of a program after its kernel transaction and how long the
// evaluator decided with the program before: a paced derivation shows
// there as the time it was held back.
func TestProgramLagObserved(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour }, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	h.ctrl.checkDelay = time.Hour
	h.ctrl.deriveGap = 1500 * time.Millisecond
	h.run(t)
	eventually(t, "first sync", h.ctrl.Ready)
	lag := func() (uint64, float64) {
		var m dto.Metric
		if err := h.ctrl.cfg.Metrics.ProgramLag.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
	}
	n0, _ := lag()
	if n0 != 1 {
		t.Fatalf("%d lags observed after the first sync, want 1", n0)
	}
	ctx := context.Background()
	for _, p := range []*corev1.Pod{testPod("x", "b", "n1", "10.0.1.2", nil), testPod("x", "c", "n1", "10.0.1.3", nil)} {
		_, sum0 := lag()
		if _, err := h.client.CoreV1().Pods("x").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, p.Name+" in the evaluator's program", func() bool { _, ok := h.eval.Program().PodByKey("x/" + p.Name); return ok })
		n, sum := lag()
		if n != n0+1 {
			t.Fatalf("%d lags observed after x/%s's publication, want %d", n, p.Name, n0+1)
		}
		n0 = n
		if p.Name == "c" && sum-sum0 < h.ctrl.deriveGap.Seconds()/2 {
			t.Errorf("x/c's program, held back by the pace (%v), was observed %.3fs behind the kernel", h.ctrl.deriveGap, sum-sum0)
		}
	}
}

// TestConsistencyCheckFollowsPodChanges: pod changes applied incrementally
// are followed, after the consistency check's delay, by one full build
// that checks the tracker (and finds nothing to correct), and no full
// build follows while no pod changes.
func TestConsistencyCheckFollowsPodChanges(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ProgramRefreshDelay = time.Hour }, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	h.ctrl.checkDelay = 300 * time.Millisecond
	h.run(t)
	eventually(t, "first sync", h.ctrl.Ready)
	syncs := h.ctrl.cfg.Metrics.SyncDuration
	rebuilds := func() uint64 { return histogramCount(t, syncs, "incremental") + histogramCount(t, syncs, "full") }
	time.Sleep(time.Second)
	before := rebuilds()
	if before != 1 {
		t.Fatalf("%d full builds without a change, want the first only", before)
	}
	if _, err := h.client.CoreV1().Pods("x").Create(context.Background(), testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the consistency check after x/b", func() bool { return rebuilds() > before })
	time.Sleep(time.Second)
	if got := rebuilds(); got != before+1 {
		t.Errorf("%d full builds after one pod change, want 1", got-before)
	}
	if got := counterValue(t, h.ctrl.cfg.Metrics.TrackerCorrections); got != 0 {
		t.Errorf("nftpolicy_tracker_corrections_total = %v", got)
	}
}

// TestFallbackIsCountedWithItsReason: a pod change the tracker leaves to a
// full rebuild (its address is another pod's) counts in
// nftpolicy_incremental_fallbacks_total under its reason and is logged
// with it at -v=2; a change the tracker applies counts nothing.
func TestFallbackIsCountedWithItsReason(t *testing.T) {
	var logs logLines
	h := startWith(t, func(c *Config) { c.Logger = logs.logger(2) }, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", h.ctrl.Ready)
	ctx := context.Background()
	fallbacks := h.ctrl.cfg.Metrics.IncrementalFallbacks
	shared := fallbacks.WithLabelValues(string(compile.FallbackAddressShared))
	total := func() float64 {
		n := 0.0
		for _, f := range compile.Fallbacks() {
			n += counterValue(t, fallbacks.WithLabelValues(string(f)))
		}
		return n
	}
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "b", "n1", "10.0.1.2", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x/b in the kernel", func() bool { return strings.Contains(h.nft.dump(), `10.0.1.2 comment "x/b"`) })
	if n := total(); n != 0 {
		t.Fatalf("a tracked pod change counted %v fallbacks", n)
	}
	// x/c takes x/a's address: ownership is decided over all pods.
	if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "c", "n1", "10.0.1.1", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fallback counted", func() bool { return counterValue(t, shared) == 1 })
	if n := total(); n != 1 {
		t.Errorf("%v fallbacks counted, want 1 (address-shared)", n)
	}
	logged := false
	for _, l := range logs.take() {
		logged = logged || strings.Contains(l, `"reason"="address-shared"`) && strings.Contains(l, `"pod"="x/c"`)
	}
	if !logged {
		t.Error("the fallback's reason was not logged at -v=2")
	}
}

// TestWaitSynced: the start's wait returns true once every cache synced
// (checking again until they have), false when its context ends first.
func TestWaitSynced(t *testing.T) {
	calls := 0
	later := func() bool { calls++; return calls > 3 }
	always := func() bool { return true }
	if !waitSynced(context.Background(), []cache.InformerSynced{always, later}) || calls != 4 {
		t.Errorf("waitSynced returned after %d checks of the late cache, want true after 4", calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if waitSynced(ctx, []cache.InformerSynced{always, func() bool { return false }}) {
		t.Error("waitSynced returned true with a cache that never syncs")
	}
}
