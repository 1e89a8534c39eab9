package compile_test

// The tracker against the full build: after every change of a long random
// sequence (pkg/scenario/scenariogen), the ruleset the tracker keeps must
// equal Render(Build(the same objects)).

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
)

var (
	seeds = flag.Int("seeds", 40, "scenarios to run event sequences on")
	steps = flag.Int("steps", 100, "events per scenario")
)

// world is the objects of one scenario as events change them.
type world struct {
	in   compile.Input
	pods map[string]*corev1.Pod
	r    *rand.Rand
	next int
	// labelSets and ipPool are what new and changed pods draw from: the
	// scenario's own labels and addresses (so selections change and
	// addresses are reused) and fresh ones.
	labelSets []map[string]string
	ipPool    [][]string
	// specs are policy specs to add and change policies with: this
	// scenario's and another's.
	specs []networkingv1.NetworkPolicySpec
	// cnpSpecs are ClusterNetworkPolicy specs, likewise.
	cnpSpecs []npav1beta1.ClusterNetworkPolicySpec
}

func newWorld(seed uint64, node string) *world {
	sc := scenariogen.Generate(seed)
	in := sc.Input(node, sc.NodeNames(scenariogen.Nodes), nil)
	w := &world{in: in, pods: map[string]*corev1.Pod{}, r: rand.New(rand.NewPCG(seed, 7))}
	for _, p := range in.Pods {
		w.pods[p.Namespace+"/"+p.Name] = p
		w.labelSets = append(w.labelSets, p.Labels)
		var ips []string
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		w.ipPool = append(w.ipPool, ips)
	}
	w.labelSets = append(w.labelSets, nil)
	w.cnpSpecs = clusterSpecs(seed, node)
	for _, in := range []compile.Input{in, scenariogen.Generate(seed+1000).Input(node, nil, nil)} {
		for _, np := range in.Policies {
			w.specs = append(w.specs, np.Spec)
		}
	}
	w.specs = append(w.specs, sharedPeerSpecs(seed)...)
	return w
}

// sharedPeerSpecs are policy specs whose peers say different things and
// select the same pods (every pod; every pod of the policy's namespace),
// as issue 43's churning policy: shared by content where sets of that
// many pods are (ShareFrom), and edited in place by portsEdit.
func sharedPeerSpecs(seed uint64) []networkingv1.NetworkPolicySpec {
	absent := func(i int) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: fmt.Sprintf("nope-%d", i), Operator: metav1.LabelSelectorOpDoesNotExist}}}
	}
	var every, local []networkingv1.NetworkPolicyPeer
	for i := range 2 + int(seed%3) {
		every = append(every, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: absent(i)})
		local = append(local, networkingv1.NetworkPolicyPeer{PodSelector: absent(i)})
	}
	every = append(every, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})
	local = append(local, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}})
	return []networkingv1.NetworkPolicySpec{
		{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: every, Ports: testPorts(80)}}},
		{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: local}, {From: every[1:], Ports: testPorts(81)}},
			Egress:  []networkingv1.NetworkPolicyEgressRule{{To: every[:2], Ports: testPorts(53)}}},
	}
}

// testPorts is one TCP port.
func testPorts(port int32) []networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(port)
	return []networkingv1.NetworkPolicyPort{{Port: &p}}
}

// portsEdit changes the ports of a policy's rules and nothing else, as
// issue 43's churning user does: the peers, and the sets they share,
// stay.
func (w *world) portsEdit(np *networkingv1.NetworkPolicy) {
	pick := func() []networkingv1.NetworkPolicyPort {
		if w.r.IntN(3) == 0 {
			return nil
		}
		return testPorts(int32(80 + w.r.IntN(3)))
	}
	for i := range np.Spec.Ingress {
		np.Spec.Ingress[i].Ports = pick()
	}
	for i := range np.Spec.Egress {
		np.Spec.Egress[i].Ports = pick()
	}
}

func (w *world) input() compile.Input {
	in := w.in
	in.Pods = nil
	keys := make([]string, 0, len(w.pods))
	for k := range w.pods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		in.Pods = append(in.Pods, w.pods[k])
	}
	return in
}

