package compile

import (
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// What an object makes, and the budgets that bound it.
//
// NetworkPolicyCost counts what an object says; what it makes depends on
// the pods: a selecting peer is matched against every pod of the
// namespaces it names and makes a set of those it selects, so one small
// object of distinct selectors that each select every pod makes peers x
// pods elements (issue 43: 2,300 such peers under MaxPolicyCost, 46
// million elements at 20,000 pods). The build therefore charges each
// NetworkPolicy, as it builds it, for what it makes:
//
//   - its entries, as NetworkPolicyCost counts them (rules, ports,
//     ipBlock ranges and exceptions);
//   - the pods of its namespace, which its podSelector is matched
//     against (before the charge: a rejected policy still isolates the
//     pods it selects);
//   - per selecting peer, the namespaces a namespaceSelector is matched
//     against and the pods the peer is matched against, charged before
//     they are matched;
//   - per distinct peer set it uses, its members (the set's elements),
//     charged as soon as the set is known. Peers that select the same
//     pods use one set, however they say it (peershare.go), and the
//     object pays for it once.
//
// The charge is made before each step's work and the build stops as soon
// as it passes the policy's budget: the policy is then rejected
// (RejectedBudget) and enforced as one past MaxPolicyCost, fail-closed on
// its own, and the peer sets it alone made are dropped, so a rejected
// object costs at most its budget (plus one namespace's or one set's
// worth of matching), whatever it says. The charge is the same on every
// node (it counts the cluster's pods, not the node's) and does not depend
// on other objects: each object pays for the sets it uses, shared or not.
//
// A namespace's NetworkPolicies share Budgets.Namespace: they are built
// in name order, each with at most what the namespace has left, and one
// that passes what is left is rejected (RejectedNamespaceBudget); what a
// rejected policy was charged stays spent. Pods joining or leaving what a
// policy selects change its charge: every build charges anew, and between
// two builds the Tracker adds a bound of what each pod adds before it
// applies it, leaving to the build a pod that might take a policy past
// its budget (tracker_budget.go).
//
// A ClusterNetworkPolicy, written by cluster admins, is charged the same
// way against a budget of its own (Budgets.ClusterPolicy), its nodes
// peers for the nodes they are matched against and select; it belongs to
// no namespace.

// RejectReason is why a policy was rejected (Policy.RejectedFor).
type RejectReason string

// The reasons a policy is rejected; "" when it is not.
const (
	// RejectedCost: its NetworkPolicyCost is over MaxPolicyCost.
	RejectedCost RejectReason = "cost"
	// RejectedBudget: what it makes is over Budgets.Policy.
	RejectedBudget RejectReason = "budget"
	// RejectedNamespaceBudget: what it makes is over what its namespace
	// has left of Budgets.Namespace.
	RejectedNamespaceBudget RejectReason = "namespace-budget"
)

// Budgets bound what NetworkPolicies make (Input.Budgets); zero fields
// take their defaults.
type Budgets struct {
	// Policy bounds what one NetworkPolicy makes.
	Policy int
	// Namespace bounds what the NetworkPolicies of one namespace make
	// together.
	Namespace int
	// ClusterPolicy bounds what one ClusterNetworkPolicy makes.
	ClusterPolicy int
}

// Default budgets.
//
// DefaultPolicyBudget: a policy whose peer selects every pod of the
// cluster is charged twice the pods (matched, then made), so at 150,000
// pods one such peer is 300,000 and three fit; at 20,000 pods a policy
// can use some 25 distinct sets of every pod. Building to the budget
// costs tens of milliseconds and tens of MiB (docs/performance.md,
// cost_amp_* of hack/bench.sh). DefaultNamespaceBudget lets a namespace
// make four such policies' worth, and DefaultClusterPolicyBudget lets one
// ClusterNetworkPolicy make as much (cluster admins write them; the CRD
// admits 1,250 selecting peers in one).
const (
	DefaultPolicyBudget        = 1_000_000
	DefaultNamespaceBudget     = 4_000_000
	DefaultClusterPolicyBudget = 4_000_000
)

// Defaults fills in the zero fields.
func (b *Budgets) Defaults() {
	if b.Policy <= 0 {
		b.Policy = DefaultPolicyBudget
	}
	if b.Namespace <= 0 {
		b.Namespace = DefaultNamespaceBudget
	}
	if b.ClusterPolicy <= 0 {
		b.ClusterPolicy = DefaultClusterPolicyBudget
	}
}

// costMeter charges one object's build against its budget.
type costMeter struct {
	budget, used int
	// counted are the peer sets already charged to the object.
	counted map[SelectorID]bool
	// scopes lists, per selecting peer charged, its namespace selector
	// (nil: the object's namespace): what the Tracker re-costs it by.
	scopes []labels.Selector
	// keys lists, per selecting peer charged, its canonical key.
	keys []string
}

// charge adds n and reports whether the object is still within its
// budget.
func (m *costMeter) charge(n int) bool {
	m.used += n
	return m.used <= m.budget
}

// newMeter returns the builder's meter reset for an object: one meter
// (and its map) serves every object of a build.
func (b *builder) newMeter(budget, used int) *costMeter {
	m := &b.meter
	clear(m.counted)
	m.scopes = m.scopes[:0]
	m.keys = m.keys[:0]
	m.budget, m.used = budget, used
	return m
}

// spent is what the object was charged, at most its budget.
func (m *costMeter) spent() int { return min(m.used, m.budget) }

// chargePolicy resolves a NetworkPolicy's selecting peers, charging what
// they make, and reports whether it stayed within the meter's budget.
// The peer sets are interned as compileRule would, which then finds them;
// on false those it interned are dropped again. Peers that do not parse
// are left to compileRule, which reports them.
func (b *builder) chargePolicy(np *networkingv1.NetworkPolicy, m *costMeter) bool {
	mark := b.markSelectors()
	ok := true
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			if ok && !b.chargePeer(np.Namespace, &ps[i], m) {
				ok = false
			}
		}
	}
	for i := range np.Spec.Ingress {
		peers(np.Spec.Ingress[i].From)
	}
	for i := range np.Spec.Egress {
		peers(np.Spec.Egress[i].To)
	}
	if !ok {
		b.dropSelectorsFrom(mark)
	}
	return ok
}

