package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/flowcontrol"
	npafake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// statusLog records what the controller hands to OnStatus and
// OnSyncFailed.
type statusLog struct {
	mu     sync.Mutex
	pubs   []status.Publication
	failed []error
}

func (l *statusLog) hook(c *Config) {
	c.OnStatus = func(p status.Publication) {
		l.mu.Lock()
		l.pubs = append(l.pubs, p)
		l.mu.Unlock()
	}
	c.OnSyncFailed = func(err error, _ time.Time) {
		l.mu.Lock()
		l.failed = append(l.failed, err)
		l.mu.Unlock()
	}
}

func (l *statusLog) publications() []status.Publication {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]status.Publication(nil), l.pubs...)
}

func (l *statusLog) failures() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.failed)
}

// changeIn returns the publication's change of the policy, if any.
func changeIn(p status.Publication, ref status.PolicyRef) (status.Change, bool) {
	for _, ch := range p.Changes {
		if ch.PolicyRef == ref {
			return ch, true
		}
	}
	return status.Change{}, false
}

// waitPublished waits for a publication with the policy's change and
// returns it.
func (l *statusLog) waitPublished(t *testing.T, ref status.PolicyRef, rv string) (status.Publication, status.Change) {
	t.Helper()
	var pub status.Publication
	var ch status.Change
	eventually(t, fmt.Sprintf("%s at %s published", ref, rv), func() bool {
		for _, p := range l.publications() {
			if c, ok := changeIn(p, ref); ok && c.ResourceVersion == rv {
				pub, ch = p, c
				return true
			}
		}
		return false
	})
	return pub, ch
}

func policyAt(ns, name, rv string) *networkingv1.NetworkPolicy {
	np := denyAll(ns)
	np.Name, np.ResourceVersion, np.Generation = name, rv, 1
	return np
}

// takenBySync waits until a sync took the policy handlers' notes up to rv.
func takenBySync(t *testing.T, h *harness, rv string) {
	t.Helper()
	eventually(t, "the sync took the change", func() bool {
		h.ctrl.mu.Lock()
		defer h.ctrl.mu.Unlock()
		return h.ctrl.seenMarks.NetworkPolicies == rv && len(h.ctrl.pendingChanges) == 0
	})
}

// TestStatusWatermarkAfterCommitOnly: the first commit publishes the
// watermark of the initial list (not as changes); a NetworkPolicy created
// later is published, watermark and change, only once its transaction
// committed, with its latency.
func TestStatusWatermarkAfterCommitOnly(t *testing.T) {
	var l statusLog
	h := startWith(t, l.hook, testPod("x", "a", "n1", "10.0.1.1", nil), policyAt("x", "old", "3"))
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	first := l.publications()[0]
	if first.Watermarks.NetworkPolicies != "3" || len(first.Changes) != 0 {
		t.Fatalf("first publication: watermarks %+v, changes %+v; want NetworkPolicies 3 and no change", first.Watermarks, first.Changes)
	}
	h.nft.mu.Lock() // the next transaction waits
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), policyAt("x", "web", "7"), metav1.CreateOptions{}); err != nil {
		h.nft.mu.Unlock()
		t.Fatal(err)
	}
	takenBySync(t, h, "7")
	time.Sleep(50 * time.Millisecond)
	for _, p := range l.publications() {
		if p.Watermarks.NetworkPolicies != "3" || len(p.Changes) > 0 {
			h.nft.mu.Unlock()
			t.Fatalf("published before the commit: watermarks %+v, changes %+v", p.Watermarks, p.Changes)
		}
	}
	h.nft.mu.Unlock()
	pub, ch := l.waitPublished(t, status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: "x", Name: "web"}, "7")
	if pub.Watermarks.NetworkPolicies != "7" {
		t.Errorf("watermark %q after the commit, want 7", pub.Watermarks.NetworkPolicies)
	}
	if ch.Deleted || ch.Generation != 1 || ch.LatencyMicros < 50_000 || !ch.ProgrammedAt.Time.Equal(pub.At) {
		t.Errorf("change %+v: want not deleted, generation 1, a latency of at least the 50 ms held, programmed at %v", ch, pub.At)
	}
}

