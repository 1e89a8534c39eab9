package controller

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npafake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

// served is the discovery answer of an API server with the CRD installed.
var served = &metav1.APIResourceList{
	GroupVersion: ClusterPolicyGroupVersion,
	APIResources: []metav1.APIResource{{Name: ClusterPolicyResource, Kind: clusterPolicyKind}, {Name: ClusterPolicyResource + "/status"}},
}

// TestClusterPoliciesFollowTheCRD walks the watcher through the CRD's life:
// absent (v1 only, decided at once), installed (informer started, policies
// listed only once its cache synced), removed (policies dropped).
func TestClusterPoliciesFollowTheCRD(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cnp := ct.CNP("deny-all", "Admin", 10, ct.NamespacesSubject(ct.Sel()), ct.CNPEgress(ct.CNPRule("all", "Deny", ct.ToNetworks("0.0.0.0/0"))))
	client := npafake.NewSimpleClientset(cnp)
	disc := client.Discovery().(*fakediscovery.FakeDiscovery)
	var changes atomic.Int32
	m := NewMetrics()
	w := newClusterPolicies(client, time.Hour, 0, logger, m, func() { changes.Add(1) })
	defer w.stop("test over")

	// No CRD.
	w.check(ctx)
	if got, err := w.list(); err != nil || got != nil {
		t.Fatalf("without the API: list = %v, %v; want nothing", got, err)
	}
	select {
	case <-w.decided:
	default:
		t.Fatal("without the API the first check must decide at once (v1 only)")
	}
	if w.informer != nil {
		t.Fatal("an informer was started for an API that is not served")
	}
	if !w.toldAbsent {
		t.Error("the absent API was not reported")
	}

	// The CRD appears: the informer starts; policies count only once synced.
	disc.Resources = []*metav1.APIResourceList{served}
	w.check(ctx)
	if w.informer == nil {
		t.Fatal("no informer after the API appeared")
	}
	select {
	case <-w.recheck: // the cache synced
	case <-ctx.Done():
		t.Fatal("the informer's cache sync did not ask for a check")
	}
	before := changes.Load()
	w.check(ctx)
	got, err := w.list()
	if err != nil || len(got) != 1 || got[0].Name != "deny-all" {
		t.Fatalf("with the API: list = %v, %v; want deny-all", got, err)
	}
	if changes.Load() == before {
		t.Error("activating the ClusterNetworkPolicies did not mark the controller dirty")
	}
	if v := testutil.ToFloat64(m.ClusterPolicyAPI); v != 1 {
		t.Errorf("nftpolicy_cluster_network_policy_api_enabled = %v, want 1", v)
	}

	// A new policy arrives through the informer and marks dirty.
	before = changes.Load()
	if _, err := client.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx,
		ct.CNP("second", "Baseline", 5, ct.NamespacesSubject(ct.Sel())), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for changes.Load() == before {
		select {
		case <-ctx.Done():
			t.Fatal("a created ClusterNetworkPolicy did not mark the controller dirty")
		case <-time.After(10 * time.Millisecond):
		}
	}

	// The CRD goes away: nothing stale is enforced.
	disc.Resources = nil
	before = changes.Load()
	w.check(ctx)
	if got, err := w.list(); err != nil || got != nil {
		t.Fatalf("after the API went away: list = %v, %v; want nothing", got, err)
	}
	if w.informer != nil {
		t.Error("the informer still runs after the API went away")
	}
	if changes.Load() == before {
		t.Error("dropping the ClusterNetworkPolicies did not mark the controller dirty")
	}
	if v := testutil.ToFloat64(m.ClusterPolicyAPI); v != 0 {
		t.Errorf("nftpolicy_cluster_network_policy_api_enabled = %v, want 0", v)
	}
}

// TestClusterPoliciesWithoutClient: no client means v1 only, decided at once.
func TestClusterPoliciesWithoutClient(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	w := newClusterPolicies(nil, time.Hour, 0, logger, NewMetrics(), func() {})
	w.run(ctx)
	select {
	case <-w.decided:
	default:
		t.Fatal("not decided")
	}
	if got, err := w.list(); err != nil || got != nil {
		t.Fatalf("list = %v, %v; want nothing", got, err)
	}
}