func (w *world) anyPod() *corev1.Pod {
	keys := make([]string, 0, len(w.pods))
	for k := range w.pods {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	return w.pods[keys[w.r.IntN(len(keys))]]
}

func (w *world) freshIPs() []string {
	w.next++
	switch w.r.IntN(3) {
	case 0:
		return []string{fmt.Sprintf("10.244.%d.%d", 1+w.r.IntN(2), 100+w.next%150)}
	case 1:
		return []string{fmt.Sprintf("fd00:10:244:%d::%x", 1+w.r.IntN(2), 0x100+w.next)}
	}
	return []string{fmt.Sprintf("10.244.%d.%d", 1+w.r.IntN(2), 100+w.next%150), fmt.Sprintf("fd00:10:244:%d::%x", 1+w.r.IntN(2), 0x100+w.next)}
}

func setIPs(p *corev1.Pod, ips []string) {
	p.Status.PodIPs = nil
	p.Status.PodIP = ""
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
}

// podEvent changes, adds or deletes one pod, as an informer would deliver
// it (a new object for every change), and returns its key and new state.
func (w *world) podEvent() (string, *corev1.Pod, string) {
	base := w.anyPod()
	if base == nil || w.r.IntN(5) == 0 {
		// A new pod: a copy of a pod's spec in some namespace.
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if base != nil {
			p = base.DeepCopy()
		}
		ns := w.in.Namespaces[w.r.IntN(len(w.in.Namespaces))].Name
		w.next++
		p.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("new-%d", w.next),
			Labels: w.labelSets[w.r.IntN(len(w.labelSets))], CreationTimestamp: metav1.Unix(int64(w.next), 0)}
		p.Spec.NodeName = scenariogen.Nodes[w.r.IntN(len(scenariogen.Nodes))]
		if w.r.IntN(4) == 0 {
			setIPs(p, w.ipPool[w.r.IntN(len(w.ipPool))]) // an address another pod may hold
		} else {
			setIPs(p, w.freshIPs())
		}
		key := ns + "/" + p.Name
		w.pods[key] = p
		return key, p, "add"
	}
	key := base.Namespace + "/" + base.Name
	p := base.DeepCopy()
	var what string
	switch w.r.IntN(9) {
	case 0, 1:
		delete(w.pods, key)
		return key, nil, "delete"
	case 2, 3:
		p.Labels = w.labelSets[w.r.IntN(len(w.labelSets))]
		what = "relabel"
	case 4:
		setIPs(p, w.freshIPs())
		what = "new address"
	case 5:
		setIPs(p, w.ipPool[w.r.IntN(len(w.ipPool))])
		what = "reused address"
	case 6:
		p.Status.Phase = corev1.PodSucceeded
		what = "completed"
	case 7:
		setIPs(p, nil)
		what = "address released"
	default:
		p.Spec.Containers = []corev1.Container{{Name: "main", Ports: []corev1.ContainerPort{
			{Name: []string{"http", "dns", "metrics", "serve-80"}[w.r.IntN(4)], ContainerPort: int32(80 + w.r.IntN(3)), Protocol: corev1.ProtocolTCP}}}}
		what = "ports"
	}
	w.pods[key] = p
	return key, p, what
}

// newTracker returns a tracker built from the world's objects, and its
// program.
func newTracker(t *testing.T, cfg compile.RenderConfig, w *world) (*compile.Tracker, *compile.Program) {
	t.Helper()
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prog, _, err := tr.Rebuild(w.input())
	if err != nil {
		t.Fatal(err)
	}
	return tr, prog
}

