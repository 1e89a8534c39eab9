package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// churnPolicy selects every pod of namespace churn and lets in, on port,
// the pods of every namespace through peers (issue 43, item 6: an edit of
// it costs peers x pods).
func churnPolicy(port int32, rv string) *networkingv1.NetworkPolicy {
	var peers []networkingv1.NetworkPolicyPeer
	for i := range 20 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{},
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: fmt.Sprintf("nope-%d", i), Operator: metav1.LabelSelectorOpDoesNotExist}}}})
	}
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "churn", Name: "churn", ResourceVersion: rv},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: []networkingv1.NetworkPolicyPort{{Port: &p}}}}}}
}

// passLog records, by sync pass, the policy changes applied and committed.
type passLog struct {
	mu     sync.Mutex
	pass   int
	events []passEvent
}

type passEvent struct {
	pass int
	what string // "apply <key>" or "commit <key>"
}

func (l *passLog) add(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, passEvent{l.pass, what})
}

func (l *passLog) since(i int) []passEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events[i:])
}

func (l *passLog) mark() (pass, i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pass, len(l.events)
}

// TestPolicyChurnDoesNotDelayOtherNamespaces holds the sync loop while one
// namespace's expensive edit (its cost injected: 1 s each; the edits go
// through the tracker, or each is a full build) and another
// namespace's new policy are both pending, again and again, and checks
// that the next pass commits the new policy without applying the
// expensive edit before it, and that the expensive edits are not starved:
// each is applied in the pass after.
func TestPolicyChurnDoesNotDelayOtherNamespaces(t *testing.T) {
	t.Run("tracker", func(t *testing.T) { testPolicyChurn(t, false) })
	// A staged policy with the staged log on: each edit is a full build.
	t.Run("full builds", func(t *testing.T) { testPolicyChurn(t, true) })
}