// TestClusterPolicyProblemsReported checks the Event, log-once and metrics
// path for a ClusterNetworkPolicy the compiler cannot use as written.
func TestClusterPolicyProblemsReported(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// domainNames in a Deny rule: the CRD admits it, the API documents
	// domainNames for Accept rules only.
	bad := ct.CNP("domains", "Admin", 3, ct.NamespacesSubject(ct.Sel()), ct.CNPEgress(ct.CNPRule("dns", "Deny", ct.ToDomains("example.com"))))
	bad.UID = "uid-1"
	if len(compile.ValidateClusterPolicy(bad)) == 0 {
		t.Fatal("test premise: the compiler reports no problem in a Deny rule's domainNames peer")
	}
	good := ct.CNP("fine", "Baseline", 3, ct.NamespacesSubject(ct.Sel()))
	// Over compile.MaxPolicyCost: rejected, and reported as such.
	huge := ct.CNP("huge", "Admin", 4, ct.NamespacesSubject(ct.Sel()), ct.CNPEgress(ct.CNPRule("deny", "Deny", ct.ToNetworks(ct.ScatteredExcepts(compile.MaxPolicyCost, 1)...))))
	client := npafake.NewSimpleClientset(bad, good, huge)
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{served}
	m := NewMetrics()
	w := newClusterPolicies(client, time.Hour, 0, logger, m, func() {})
	defer w.stop("test over")
	w.check(ctx)
	select {
	case <-w.recheck:
	case <-ctx.Done():
		t.Fatal("informer did not sync")
	}
	w.check(ctx)
	cnps, err := w.list()
	if err != nil || len(cnps) != 3 {
		t.Fatalf("list = %v, %v", len(cnps), err)
	}
	prog := compile.Build(compile.Input{NodeName: "n1", ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{bad, good}})
	rec := record.NewFakeRecorder(10)
	rec.IncludeObject = true
	w.report(prog, rec, "n1")
	select {
	case ev := <-rec.Events:
		for _, want := range []string{"Warning", "InvalidClusterNetworkPolicy", "domainNames", "nftpolicy on n1",
			"involvedObject{kind=ClusterNetworkPolicy,apiVersion=policy.networking.k8s.io/v1beta1}"} {
			if !strings.Contains(ev, want) {
				t.Errorf("event %q lacks %q", ev, want)
			}
		}
	default:
		t.Fatal("no Event for the invalid ClusterNetworkPolicy")
	}
	if v := testutil.ToFloat64(m.InvalidClusterPolicies); v != 1 {
		t.Errorf("nftpolicy_invalid_cluster_network_policies = %v, want 1", v)
	}
	problems := testutil.ToFloat64(m.ClusterPolicyProblems)
	if problems < 1 {
		t.Errorf("nftpolicy_cluster_network_policy_problems_total = %v, want >= 1", problems)
	}

	// The same problems again: no second Event, no second count.
	w.report(prog, rec, "n1")
	select {
	case ev := <-rec.Events:
		t.Errorf("unchanged problems reported again: %q", ev)
	default:
	}
	if v := testutil.ToFloat64(m.ClusterPolicyProblems); v != problems {
		t.Errorf("unchanged problems counted again: %v, then %v", problems, v)
	}

	// Fixed: the gauge drops; a later regression is reported afresh.
	w.report(compile.Build(compile.Input{NodeName: "n1", ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{good}}), rec, "n1")
	if v := testutil.ToFloat64(m.InvalidClusterPolicies); v != 0 {
		t.Errorf("after the fix: nftpolicy_invalid_cluster_network_policies = %v, want 0", v)
	}
	w.report(prog, rec, "n1")
	select {
	case <-rec.Events:
	default:
		t.Error("problems that came back were not reported")
	}

	w.report(compile.Build(compile.Input{NodeName: "n1", ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{good, huge}}), rec, "n1")
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, "Warning PolicyTooLarge") || !strings.Contains(ev, "too large to compile") {
			t.Errorf("event %q does not report the rejection", ev)
		}
	default:
		t.Error("no Event for the rejected ClusterNetworkPolicy")
	}
	if v := testutil.ToFloat64(m.RejectedPolicies.WithLabelValues("ClusterNetworkPolicy")); v != 1 {
		t.Errorf("nftpolicy_rejected_policies{kind=ClusterNetworkPolicy} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.PoliciesRejected.WithLabelValues("ClusterNetworkPolicy", "cost")); v != 1 {
		t.Errorf("nftpolicy_policies_rejected_total{kind=ClusterNetworkPolicy,reason=cost} = %v, want 1", v)
	}
}