// TestStatusDeletionCarriesItsResourceVersion: a deletion is published as
// a deleted change with the deletion's resourceVersion (the watch's), which
// also raises the watermark.
func TestStatusDeletionCarriesItsResourceVersion(t *testing.T) {
	var l statusLog
	h := newHarness(t, l.hook, testPod("x", "a", "n1", "10.0.1.1", nil))
	// The API server's watch carries a deleted object at the deletion's
	// resourceVersion; the fake's at its last one.
	h.client.PrependWatchReactor("networkpolicies", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := h.client.Tracker().Watch(a.GetResource(), a.GetNamespace(), a.(k8stesting.WatchActionImpl).ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if np, ok := e.Object.(*networkingv1.NetworkPolicy); ok && e.Type == watch.Deleted {
				np = np.DeepCopy()
				np.ResourceVersion = "9"
				e.Object = np
			}
			return e, true
		}), nil
	})
	h.run(t)
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	ref := status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: "x", Name: "web"}
	pols := h.client.NetworkingV1().NetworkPolicies("x")
	if _, err := pols.Create(context.Background(), policyAt("x", "web", "7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.waitPublished(t, ref, "7")
	if err := pols.Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pub, ch := l.waitPublished(t, ref, "9")
	if !ch.Deleted || pub.Watermarks.NetworkPolicies != "9" {
		t.Errorf("deletion published as %+v with watermarks %+v; want deleted, watermark 9", ch, pub.Watermarks)
	}
}

// TestStatusFailedSyncsDoNotAdvance: while transactions fail, OnSyncFailed
// is told of each failure and nothing is published; the commit after
// publishes the change.
func TestStatusFailedSyncsDoNotAdvance(t *testing.T) {
	var l statusLog
	h := startWith(t, l.hook, testPod("x", "a", "n1", "10.0.1.1", nil), policyAt("x", "old", "3"))
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	published := len(l.publications())
	h.nft.failNext(1 << 30)
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), policyAt("x", "web", "7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "three failed syncs told", func() bool { return l.failures() >= 3 })
	if got := len(l.publications()); got != published {
		t.Fatalf("%d publications while syncs failed", got-published)
	}
	l.mu.Lock()
	err := l.failed[0]
	l.mu.Unlock()
	if !strings.Contains(err.Error(), "injected transaction failure") {
		t.Errorf("OnSyncFailed told %v, want the transaction's error", err)
	}
	h.nft.failNext(0)
	pub, _ := l.waitPublished(t, status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: "x", Name: "web"}, "7")
	if pub.Watermarks.NetworkPolicies != "7" {
		t.Errorf("watermark %q after the commit, want 7", pub.Watermarks.NetworkPolicies)
	}
}

// TestStatusClusterPoliciesAndProblems: ClusterNetworkPolicy changes have
// their own watermark and kind; policies enforced fail-closed are listed
// as problems with their Events' reasons.
func TestStatusClusterPoliciesAndProblems(t *testing.T) {
	var l statusLog
	npa := npafake.NewSimpleClientset()
	npa.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{served}
	bad := policyAt("x", "bad", "4")
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"192.168.0.0/16"}}}}}}
	startWith(t, func(c *Config) {
		l.hook(c)
		c.PolicyClient, c.ClusterPolicyCheckPeriod = npa, time.Hour
	}, testPod("x", "a", "n1", "10.0.1.1", nil), bad)
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	cnp := ct.CNP("web", "Admin", 10, ct.NamespacesSubject(ct.Sel()), ct.CNPEgress(ct.CNPRule("dns", "Deny", ct.ToDomains("example.com"))))
	cnp.ResourceVersion = "12"
	if _, err := npa.PolicyV1beta1().ClusterNetworkPolicies().Create(context.Background(), cnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pub, _ := l.waitPublished(t, status.PolicyRef{Kind: status.KindClusterNetworkPolicy, Name: "web"}, "12")
	if pub.Watermarks != (status.Watermarks{NetworkPolicies: "4", ClusterNetworkPolicies: "12"}) {
		t.Errorf("watermarks %+v, want NetworkPolicies 4, ClusterNetworkPolicies 12", pub.Watermarks)
	}
	eventually(t, "both problems published", func() bool {
		ps := l.publications()
		got := map[string]string{}
		for _, p := range ps[len(ps)-1].Problems {
			got[p.PolicyRef.String()] = p.Reason
		}
		return len(got) == 2 && got["NetworkPolicy x/bad"] == "InvalidNetworkPolicy" && got["ClusterNetworkPolicy web"] == "InvalidClusterNetworkPolicy"
	})
}