// policyEvent adds, changes or deletes one NetworkPolicy (a new object
// for every change, as an informer delivers it) and returns its key and
// new state.
func (w *world) policyEvent() (string, *networkingv1.NetworkPolicy, string) {
	pols := w.in.Policies
	x := w.r.IntN(13)
	if len(pols) == 0 || x < 3 {
		w.next++
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{
			Namespace: w.in.Namespaces[w.r.IntN(len(w.in.Namespaces))].Name, Name: fmt.Sprintf("q%d", w.next)}}
		if len(w.specs) > 0 {
			np.Spec = *w.specs[w.r.IntN(len(w.specs))].DeepCopy()
		}
		if w.r.IntN(4) == 0 {
			np.Annotations = stagedAnnotation(true)
		}
		if len(pols) > 0 && w.r.IntN(2) == 0 {
			// A name that extends another's: chains are ordered by key.
			other := pols[w.r.IntN(len(pols))]
			name := other.Name + []string{"-a", "0", "a"}[w.r.IntN(3)]
			if !slices.ContainsFunc(pols, func(p *networkingv1.NetworkPolicy) bool { return p.Namespace == other.Namespace && p.Name == name }) {
				np.Namespace, np.Name = other.Namespace, name
			}
		}
		w.in.Policies = append(pols[:len(pols):len(pols)], np)
		return np.Namespace + "/" + np.Name, np, "policy added"
	}
	i := w.r.IntN(len(pols))
	key := pols[i].Namespace + "/" + pols[i].Name
	if x < 5 {
		w.in.Policies = append(pols[:i:i], pols[i+1:]...)
		return key, nil, "policy deleted"
	}
	np := pols[i].DeepCopy()
	var what string
	switch x {
	case 5, 6:
		np.Spec = *w.specs[w.r.IntN(len(w.specs))].DeepCopy()
		what = "policy rewritten"
	case 7:
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: w.labelSets[w.r.IntN(len(w.labelSets))]}
		what = "policy reselected"
	case 8:
		np.Spec.PolicyTypes = [][]networkingv1.PolicyType{nil, {networkingv1.PolicyTypeIngress}, {networkingv1.PolicyTypeEgress},
			{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}[w.r.IntN(4)]
		what = "policy types changed"
	case 10:
		np.Annotations = stagedAnnotation(!compile.Staged(np))
		what = "policy staged toggled"
	case 11, 12:
		w.portsEdit(np)
		what = "policy ports changed"
	default:
		if len(np.Spec.Ingress) > 0 {
			np.Spec.Ingress = np.Spec.Ingress[1:]
		}
		if len(np.Spec.Egress) > 0 {
			np.Spec.Egress = np.Spec.Egress[:len(np.Spec.Egress)-1]
		}
		what = "policy rules dropped"
	}
	w.in.Policies = append(append(pols[:i:i], np), pols[i+1:]...)
	return key, np, what
}

// otherEvent changes something that is not a pod: those take the full build.
func (w *world) otherEvent() string {
	switch w.r.IntN(4) {
	case 0:
		if len(w.in.Policies) > 0 {
			i := w.r.IntN(len(w.in.Policies))
			w.in.Policies = append(w.in.Policies[:i:i], w.in.Policies[i+1:]...)
			return "policy deleted"
		}
	case 1:
		i := w.r.IntN(len(w.in.Namespaces))
		ns := w.in.Namespaces[i].DeepCopy()
		ns.Labels = map[string]string{compile.NamespaceNameLabel: ns.Name, "team": []string{"a", "b"}[w.r.IntN(2)]}
		w.in.Namespaces = append(append(w.in.Namespaces[:i:i], ns), w.in.Namespaces[i+1:]...)
		return "namespace relabelled"
	case 2:
		// Stages or unstages every NetworkPolicy of the namespace.
		i := w.r.IntN(len(w.in.Namespaces))
		ns := w.in.Namespaces[i].DeepCopy()
		ns.Annotations = stagedAnnotation(!compile.Staged(ns))
		w.in.Namespaces = append(append(w.in.Namespaces[:i:i], ns), w.in.Namespaces[i+1:]...)
		return "namespace staged toggled"
	}
	if len(w.in.ClusterPolicies) > 0 {
		i := w.r.IntN(len(w.in.ClusterPolicies))
		w.in.ClusterPolicies = append(w.in.ClusterPolicies[:i:i], w.in.ClusterPolicies[i+1:]...)
		return "cluster policy deleted"
	}
	return "nothing"
}