// chargePeer charges one peer of a NetworkPolicy in namespace ns.
func (b *builder) chargePeer(ns string, peer *networkingv1.NetworkPolicyPeer, m *costMeter) bool {
	if peer.IPBlock != nil || (peer.PodSelector == nil && peer.NamespaceSelector == nil) {
		return true
	}
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		s, ok := b.parsePeerSelector(peer.PodSelector)
		if !ok {
			return true
		}
		podSel = s
	}
	var nsSel labels.Selector
	if peer.NamespaceSelector != nil {
		s, ok := b.parsePeerSelector(peer.NamespaceSelector)
		if !ok {
			return true
		}
		nsSel = s
	}
	return b.chargeSelection(ns, nsSel, podSel, m)
}

// parsePeerSelector parses a peer's selector for chargePeer and keeps it
// for compileRule (peerSelector), which then does not parse it again.
// An invalid one is not kept: compileRule parses it and reports why.
func (b *builder) parsePeerSelector(sel *metav1.LabelSelector) (labels.Selector, bool) {
	s, ok := (&problems{}).parseSelector(field.NewPath("spec"), sel)
	if ok {
		if b.parsed == nil {
			b.parsed = map[*metav1.LabelSelector]labels.Selector{}
		}
		b.parsed[sel] = s
	}
	return s, ok
}

// peerSelector is problems.parseSelector for a NetworkPolicy peer's
// selector, reading what chargePeer parsed.
func (b *builder) peerSelector(pr *problems, path *field.Path, sel *metav1.LabelSelector) (labels.Selector, bool) {
	if s, ok := b.parsed[sel]; ok {
		return s, true
	}
	return pr.parseSelector(path, sel)
}

// chargeSelection charges the matching of a selection (as internSelector
// takes it) before it is done, then its set's members the first time the
// object uses the set.
func (b *builder) chargeSelection(ns string, nsSel, podSel labels.Selector, m *costMeter) bool {
	pods := len(b.byNS[ns])
	m.scopes = append(m.scopes, nsSel)
	if nsSel != nil {
		if !m.charge(len(b.byNS)) {
			return false
		}
		pods = 0
		for _, n := range b.matchNamespaces(nsSel) {
			pods += len(b.byNS[n])
		}
	}
	if !m.charge(pods) {
		return false
	}
	id, key := b.internSelectorKey(ns, nsSel, podSel)
	m.keys = append(m.keys, key)
	if m.counted[id] {
		return true
	}
	if m.counted == nil {
		m.counted = map[SelectorID]bool{}
	}
	m.counted[id] = true
	return m.charge(len(b.prog.Selectors[id].Members))
}

// dropSelectorsFrom removes the selectors interned and the aliases made
// since mark, and their pods' memberships: a rejected policy leaves no set
// behind.
func (b *builder) dropSelectorsFrom(mark selMark) {
	b.dropAliasesFrom(mark.aliases)
	for sid := len(b.prog.Selectors) - 1; sid >= mark.sels; sid-- {
		s := &b.prog.Selectors[sid]
		for _, pid := range s.Members {
			// IDs grow as selectors are interned: sid is the last
			// membership of each of its members.
			mo := &b.prog.Pods[pid].MemberOf
			*mo = (*mo)[:len(*mo)-1]
		}
		delete(b.sels, s.Key)
		b.dropContent(SelectorID(sid))
	}
	b.prog.Selectors = b.prog.Selectors[:mark.sels]
	b.selMatch = b.selMatch[:mark.sels]
}