func testPolicyChurn(t *testing.T, staged bool) {
	log := &passLog{}
	policy := func(port int32, rv string) *networkingv1.NetworkPolicy {
		np := churnPolicy(port, rv)
		if staged {
			np.Annotations = map[string]string{compile.StagedAnnotation: "true"}
		}
		return np
	}
	var h *harness
	// Full builds so far: a pass that makes one applies everything.
	builds := func() uint64 {
		return histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "incremental") + histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "full")
	}
	var passBuilds uint64
	h = newHarness(t, func(cfg *Config) {
		// No program refresh (a full build) in the passes the test holds.
		cfg.ProgramRefreshDelay = time.Hour
		if staged {
			cfg.Render.StagedLogGroup = 7
		}
		cfg.OnStatus = func(p status.Publication) {
			if builds() > passBuilds {
				log.add("full build")
			}
			for _, ch := range p.Changes {
				log.add("commit " + ch.Namespace + "/" + ch.Name)
			}
		}
	}, testPod("churn", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
		testPod("other", "b", "n1", "10.0.2.1", map[string]string{"app": "db"}),
		policy(80, "1"))
	var hold atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	h.ctrl.passStarted = func() {
		if hold.Load() {
			held <- struct{}{}
			<-release
		}
		passBuilds = builds()
		log.mu.Lock()
		log.pass++
		log.mu.Unlock()
	}
	h.ctrl.policyCost = func(key string, measured time.Duration) time.Duration {
		log.add("apply " + key)
		if policyNamespace(key) == "churn" {
			return time.Second
		}
		return measured
	}
	h.run(t)
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	ctx := context.Background()
	churn := h.client.NetworkingV1().NetworkPolicies("churn")
	edit := func(i int) {
		t.Helper()
		if _, err := churn.Update(ctx, policy(int32(81+i), fmt.Sprint(2+i)), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	committed := func(from int, key string) bool {
		return slices.ContainsFunc(log.since(from), func(e passEvent) bool { return e.what == "commit "+key })
	}
	// The churning namespace's history: one edit applied alone.
	_, from := log.mark()
	edit(0)
	eventually(t, "the first edit", func() bool { return committed(from, "churn/churn") })
	for i := 1; i <= 5; i++ {
		hold.Store(true)
		edit(i)
		<-held
		hold.Store(false)
		other := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: fmt.Sprintf("p-%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		if _, err := h.client.NetworkingV1().NetworkPolicies("other").Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "both changes pending", func() bool {
			h.ctrl.mu.Lock()
			defer h.ctrl.mu.Unlock()
			_, a := h.ctrl.policyKeys["churn/churn"]
			_, b := h.ctrl.policyKeys["other/"+other.Name]
			return a && b
		})
		pass, from := log.mark()
		release <- struct{}{}
		key := "other/" + other.Name
		eventually(t, key+" committed", func() bool { return committed(from, key) })
		eventually(t, "edit "+fmt.Sprint(i)+" committed", func() bool { return committed(from, "churn/churn") })
		var got []string
		for _, e := range log.since(from) {
			if e.what == "commit "+key {
				if e.pass != pass+1 {
					t.Errorf("edit %d: %s committed in pass %d, want the next one (%d): %v", i, key, e.pass, pass+1, got)
				}
				break
			}
			got = append(got, fmt.Sprintf("pass %d: %s", e.pass, e.what))
			if strings.HasPrefix(e.what, "apply churn/") || e.what == "full build" {
				t.Errorf("edit %d: the churning namespace's edit (1 s, or a full build) was applied before %s was committed: %v", i, key, got)
				break
			}
		}
	}
}

// TestChurnDoesNotPostponeTheProgramRefresh edits one policy again and
// again, each edit committed before the next, and checks at the start of
// every pass that the program refresh, once armed, is never pushed later:
// each edit used to push it back by its delay, so that edits coming
// faster than the delay kept the program, and the revocation of flows
// other changes deny, behind the kernel for as long as they came.
func TestChurnDoesNotPostponeTheProgramRefresh(t *testing.T) {
	h := newHarness(t, func(cfg *Config) { cfg.ProgramRefreshDelay = time.Hour },
		testPod("churn", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}), churnPolicy(80, "1"))
	var (
		mu       sync.Mutex
		due      []time.Time
		postpone string
	)
	h.ctrl.passStarted = func() {
		mu.Lock()
		defer mu.Unlock()
		d := h.ctrl.refreshDue
		if n := len(due); n > 0 && !due[n-1].IsZero() && d.After(due[n-1]) && postpone == "" {
			postpone = fmt.Sprintf("pass %d: the refresh due at %v was pushed to %v", n, due[n-1].Format(time.StampMicro), d.Format(time.StampMicro))
		}
		due = append(due, d)
	}
	h.run(t)
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	ctx := context.Background()
	churn := h.client.NetworkingV1().NetworkPolicies("churn")
	for i := range 20 {
		before := policySyncs(t, h)
		if _, err := churn.Update(ctx, churnPolicy(int32(81+i%2), fmt.Sprint(2+i)), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the edit", func() bool { return policySyncs(t, h) > before })
	}
	mu.Lock()
	defer mu.Unlock()
	if postpone != "" {
		t.Fatal(postpone)
	}
	if len(due) < 20 || due[len(due)-1].IsZero() {
		t.Fatalf("the refresh was not armed after the edits (%d passes)", len(due))
	}
}

// TestFairSharePick checks the ledger alone: a namespace alone is always
// applied; one that owes more than a quantum beyond another pending one
// waits; an idle namespace does not bank credit.
func TestFairSharePick(t *testing.T) {
	f := newFairShare()
	keys := func(ks ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, k := range ks {
			m[k] = struct{}{}
		}
		return m
	}
	check := func(step string, pending map[string]struct{}, wantNow, wantLater []string) {
		t.Helper()
		now, later := f.pick(pending)
		if !slices.Equal(now, wantNow) || !slices.Equal(later, wantLater) {
			t.Fatalf("%s: now %v later %v, want now %v later %v", step, now, later, wantNow, wantLater)
		}
	}
	check("alone", keys("a/x"), []string{"a/x"}, nil)
	f.charge("a", time.Second)
	check("alone after a costly change", keys("a/x"), []string{"a/x"}, nil)
	f.charge("a", time.Second)
	check("another namespace first", keys("a/x", "b/y", "b/z", "cnp"), []string{"cnp", "b/y", "b/z"}, []string{"a/x"})
	f.charge("b", time.Millisecond)
	check("the costly one next", keys("a/x"), []string{"a/x"}, nil)
	f.charge("a", time.Second)
	// b, idle while a ran, starts at the clock: a's last edit is ahead.
	check("the new change first", keys("a/x", "b/y"), []string{"b/y"}, []string{"a/x"})
	// It banked nothing while idle: a change costlier than a's edits
	// puts it behind a.
	f.charge("b", 3*time.Second)
	check("b owes more now", keys("a/x", "b/y"), []string{"a/x"}, []string{"b/y"})
	if len(f.debt) > 2 {
		t.Errorf("the ledger keeps %d namespaces: %v", len(f.debt), f.debt)
	}
}

// TestChurnEditsAreAppliedAlone edits issue 43's churning policy again
// and again, its peers sharing one set of every pod (40 pods, past
// ShareMinMembers), and, with a budget its peers' matching passes, while
// it is rejected for its budget: every edit is a policies sync of the
// tracker, and no change falls back to a full build
// (nftpolicy_incremental_fallbacks_total, by reason).
func TestChurnEditsAreAppliedAlone(t *testing.T) {
	for _, tc := range []struct {
		name     string
		budgets  compile.Budgets
		rejected bool
	}{
		{"shared sets", compile.Budgets{}, false},
		{"past its budget", compile.Budgets{Policy: 500}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{churnPolicy(80, "1")}
			for i := range 40 {
				ns := []string{"churn", "other"}[i%2]
				objs = append(objs, testPod(ns, fmt.Sprintf("p%d", i), []string{"n1", "n2"}[i%2], fmt.Sprintf("10.0.%d.%d", i%2+1, i+1), map[string]string{"app": "web"}))
			}
			h := newHarness(t, func(cfg *Config) {
				cfg.ProgramRefreshDelay = time.Hour
				cfg.Budgets = tc.budgets
			}, objs...)
			h.run(t)
			eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
			prog := h.eval.Program()
			shared, rejected := false, false
			for i := range prog.Policies {
				if p := &prog.Policies[i]; p.Key == "churn/churn" {
					rejected = p.Rejected
					for _, sid := range p.Ingress {
						for _, s := range sid.Selectors {
							shared = shared || prog.Selectors[s].Shared()
						}
					}
				}
			}
			if rejected != tc.rejected || shared == tc.rejected {
				t.Fatalf("the churning policy: rejected %v, uses a shared set %v", rejected, shared)
			}
			fallbacks := func() float64 {
				n := 0.0
				for _, f := range compile.Fallbacks() {
					n += counterValue(t, h.ctrl.cfg.Metrics.IncrementalFallbacks.WithLabelValues(string(f)))
				}
				return n
			}
			before := fallbacks()
			churn := h.client.NetworkingV1().NetworkPolicies("churn")
			for i := range 10 {
				syncs := policySyncs(t, h)
				if _, err := churn.Update(context.Background(), churnPolicy(int32(81+i%2), fmt.Sprint(2+i)), metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the edit", func() bool { return policySyncs(t, h) > syncs || fallbacks() > before })
			}
			for _, f := range compile.Fallbacks() {
				if n := counterValue(t, h.ctrl.cfg.Metrics.IncrementalFallbacks.WithLabelValues(string(f))); n > 0 {
					t.Errorf("%v changes fell back to a full build for %q", n, f)
				}
			}
			if n := fallbacks() - before; n > 0 {
				t.Errorf("%v of 10 edits fell back to a full build", n)
			}
		})
	}
}