// namespaceEvent relabels a namespace (a new object, as an informer
// delivers it), or now and then toggles its stagedness, and returns its
// name and new state.
func (w *world) namespaceEvent() (string, *corev1.Namespace, string) {
	i := w.r.IntN(len(w.in.Namespaces))
	ns := w.in.Namespaces[i].DeepCopy()
	what := "namespace relabelled"
	if w.r.IntN(6) == 0 {
		ns.Annotations = stagedAnnotation(!compile.Staged(ns))
		what = "namespace staged toggled"
	} else {
		l := map[string]string{compile.NamespaceNameLabel: ns.Name}
		for k, vals := range map[string][]string{"team": {"a", "b"}, "env": {"prod", "dev"}} {
			if x := w.r.IntN(3); x < 2 {
				l[k] = vals[x]
			}
		}
		ns.Labels = l
	}
	w.in.Namespaces = append(append(w.in.Namespaces[:i:i], ns), w.in.Namespaces[i+1:]...)
	return ns.Name, ns, what
}

// namespaceFallbacks are the reasons ApplyNamespace may leave a change to a
// rebuild outside queue mode: its stagedness, or one of its pods as
// ApplyPod would leave it.
var namespaceFallbacks = []compile.Fallback{compile.FallbackNamespaceStaged, compile.FallbackAddressShared, compile.FallbackNodeAddress,
	compile.FallbackDNSCapture, compile.FallbackStaged, compile.FallbackSharedSet, compile.FallbackCost, compile.FallbackDomainNames}

// stagedAnnotation is the annotations of a staged object, or of one
// annotated with a value that does not stage it.
func stagedAnnotation(staged bool) map[string]string {
	if staged {
		return map[string]string{compile.StagedAnnotation: "true"}
	}
	return map[string]string{compile.StagedAnnotation: "false"}
}