// chargeBudget charges a NetworkPolicy being built with its pods resolved
// against its budget and its namespace's, recording its cost, and reports
// why it is rejected ("" when it is not; else pol is marked rejected and
// pr holds why).
func (b *builder) chargeBudget(pr *problems, np *networkingv1.NetworkPolicy, pol *Policy, static int) RejectReason {
	if b.nsCost == nil {
		b.nsCost = map[string]int{}
	}
	left := b.budgets.Namespace - b.nsCost[np.Namespace]
	// Its podSelector was matched against the namespace's pods: a
	// rejected policy must still isolate them, so that work is done
	// first, and charged.
	m := b.newMeter(min(b.budgets.Policy, left), static+len(b.byNS[np.Namespace]))
	ok := m.used <= m.budget && b.chargePolicy(np, m)
	pol.Cost = m.spent()
	b.nsCost[np.Namespace] += pol.Cost
	if ok {
		if b.peerScopes == nil {
			b.peerScopes = map[string][]labels.Selector{}
		}
		b.peerScopes[pol.Key] = slices.Clone(m.scopes)
		if b.peerKeys == nil {
			b.peerKeys = map[string][]string{}
		}
		b.peerKeys[pol.Key] = distinctKeys(m.keys)
		return ""
	}
	pol.Rejected = true
	pol.RejectedFor = RejectedBudget
	if left < b.budgets.Policy {
		pol.RejectedFor = RejectedNamespaceBudget
	}
	pr.rejectBudget(pol.RejectedFor, b.budgets, np.Namespace)
	return pol.RejectedFor
}

// rejectBudget reports a policy whose build passed its budget.
func (p *problems) rejectBudget(why RejectReason, b Budgets, ns string) {
	const enforced = "no rule of it allows anything and it still isolates the pods it selects"
	if why == RejectedNamespaceBudget {
		// What the policies before it used is left out: it changes with
		// every pod they select, and a changed problem is reported anew.
		p.add(field.NewPath("spec"), "too costly to build: namespace %s's NetworkPolicies together may make %d (entries, pods their selectors are matched against, peer set elements); built in name order, this one passed what the policies before it left; %s",
			ns, b.Namespace, enforced)
		return
	}
	p.add(field.NewPath("spec"), "too costly to build: what it makes (entries, pods its selectors are matched against, peer set elements) passed its budget of %d; %s",
		b.Policy, enforced)
}

// chargeClusterBudget charges a ClusterNetworkPolicy being built with its
// pods resolved against Budgets.ClusterPolicy, recording its cost, and
// reports whether it stayed within it (else the peer sets it interned are
// dropped again).
func (b *builder) chargeClusterBudget(cnp *npav1beta1.ClusterNetworkPolicy, cp *ClusterPolicy, static int) bool {
	m := b.newMeter(b.budgets.ClusterPolicy, static)
	mark := b.markSelectors()
	ok := m.used <= m.budget
	peer := func(ns *metav1.LabelSelector, pods *npav1beta1.NamespacedPod, nodes *metav1.LabelSelector) {
		if !ok {
			return
		}
		pr := &problems{} // compileClusterRule reports
		path := field.NewPath("spec")
		switch {
		case ns != nil:
			if sel, good := pr.parseSelector(path, ns); good {
				ok = b.chargeSelection("", sel, labels.Everything(), m)
			}
		case pods != nil:
			nsSel, good1 := pr.parseSelector(path, &pods.NamespaceSelector)
			podSel, good2 := pr.parseSelector(path, &pods.PodSelector)
			if good1 && good2 {
				ok = b.chargeSelection("", nsSel, podSel, m)
			}
		case nodes != nil:
			// Matched against every node, at most every node's addresses.
			ok = m.charge(2 * len(b.nodeNames))
		}
	}
	for i := range cnp.Spec.Ingress {
		for j := range cnp.Spec.Ingress[i].From {
			f := &cnp.Spec.Ingress[i].From[j]
			peer(f.Namespaces, f.Pods, nil)
		}
	}
	for i := range cnp.Spec.Egress {
		for j := range cnp.Spec.Egress[i].To {
			t := &cnp.Spec.Egress[i].To[j]
			peer(t.Namespaces, t.Pods, t.Nodes)
		}
	}
	cp.Cost = m.spent()
	if !ok {
		b.dropSelectorsFrom(mark)
	}
	return ok
}

// distinctKeys returns the keys without repeats, each where it first
// comes, in a new slice (nil when there is none).
func distinctKeys(keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	out := make([]string, 0, len(keys))
	if len(keys) <= 8 {
		for _, k := range keys {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
		return out
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