func TestNodeChanged(t *testing.T) {
	node := func(labels map[string]string, heartbeat int64, addrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.Unix(heartbeat, 0)}}
		return n
	}
	base := node(map[string]string{"zone": "a"}, 1, "10.0.0.1")
	for _, tc := range []struct {
		name string
		cur  *corev1.Node
		want bool
	}{
		{"heartbeat", node(map[string]string{"zone": "a"}, 2, "10.0.0.1"), false},
		{"label changed", node(map[string]string{"zone": "b"}, 1, "10.0.0.1"), true},
		{"label added", node(map[string]string{"zone": "a", "x": ""}, 1, "10.0.0.1"), true},
		{"address changed", node(map[string]string{"zone": "a"}, 1, "10.0.0.2"), true},
		{"address added", node(map[string]string{"zone": "a"}, 1, "10.0.0.1", "fd00::1"), true},
	} {
		if got := nodeChanged(base, tc.cur); got != tc.want {
			t.Errorf("%s: nodeChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !nodeChanged(base, "not a node") {
		t.Error("an unexpected object must count as a change")
	}
	slim := slim.Node(node(map[string]string{"zone": "a"}, 5, "10.0.0.1"))
	if len(slim.Status.Conditions) != 0 || slim.Labels["zone"] != "a" || len(slim.Status.Addresses) != 1 {
		t.Errorf("slimNode kept %+v", slim)
	}
}

func TestInputsFingerprintClusterObjects(t *testing.T) {
	cnp := func(rv string) *npav1beta1.ClusterNetworkPolicy {
		p := ct.CNP("p", "Admin", 1, ct.NamespacesSubject(ct.Sel()))
		p.ResourceVersion = rv
		return p
	}
	node := func(rv string, labels map[string]string, addrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: rv, Labels: labels}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		return n
	}
	in := func(c *npav1beta1.ClusterNetworkPolicy, n *corev1.Node) compile.Input {
		var out compile.Input
		if c != nil {
			out.ClusterPolicies = []*npav1beta1.ClusterNetworkPolicy{c}
		}
		if n != nil {
			out.Nodes = []*corev1.Node{n}
		}
		return out
	}
	labels := map[string]string{"a": "1", "b": "2", "c": "3"}
	base := InputsFingerprint(in(cnp("7"), node("1", labels, "10.0.0.1", "fd00::1")))
	same := map[string]compile.Input{
		"node heartbeat (resourceVersion only)": in(cnp("7"), node("2", labels, "10.0.0.1", "fd00::1")),
		"same labels, new map":                  in(cnp("7"), node("1", map[string]string{"c": "3", "b": "2", "a": "1"}, "10.0.0.1", "fd00::1")),
	}
	differ := map[string]compile.Input{
		"policy resourceVersion": in(cnp("8"), node("1", labels, "10.0.0.1", "fd00::1")),
		"policy gone":            in(nil, node("1", labels, "10.0.0.1", "fd00::1")),
		"node gone":              in(cnp("7"), nil),
		"node label":             in(cnp("7"), node("1", map[string]string{"a": "1", "b": "2", "c": "4"}, "10.0.0.1", "fd00::1")),
		"label moved to key":     in(cnp("7"), node("1", map[string]string{"a": "1", "b": "2", "c3": ""}, "10.0.0.1", "fd00::1")),
		"node address":           in(cnp("7"), node("1", labels, "10.0.0.2", "fd00::1")),
	}
	for name, i := range same {
		if got := InputsFingerprint(i); got != base {
			t.Errorf("%s: fingerprint changed (%#x != %#x)", name, got, base)
		}
	}
	for name, i := range differ {
		if got := InputsFingerprint(i); got == base {
			t.Errorf("%s: fingerprint unchanged (%#x)", name, got)
		}
	}
}

func TestConfigRejectsNegativePeriods(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ClusterPolicyCheckPeriod: -time.Second}, "cluster policy check period -1s: must not be negative"},
		{Config{ProgramRefreshDelay: -time.Millisecond}, "program refresh delay -1ms: must not be negative"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
}