// TestTrackerEqualsFullBuild applies random event sequences (pods added,
// deleted, relabelled, readdressed with new and reused addresses,
// completed, re-ported; policies, cluster policies and namespaces changed,
// staged and unstaged) and checks after every step that the tracked
// ruleset equals the full build's, in hybrid and queue mode, for each
// node's view; every third seed builds with the staged policies enforced.
func TestTrackerEqualsFullBuild(t *testing.T) {
	var nsEvents, fastNS int
	var fast, reshaped, rebuilt, pod, pol, fastPol, hybridPol, cpol, fastCPol, trackableCPol, stagedPol, sharedPol, sharedCPol, sharedPod, sharedEdits, costPol, overBudgetAlone, readmits, programs, podPrograms int
	for _, cfg := range []compile.RenderConfig{
		{Mode: compile.ModeHybrid, QueueVariant: compile.QueueNative},
		// The agent's default: hybrid with the deny log, whose
		// ClusterNetworkPolicy Deny rules have chains of their own.
		{Mode: compile.ModeHybrid, QueueVariant: compile.QueueNative, DenyLogGroup: 5},
		{Mode: compile.ModeQueue, QueueVariant: compile.QueueNative},
		// The deny log gives every isolation chain a chain of its own.
		{Mode: compile.ModeKernel, DenyLogGroup: 5},
		// Without it, cluster policy changes are tracked in kernel mode
		// (no DNS learning there).
		{Mode: compile.ModeKernel},
		// The staged log: staged policy changes and a pod's first or last
		// use of it rebuild; the rest is tracked as without it.
		{Mode: compile.ModeKernel, StagedLogGroup: 10},
		// Runtime verification's sampled copies come with the rules the
		// tracker renders.
		{Mode: compile.ModeKernel, Verify: compile.VerifyConfig{Group: 9, PerMillion: 10_000}},
	} {
		mode := cfg.Mode
		n := *seeds
		if mode == compile.ModeKernel {
			n = (n + 1) / 2 // what kernel mode adds (the deny log: a chain per isolation chain) shows in fewer runs
		}
		for seed := uint64(1); seed <= uint64(n); seed++ {
			node := scenariogen.Nodes[int(seed)%len(scenariogen.Nodes)]
			w := newWorld(seed, node)
			w.in.EnforceStaged = seed%3 == 0
			w.in.Budgets = worldBudgets
			tr, prevBuilt := newTracker(t, cfg, w)
			for step := 0; step < *steps; step++ {
				var what, key string
				podStep, policyStep := false, false
				if x := w.r.IntN(15); x == 0 {
					what = w.otherEvent()
					if _, _, err := tr.Rebuild(w.input()); err != nil {
						t.Fatal(err)
					}
					rebuilt++
				} else if x == 14 {
					var ns *corev1.Namespace
					key, ns, what = w.namespaceEvent()
					nsEvents++
					f := tr.ApplyNamespace(key, ns)
					switch {
					case mode == compile.ModeQueue:
						if f != compile.FallbackQueueMode {
							t.Fatalf("mode %s seed %d step %d (%s %s): fallback %q, want %q", mode, seed, step, what, key, f, compile.FallbackQueueMode)
						}
					case f == compile.NoFallback:
						fastNS++
					case !slices.Contains(namespaceFallbacks, f):
						t.Fatalf("mode %s seed %d step %d (%s %s): fallback %q", mode, seed, step, what, key, f)
					}
					if f != compile.NoFallback {
						if _, _, err := tr.Rebuild(w.input()); err != nil {
							t.Fatal(err)
						}
						rebuilt++
					}
				} else if x <= 3 {
					var np *networkingv1.NetworkPolicy
					key, np, what = w.policyEvent()
					pol++
					if mode != compile.ModeQueue {
						hybridPol++
					}
					usedShared := usesSharedSet(prevBuilt, key)
					f := tr.ApplyPolicy(key, np)
					policyStep = f == compile.NoFallback && np != nil
					if usedShared && what == "policy ports changed" && mode != compile.ModeQueue {
						// The peers stay, and so do the sets they share.
						if f == compile.FallbackSharedSet {
							t.Fatalf("mode %s seed %d step %d (%s %s): an edit that keeps the peers of shared sets fell back (%q)", mode, seed, step, what, key, f)
						}
						if f == compile.NoFallback {
							sharedEdits++
						}
					}
					if f == compile.FallbackStaged && cfg.StagedLogGroup != 0 {
						stagedPol++
					} else if f == compile.FallbackSharedSet && mode != compile.ModeQueue {
						sharedPol++
					} else if f == compile.FallbackCost && mode != compile.ModeQueue && worldBudgets != (compile.Budgets{}) {
						costPol++
					} else if want := policyFallback(mode); f != want {
						t.Fatalf("mode %s seed %d step %d (%s %s): fallback %q, want %q", mode, seed, step, what, key, f, want)
					}
					if f == compile.NoFallback {
						fastPol++
					} else {
						if _, _, err := tr.Rebuild(w.input()); err != nil {
							t.Fatal(err)
						}
						rebuilt++
					}
				} else if x <= 5 {
					var old, cnp *npav1beta1.ClusterNetworkPolicy
					key, old, cnp, what = w.clusterEvent()
					cpol++
					// What the tracker applies alone: outside queue mode and
					// the deny log, without domainNames peers.
					want := clusterFallback(mode, cfg, w.enforcedCNP(old), w.enforcedCNP(cnp))
					if want == compile.NoFallback {
						trackableCPol++
					}
					f := tr.ApplyClusterPolicy(key, cnp)
					if f == compile.FallbackStaged && cfg.StagedLogGroup != 0 {
						want = f
					}
					if f == compile.FallbackSharedSet && want == compile.NoFallback {
						want = f
						sharedCPol++
					}
					if f != want {
						t.Fatalf("mode %s seed %d step %d (%s %s): fallback %q, want %q", mode, seed, step, what, key, f, want)
					}
					if f == compile.NoFallback {
						fastCPol++
					} else {
						if _, _, err := tr.Rebuild(w.input()); err != nil {
							t.Fatal(err)
						}
						rebuilt++
					}
				} else {
					var p *corev1.Pod
					key, p, what = w.podEvent()
					pod++
					podStep = true
					prev := tr.Ruleset()
					if _, f := tr.ApplyPod(key, p); f == compile.NoFallback {
						fast++
						if tr.Ruleset() != prev {
							reshaped++
						}
					} else {
						if f == compile.FallbackSharedSet {
							sharedPod++
						}
						if _, _, err := tr.Rebuild(w.input()); err != nil {
							t.Fatal(err)
						}
						rebuilt++
					}
				}
				built := compile.Build(w.input())
				if podStep && worldBudgets != (compile.Budgets{}) && readmitted(prevBuilt, built) {
					// Pods that leave lower charges at the next build only
					// (docs/security.md): the consistency check's rebuild
					// admits the policy.
					if _, _, err := tr.Rebuild(w.input()); err != nil {
						t.Fatal(err)
					}
					readmits++
				}
				prevBuilt = built
				if policyStep && rejectedForBudget(built, key) {
					overBudgetAlone++
				}
				if checkProgram(t, tr, built, func() string {
					return fmt.Sprintf("mode %s seed %d node %s step %d (%s %s)", mode, seed, node, step, what, key)
				}) {
					programs++
					if podStep {
						podPrograms++
					}
				}
				want, err := compile.Render(built, cfg)
				if err != nil {
					t.Fatal(err)
				}
				// Unexported fields too: what the renderer records for the
				// tracker must be what a full render records.
				if diff := cmp.Diff(want, tr.Ruleset(), cmpopts.EquateEmpty(), cmp.Exporter(func(reflect.Type) bool { return true })); diff != "" {
					t.Fatalf("mode %s seed %d node %s step %d (%s %s): tracked ruleset differs from the full build (-full +tracked):\n%s",
						mode, seed, node, step, what, key, diff)
				}
				if !compile.NotSubjectIntact() {
					t.Fatalf("mode %s seed %d node %s step %d (%s %s): the shared record of pods that are not local was written", mode, seed, node, step, what, key)
				}
			}
		}
	}
	t.Logf("%d pod events applied by the tracker (%d of them creating or deleting combination chains), "+
		"%d policy events applied alone (of %d; %d outside queue mode), "+
		"%d cluster policy events applied alone (of %d; %d trackable), %d changes rebuilt (%d pod events in all), %d staged policy events rebuilt for the staged log, "+
		"%d policy, %d cluster policy and %d pod events rebuilt for shared peer sets",
		fast, reshaped, fastPol, pol, hybridPol, fastCPol, cpol, trackableCPol, rebuilt, pod, stagedPol, sharedPol, sharedCPol, sharedPod)
	t.Logf("%d programs compared with the full build, %d of them after pod events", programs, podPrograms)
	t.Logf("%d edits of policies using shared peer sets applied alone", sharedEdits)
	// With sets shared in small clusters, edits of policies whose peers
	// share sets must take the incremental path.
	if requireSharedEdits && sharedEdits == 0 {
		t.Error("no edit of a policy using a shared peer set was applied alone")
	}
	t.Logf("%d policy events rebuilt for budgets, %d applied alone leaving the policy rejected for its budget, %d pod events readmitting a policy (rebuilt)",
		costPol, overBudgetAlone, readmits)
	// With small budgets, a policy edited past its budget is rejected by
	// the tracker as the build rejects it.
	if worldBudgets != (compile.Budgets{}) && overBudgetAlone == 0 {
		t.Error("no policy change leaving the policy rejected for its budget was applied alone")
	}
	t.Logf("%d of %d namespace events applied by the tracker", fastNS, nsEvents)
	// The check is only worth something if namespace changes take the
	// incremental path: most of those outside queue mode (with small
	// budgets, many fall back for cost).
	if worldBudgets == (compile.Budgets{}) && fastNS < nsEvents/3 {
		t.Errorf("only %d of %d namespace events were applied by the tracker", fastNS, nsEvents)
	}
	// The program is checked after most pod events: those after a policy
	// change wait for the next rebuild (Stale).
	if podPrograms < fast/4 {
		t.Errorf("only %d of %d pod events applied were followed by a program to compare", podPrograms, fast)
	}
	// Pods that create or delete combination chains take their own path.
	if reshaped < pod/50 {
		t.Errorf("only %d of %d pod events created or deleted combination chains", reshaped, pod)
	}
	// The check is only worth something if many cluster policy changes
	// take the incremental path.
	if fastCPol+sharedCPol < cpol/4 {
		t.Errorf("only %d of %d cluster policy events were applied alone", fastCPol, cpol)
	}
	// Queue mode rebuilds every policy change; the other modes never.
	if fastPol+stagedPol+sharedPol+costPol != hybridPol {
		t.Errorf("%d of %d policy events outside queue mode were applied alone", fastPol, hybridPol)
	}
	// The check is only worth something if most pod events take the
	// incremental path.
	if fast+sharedPod < pod/2 {
		t.Errorf("only %d of %d pod events were applied in place", fast, pod)
	}
}