// programmingFailedEvents takes the ProgrammingFailed Events recorded so
// far (others are dropped).
func programmingFailedEvents(h *harness) []string {
	var out []string
	for {
		select {
		case e := <-h.events.Events:
			if strings.Contains(e, programmingFailedReason) {
				out = append(out, e)
			}
		default:
			return out
		}
	}
}

// TestProgrammingFailedOncePerPolicyVersion: once syncs keep failing, each
// policy whose change is pending gets one ProgrammingFailed Event per
// resourceVersion, however many syncs fail.
func TestProgrammingFailedOncePerPolicyVersion(t *testing.T) {
	var l statusLog
	h := startWith(t, l.hook, testPod("x", "a", "n1", "10.0.1.1", nil))
	h.events.IncludeObject = true
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	h.nft.failNext(1 << 30)
	pols := h.client.NetworkingV1().NetworkPolicies("x")
	if _, err := pols.Create(context.Background(), policyAt("x", "web", "7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "eight failed syncs", func() bool { return l.failures() >= 8 })
	got := programmingFailedEvents(h)
	if len(got) != 1 {
		t.Fatalf("%d ProgrammingFailed Events after 8 failed syncs, want 1: %q", len(got), got)
	}
	for _, want := range []string{"Warning ProgrammingFailed", "nftpolicy on n1", "resourceVersion 7", "injected transaction failure",
		"involvedObject{kind=NetworkPolicy,apiVersion=networking.k8s.io/v1}"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("Event %q does not say %q", got[0], want)
		}
	}
	np := policyAt("x", "web", "8")
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}
	if _, err := pols.Update(context.Background(), np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := l.failures()
	eventually(t, "eight more failed syncs", func() bool { return l.failures() >= failed+8 })
	if got := programmingFailedEvents(h); len(got) != 1 || !strings.Contains(got[0], "resourceVersion 8") {
		t.Fatalf("ProgrammingFailed Events after the update: %q; want one, for resourceVersion 8", got)
	}
	h.nft.failNext(0)
	l.waitPublished(t, status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: "x", Name: "web"}, "8")
}

// TestProgrammingFailedRateLimited: Events over the rate limit are not
// emitted.
func TestProgrammingFailedRateLimited(t *testing.T) {
	var l statusLog
	h := newHarness(t, l.hook, testPod("x", "a", "n1", "10.0.1.1", nil))
	h.ctrl.status.eventLimit = flowcontrol.NewTokenBucketPassiveRateLimiter(1e-6, 2)
	h.run(t)
	eventually(t, "first publication", func() bool { return len(l.publications()) > 0 })
	h.nft.failNext(1 << 30)
	for i := range 4 {
		if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), policyAt("x", fmt.Sprint("p", i), fmt.Sprint(10+i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every change pending", func() bool {
		h.ctrl.mu.Lock()
		defer h.ctrl.mu.Unlock()
		return len(h.ctrl.pendingChanges) == 4
	})
	failed := l.failures()
	eventually(t, "eight failed syncs", func() bool { return l.failures() >= failed+8 })
	if got := programmingFailedEvents(h); len(got) != 2 {
		t.Errorf("%d ProgrammingFailed Events for 4 policies with a burst of 2, want 2: %q", len(got), got)
	}
	h.nft.failNext(0)
}