// TestTrackerDelta checks that the returned delta is exactly the difference
// between the rulesets before and after; when a pod change replaces the
// ruleset, between the sets the two share, and the previous ruleset keeps
// its chains.
func TestTrackerDelta(t *testing.T) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid}
	reshaped := 0
	defer func() {
		if reshaped == 0 {
			t.Error("no pod event created or deleted a combination chain")
		}
	}()
	for seed := uint64(1); seed <= 40; seed++ {
		w := newWorld(seed, scenariogen.Nodes[0])
		tr, _ := newTracker(t, cfg, w)
		for step := 0; step < 60; step++ {
			prev := tr.Ruleset()
			before := elementsBySet(prev)
			chains := slices.Clone(prev.ChainOrder)
			sets := maps.Clone(prev.Sets)
			key, p, what := w.podEvent()
			delta, f := tr.ApplyPod(key, p)
			if f != compile.NoFallback {
				if _, _, err := tr.Rebuild(w.input()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if cur := tr.Ruleset(); cur != prev {
				// A new ruleset (isolation chains created or deleted): the
				// one a Syncer holds keeps its chains, and the delta is the
				// change of the sets the two share.
				reshaped++
				if !slices.Equal(chains, prev.ChainOrder) {
					t.Fatalf("seed %d step %d (%s %s): the previous ruleset's chains changed: %v -> %v", seed, step, what, key, chains, prev.ChainOrder)
				}
				for n := range before {
					if name, _, _ := strings.Cut(n, " "); cur.Sets[name] != sets[name] {
						delete(before, n)
					}
				}
			}
			after := elementsBySet(tr.Ruleset())
			if tr.Ruleset() != prev {
				for n := range after {
					if name, _, _ := strings.Cut(n, " "); tr.Ruleset().Sets[name] != sets[name] {
						delete(after, n)
					}
				}
			}
			got := map[string]bool{}
			for _, d := range delta {
				for _, e := range d.Add {
					got["+"+d.Set+" "+compile.ElementID(&e)] = true
				}
				for _, e := range d.Delete {
					got["-"+d.Set+" "+compile.ElementID(&e)] = true
				}
			}
			want := map[string]bool{}
			for k := range after {
				if !before[k] {
					want["+"+k] = true
				}
			}
			for k := range before {
				if !after[k] {
					want["-"+k] = true
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("seed %d step %d (%s %s): delta is not the ruleset's change (-want +got):\n%s", seed, step, what, key, diff)
			}
		}
	}
}

func elementsBySet(rs *compile.Ruleset) map[string]bool {
	out := map[string]bool{}
	for name, s := range rs.Sets {
		for i := range s.Elements {
			out[name+" "+compile.ElementID(&s.Elements[i])] = true
		}
	}
	return out
}

// TestApplyPolicyLeavesTheProgram checks that policy, cluster policy and
// pod changes never
// write the published program, which the evaluator reads concurrently: it
// stays equal to a build of the objects it was built from.
func TestApplyPolicyLeavesTheProgram(t *testing.T) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid}
	for seed := uint64(1); seed <= 20; seed++ {
		w := newWorld(seed, scenariogen.Nodes[0])
		tr, prog := newTracker(t, cfg, w)
		ref := compile.Build(w.input())
		applied := 0
		for step := 0; step < 60; step++ {
			if step%3 == 1 {
				name, _, cnp, _ := w.clusterEvent()
				if tr.ApplyClusterPolicy(name, cnp) != compile.NoFallback {
					break // domainNames peers: the rebuild would publish another program
				}
				applied++
			} else if step%3 == 0 {
				key, np, _ := w.policyEvent()
				if tr.ApplyPolicy(key, np) != compile.NoFallback {
					t.Fatalf("seed %d step %d: a policy change in hybrid mode needs a rebuild", seed, step)
				}
				applied++
			} else if key, p, _ := w.podEvent(); true {
				if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
					break // the rebuild would publish another program
				}
			}
		}
		if tr.Program() != prog || !tr.Stale() {
			t.Fatalf("seed %d: the tracker published another program, or says it is current", seed)
		}
		if diff := cmp.Diff([]any{ref.Pods, ref.Policies, ref.Selectors, ref.Tables, ref.ClusterPolicies, ref.NodeSets},
			[]any{prog.Pods, prog.Policies, prog.Selectors, prog.Tables, prog.ClusterPolicies, prog.NodeSets},
			cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Fatalf("seed %d: %d policy changes changed the published program (-built +published):\n%s", seed, applied, diff)
		}
	}
}

// TestTrackerEqualsFullBuildSharedSets is TestTrackerEqualsFullBuild with
// peer sets of two pods or more shared by content: the scenarios' peers
// come to select the same pods and apart again as pods and policies
// change, and the tracker must share and split sets as the build does, or
// fall back (FallbackSharedSet).
func TestTrackerEqualsFullBuildSharedSets(t *testing.T) {
	compile.ShareFrom(t, 2)
	requireSharedEdits = true
	defer func() { requireSharedEdits = false }()
	TestTrackerEqualsFullBuild(t)
}

// TestTrackerEqualsFullBuildBudgets is TestTrackerEqualsFullBuild with
// budgets that the scenarios' policies pass and fit in turns: a change
// the build surely rejects for the policy's budget is applied by the
// tracker (the policy rejected, fail-closed), one it may admit or reject
// goes to the build (FallbackCost), and the ruleset equals the build's
// after every step.
func TestTrackerEqualsFullBuildBudgets(t *testing.T) {
	worldBudgets = compile.Budgets{Policy: 70, Namespace: 400, ClusterPolicy: 1 << 30}
	// Fewer seeds: what the budgets add shows in a third of the runs.
	saved := *seeds
	*seeds = (saved + 2) / 3
	defer func() { worldBudgets, *seeds = compile.Budgets{}, saved }()
	TestTrackerEqualsFullBuild(t)
}

// worldBudgets are the budgets TestTrackerEqualsFullBuild builds with
// (zero: the defaults).
var worldBudgets compile.Budgets

// rejectedForBudget reports whether a program's NetworkPolicy (by key) is
// rejected for its own budget.
func rejectedForBudget(p *compile.Program, key string) bool {
	for i := range p.Policies {
		if pol := &p.Policies[i]; pol.Key == key {
			return pol.Rejected && pol.RejectedFor == compile.RejectedBudget
		}
	}
	return false
}

// readmitted reports whether a NetworkPolicy rejected for a budget in
// one program is admitted in the next.
func readmitted(before, after *compile.Program) bool {
	rejected := map[string]bool{}
	for i := range before.Policies {
		if before.Policies[i].RejectedFor == compile.RejectedBudget || before.Policies[i].RejectedFor == compile.RejectedNamespaceBudget {
			rejected[before.Policies[i].Key] = true
		}
	}
	for i := range after.Policies {
		if p := &after.Policies[i]; rejected[p.Key] && !p.Rejected {
			return true
		}
	}
	return false
}

// requireSharedEdits makes TestTrackerEqualsFullBuild require edits of
// policies using shared peer sets applied alone.
var requireSharedEdits bool

// usesSharedSet reports whether a program's NetworkPolicy (by key) has a
// rule whose peers use a set shared by content.
func usesSharedSet(p *compile.Program, key string) bool {
	for i := range p.Policies {
		pol := &p.Policies[i]
		if pol.Key != key {
			continue
		}
		for _, rules := range [][]compile.Rule{pol.Ingress, pol.Egress} {
			for j := range rules {
				for _, sid := range rules[j].Selectors {
					if int(sid) < len(p.Selectors) && p.Selectors[sid].Shared() {
						return true
					}
				}
			}
		}
	}
	return false
}
