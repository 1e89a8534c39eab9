package compile

import (
	"maps"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// trackedCosts is what the Tracker knows of what NetworkPolicies make
// (budget.go): the last build's charges, then, for each policy changed in
// place since, a bound on its charge (policyCostBound).
type trackedCosts struct {
	// ns is the sum by namespace, pol the charge by policy key.
	ns  map[string]int
	pol map[string]int
	// nsRejected lists the namespaces with a policy rejected for the
	// namespace's budget: any change there may admit it, so the build
	// decides.
	nsRejected map[string]bool
	// scopes lists, by key, the namespace selectors of each admitted
	// policy's selecting peers (nil: its own namespace), from the build
	// or a tracked change; byNS, by namespace, what each pod that joins
	// it may add to a policy's charge (derived from scopes, computed when
	// first needed and dropped with any policy change).
	scopes map[string][]labels.Selector
	byNS   map[string][]podCharge
	// pending holds the charges a pod change checked (checkPodCost),
	// recorded by notePodCost once it is applied.
	pending []podCharge
}

// podCharge is what a pod that joins a namespace may add to the charge of
// a policy (key, of namespace ns).
type podCharge struct {
	key, ns string
	n       int
}

// indexCosts records the build's charges.
func (t *Tracker) indexCosts() {
	p := t.prog
	c := trackedCosts{ns: make(map[string]int, len(p.NamespaceCosts)), pol: make(map[string]int, len(p.Policies)), nsRejected: map[string]bool{},
		scopes: maps.Clone(t.b.peerScopes)}
	if c.scopes == nil {
		c.scopes = map[string][]labels.Selector{}
	}
	for ns, n := range p.NamespaceCosts {
		c.ns[ns] = n
	}
	for i := range p.Policies {
		pol := &p.Policies[i]
		c.pol[pol.Key] = pol.Cost
		if pol.RejectedFor == RejectedNamespaceBudget {
			c.nsRejected[pol.Namespace] = true
		}
	}
	t.costs = c
	t.indexShares()
}

// policyCostBound bounds what the build would charge a NetworkPolicy
// (chargeBudget) with the pods tracked now, without matching any pod:
// its podSelector as matched against every pod of its namespace, and
// each selecting peer as if it selected every pod of the namespaces it is
// matched against (its namespace selector is matched against the
// namespaces). It costs the policy's size times the namespaces.
func (t *Tracker) policyCostBound(np *networkingv1.NetworkPolicy) int {
	if np == nil {
		return 0
	}
	c := NetworkPolicyCost(np)
	if c > MaxPolicyCost {
		return 0 // rejected for what it says, without a charge
	}
	c += t.podsAtMost(np.Namespace) // its podSelector's matching
	nss := t.namespaces()
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			switch p := &ps[i]; {
			case p.IPBlock != nil:
			case p.NamespaceSelector != nil:
				c += len(nss) + 2*t.podsMatching(nss, p.NamespaceSelector)
			case p.PodSelector != nil:
				c += 2 * t.podsAtMost(np.Namespace)
			}
		}
	}
	for i := range np.Spec.Ingress {
		peers(np.Spec.Ingress[i].From)
	}
	for i := range np.Spec.Egress {
		peers(np.Spec.Egress[i].To)
	}
	return c
}

// checkCost tells whether a NetworkPolicy change can be tracked in place
// as far as budgets go, and returns the new version's bound: either the
// new version surely fits its budget and its namespace's, or the build
// surely rejects it for its own budget (overBudget: its charge is at
// least policyCostFloor, past its budget, and the namespace keeps room
// for the budget it is then charged), and no policy of the namespace
// waits for room in the namespace's budget. Otherwise the build charges
// what it makes (FallbackCost).
func (t *Tracker) checkCost(key, ns string, np *networkingv1.NetworkPolicy) (bound int, overBudget bool, f Fallback) {
	b := t.b.budgets
	if t.costs.nsRejected[ns] {
		return 0, false, FallbackCost
	}
	others := t.costs.ns[ns] - t.costs.pol[key]
	if bound = t.policyCostBound(np); bound <= b.Policy && others+bound <= b.Namespace {
		return bound, false, NoFallback
	}
	// Rejected for its budget, the policy is charged the budget (what
	// its meter reached) and makes nothing but its isolation: a build
	// before which the namespace's other policies take at most others
	// gives it all of its own budget, and those after it still fit.
	if np != nil && NetworkPolicyCost(np) <= MaxPolicyCost && others+b.Policy <= b.Namespace && t.policyCostFloor(np) > b.Policy {
		return b.Policy, true, NoFallback
	}
	return 0, false, FallbackCost
}

// policyCostFloor is at most what the build would charge a NetworkPolicy
// (chargeBudget) with the pods tracked now, without matching any pod: its
// size, its podSelector's matching and each selecting peer's (the
// namespaces and the pods of those it is matched against), without the
// members of its sets. It costs the tracked pods once and the policy's
// peers times the namespaces.
func (t *Tracker) policyCostFloor(np *networkingv1.NetworkPolicy) int {
	counts := map[string]int{}
	for _, ns := range t.namespaces() {
		n := 0
		t.podsIn(ns, func(string, *Pod) { n++ })
		if n > 0 {
			counts[ns] = n
		}
	}
	c := NetworkPolicyCost(np) + counts[np.Namespace]
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			p := &ps[i]
			if p.IPBlock != nil || (p.PodSelector == nil && p.NamespaceSelector == nil) {
				continue
			}
			m, ok := peerMatcher(np.Namespace, p.NamespaceSelector, p.PodSelector)
			switch {
			case !ok:
			case m.nsSel == nil:
				c += counts[np.Namespace]
			default:
				c += len(counts)
				for ns, n := range counts {
					if m.nsSel.Matches(t.nsLabelsOf(ns)) {
						c += n
					}
				}
			}
		}
	}
	for i := range np.Spec.Ingress {
		peers(np.Spec.Ingress[i].From)
	}
	for i := range np.Spec.Egress {
		peers(np.Spec.Egress[i].To)
	}
	return c
}

// noteCost records a NetworkPolicy change tracked in place (np nil: a
// deletion).
func (t *Tracker) noteCost(key, ns string, np *networkingv1.NetworkPolicy, bound int) {
	t.costs.byNS = nil
	delete(t.costs.scopes, key)
	if np != nil {
		t.costs.scopes[key] = policyScopes(np)
	}
	t.costs.ns[ns] += bound - t.costs.pol[key]
	if bound == 0 {
		delete(t.costs.pol, key)
		return
	}
	t.costs.pol[key] = bound
}

// clusterCostBound bounds what the build would charge a
// ClusterNetworkPolicy (chargeClusterBudget) with the pods tracked now, as
// policyCostBound does (a pods peer as if its pod selector selected every
// pod of the namespaces its namespace selector matches).
func (t *Tracker) clusterCostBound(cnp *npav1beta1.ClusterNetworkPolicy) int {
	if cnp == nil {
		return 0
	}
	c := ClusterPolicyCost(cnp)
	if c > MaxPolicyCost {
		return 0 // rejected for what it says, without a charge
	}
	nss := t.namespaces()
	peer := func(ns *metav1.LabelSelector, pods *npav1beta1.NamespacedPod) {
		switch {
		case ns != nil:
			c += len(nss) + 2*t.podsMatching(nss, ns)
		case pods != nil:
			c += len(nss) + 2*t.podsMatching(nss, &pods.NamespaceSelector)
		}
	}
	for i := range cnp.Spec.Ingress {
		for j := range cnp.Spec.Ingress[i].From {
			f := &cnp.Spec.Ingress[i].From[j]
			peer(f.Namespaces, f.Pods)
		}
	}
	for i := range cnp.Spec.Egress {
		for j := range cnp.Spec.Egress[i].To {
			p := &cnp.Spec.Egress[i].To[j]
			peer(p.Namespaces, p.Pods)
			if p.Nodes != nil {
				c += 2 * len(t.b.nodeNames)
			}
		}
	}
	return c
}

// podsAtMost bounds the pods of a namespace that a build would match: the
// last build's, and those that moved since.
func (t *Tracker) podsAtMost(ns string) int { return len(t.b.byNS[ns]) + len(t.moved[ns]) }

// podsMatching bounds the pods of the namespaces (of nss) that a
// namespace selector matches, as the build would match it; a selector
// that does not parse matches nothing (the build reports it).
func (t *Tracker) podsMatching(nss []string, sel *metav1.LabelSelector) int {
	s, ok := (&problems{}).parseSelector(field.NewPath("spec"), sel)
	if !ok {
		return 0
	}
	n := 0
	for _, ns := range nss {
		nsl, known := t.b.nsLabels[ns]
		if !known {
			nsl = labels.Set{NamespaceNameLabel: ns}
		}
		if s.Matches(nsl) {
			n += t.podsAtMost(ns)
		}
	}
	return n
}

// trackedShares is what the Tracker knows of the peer sets' contents
// (peershare.go): enough to tell when a change would make a build share
// a set between peers, or split one, which a change tracked in place
// cannot do (FallbackSharedSet).
type trackedShares struct {
	// content is each selector's content as tracked now, by ID; the
	// selectors a policy change interned since the build are added when
	// first needed (extendShares). big indexes those of shareMinMembers
	// pods or more by content.
	content []shareKey
	big     map[shareKey][]SelectorID
	// pending holds the contents a pod change checked (checkPodShares),
	// sorted by ID, recorded by notePodShares once it is applied.
	pending []sidContent
}

// sidContent is a selector's content after a change.
type sidContent struct {
	sid SelectorID
	k   shareKey
}

// indexShares records the build's contents.
func (t *Tracker) indexShares() {
	s := trackedShares{content: slices.Clone(t.b.selContent), big: map[shareKey][]SelectorID{}}
	for sid, k := range s.content {
		if k.n >= shareMinMembers {
			s.big[k] = append(s.big[k], SelectorID(sid))
		}
	}
	t.shares = s
}

// extendShares adds the contents of the selectors policy changes interned
// since the build, from the tracked pods' memberships.
func (t *Tracker) extendShares() {
	s := &t.shares
	for sid := SelectorID(len(s.content)); int(sid) < len(t.cur.Selectors); sid++ {
		var k shareKey
		t.selectorPods(sid, func(key string, v *Pod) {
			if _, in := slices.BinarySearch(v.MemberOf, sid); in {
				k = k.with(podKeyHash(key), true)
			}
		})
		s.content = append(s.content, k)
		s.index(sid, k, true)
	}
}

// index adds a selector's content to big, or removes it.
func (s *trackedShares) index(sid SelectorID, k shareKey, in bool) {
	if k.n < shareMinMembers {
		return
	}
	if in {
		s.big[k] = append(s.big[k], sid)
		return
	}
	ids := slices.DeleteFunc(s.big[k], func(x SelectorID) bool { return x == sid })
	if len(ids) == 0 {
		delete(s.big, k)
		return
	}
	s.big[k] = ids
}

// shared reports whether peers that say different things use the set.
func (t *Tracker) shared(sid SelectorID) bool { return len(t.b.aliasMatch[sid]) > 0 }

// checkPodShares tells whether a pod change (old and cur as placed, nil
// when absent) leaves the sharing of peer sets as a build would make it:
// every peer of a shared set agrees on the pod, no shared set drops below
// shareMinMembers, and no set the pod joins or leaves comes to hold what
// another holds. It costs the shared sets' peers and the pod's sets.
func (t *Tracker) checkPodShares(key string, old, cur *Pod) Fallback {
	t.extendShares()
	s := &t.shares
	s.pending = s.pending[:0]
	if cur != nil {
		for sid, ms := range t.b.aliasMatch {
			_, in := slices.BinarySearch(cur.MemberOf, sid)
			for i := range ms {
				if t.matches(&ms[i], cur) != in {
					return FallbackSharedSet
				}
			}
		}
	}
	var was, is []SelectorID
	if old != nil {
		was = old.MemberOf
	}
	if cur != nil {
		is = cur.MemberOf
	}
	if slices.Equal(was, is) {
		return NoFallback
	}
	ph := podKeyHash(key)
	for i, j := 0, 0; i < len(was) || j < len(is); {
		switch {
		case j == len(is) || (i < len(was) && was[i] < is[j]):
			s.pending = append(s.pending, sidContent{was[i], s.content[was[i]].with(ph, false)})
			i++
		case i == len(was) || is[j] < was[i]:
			s.pending = append(s.pending, sidContent{is[j], s.content[is[j]].with(ph, true)})
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return t.pendingShares()
}

// pendingShares checks the pending contents against each other and the
// others'.
func (t *Tracker) pendingShares() Fallback {
	s := &t.shares
	var after map[shareKey]bool
	for _, p := range s.pending {
		if p.k.n < shareMinMembers {
			if t.shared(p.sid) {
				return FallbackSharedSet
			}
			continue
		}
		for _, o := range s.big[p.k] {
			if _, changing := slices.BinarySearchFunc(s.pending, o, func(c sidContent, id SelectorID) int { return int(c.sid - id) }); !changing {
				return FallbackSharedSet
			}
		}
		if after == nil {
			after = map[shareKey]bool{}
		}
		if after[p.k] {
			return FallbackSharedSet
		}
		after[p.k] = true
	}
	return NoFallback
}

// checkPodCharges tells whether a pod change can be tracked in place as
// far as shared peer sets (checkPodShares) and budgets (checkPodCost) go.
func (t *Tracker) checkPodCharges(key string, old, cur *Pod) Fallback {
	if f := t.checkPodShares(key, old, cur); f != NoFallback {
		return f
	}
	return t.checkPodCost(key, old, cur)
}

// notePodCharges records what checkPodCharges checked, once the pod
// change is applied.
func (t *Tracker) notePodCharges() {
	t.notePodShares()
	t.notePodCost()
}

// notePodShares records the contents of the pod change checkPodShares
// checked, once it is applied.
func (t *Tracker) notePodShares() {
	s := &t.shares
	for _, p := range s.pending {
		s.index(p.sid, s.content[p.sid], false)
		s.content[p.sid] = p.k
		s.index(p.sid, p.k, true)
	}
	s.pending = s.pending[:0]
}

// matches reports whether a peer selects a pod, as the build decides it.
func (t *Tracker) matches(m *selMatcher, pod *Pod) bool {
	if m.nsSel == nil {
		if pod.Namespace != m.ns {
			return false
		}
	} else if !m.nsSel.Matches(t.nsLabelsOf(pod.Namespace)) {
		return false
	}
	return m.podSel.Matches(labels.Set(pod.Labels))
}

// nsLabelsOf returns a namespace's labels as the build matched them.
func (t *Tracker) nsLabelsOf(ns string) labels.Set {
	if l, ok := t.b.nsLabels[ns]; ok {
		return l
	}
	return labels.Set{NamespaceNameLabel: ns}
}

// checkPolicyShares tells whether a NetworkPolicy change leaves the
// sharing of peer sets as a build would make it, and returns the new
// version's peer keys (builder.peerKeys). A build interns peers policy by
// policy in key order, each policy's in order; the first peer of a content
// names its set and the others are its aliases, in that order. So a change
// that keeps, in the same order, the peers of the policy that use shared
// sets leaves every shared set as it is (its name, aliases, members and
// comment), whatever else it changes (ports, podSelector, policy types,
// other peers): the change is applied as one that uses no shared set, and
// the peers it keeps reuse their sets without matching any pod. Adding,
// dropping or reordering a peer of a shared set (deleting the policy
// too) can change which peer names the set and how many share it, which
// depends on every other policy's peers and is left to the build
// (FallbackSharedSet); so is a new peer that selects what a set of
// shareMinMembers pods or more, or another new peer, selects (it would be
// an alias). It costs the policy's peers and matching its new peers
// against the pods they can select.
func (t *Tracker) checkPolicyShares(key string, np *networkingv1.NetworkPolicy) ([]string, Fallback) {
	t.extendShares()
	keys, f := t.newPeerKeys(np)
	if f != NoFallback {
		return nil, f
	}
	old := t.b.peerKeys[key]
	if !t.sharedCovered(key, old) || !slices.Equal(t.sharedKeys(old), t.sharedKeys(keys)) {
		return nil, FallbackSharedSet
	}
	return keys, NoFallback
}

// newPeerKeys returns the canonical keys of a NetworkPolicy version's
// selecting peers as a build interns them (distinct, in order; none for a
// policy rejected for what it says), after checking each peer new to the
// tracker (newContents.checkNew).
func (t *Tracker) newPeerKeys(np *networkingv1.NetworkPolicy) ([]string, Fallback) {
	if np == nil || NetworkPolicyCost(np) > MaxPolicyCost {
		return nil, NoFallback
	}
	nc := t.newContents()
	var keys []string
	peers := func(ps []networkingv1.NetworkPolicyPeer) Fallback {
		for i := range ps {
			p := &ps[i]
			if p.IPBlock != nil || (p.PodSelector == nil && p.NamespaceSelector == nil) {
				continue
			}
			m, ok := peerMatcher(np.Namespace, p.NamespaceSelector, p.PodSelector)
			if !ok {
				continue
			}
			k, _ := selectionKey(m.ns, m.nsSel, m.podSel)
			keys = append(keys, k)
			if _, known := t.b.sels[k]; known {
				continue
			}
			if f := nc.checkNew(k, m); f != NoFallback {
				return f
			}
		}
		return NoFallback
	}
	for i := range np.Spec.Ingress {
		if f := peers(np.Spec.Ingress[i].From); f != NoFallback {
			return nil, f
		}
	}
	for i := range np.Spec.Egress {
		if f := peers(np.Spec.Egress[i].To); f != NoFallback {
			return nil, f
		}
	}
	return distinctKeys(keys), NoFallback
}

// sharedKeys returns the keys (in order) whose peers use a shared set.
func (t *Tracker) sharedKeys(keys []string) []string {
	var out []string
	for _, k := range keys {
		if sid, ok := t.b.sels[k]; ok && t.shared(sid) {
			out = append(out, k)
		}
	}
	return out
}

// sharedCovered reports whether every shared set the tracked version of
// a NetworkPolicy uses is the set of one of its recorded peer keys (old):
// the record the shared sets are kept by is the policy's. When it is not,
// the build decides.
func (t *Tracker) sharedCovered(key string, old []string) bool {
	id, ok := t.policyIDOf(key)
	if !ok {
		return true
	}
	var sids map[SelectorID]bool
	pol := &t.cur.Policies[id]
	for _, rules := range [][]Rule{pol.Ingress, pol.Egress} {
		for i := range rules {
			for _, sid := range rules[i].Selectors {
				if !t.shared(sid) {
					continue
				}
				if sids == nil {
					sids = make(map[SelectorID]bool, len(old))
					for _, k := range old {
						if s, ok := t.b.sels[k]; ok {
							sids[s] = true
						}
					}
				}
				if !sids[sid] {
					return false
				}
			}
		}
	}
	return true
}

// notePeerKeys records the peer keys of a NetworkPolicy change applied in
// place (keys nil: none, or deleted).
func (t *Tracker) notePeerKeys(key string, keys []string) {
	if keys == nil {
		delete(t.b.peerKeys, key)
		return
	}
	if t.b.peerKeys == nil {
		t.b.peerKeys = map[string][]string{}
	}
	t.b.peerKeys[key] = keys
}

// policyIDOf returns a NetworkPolicy's ID in the tracked program.
func (t *Tracker) policyIDOf(key string) (PolicyID, bool) {
	if t.pol.ids != nil {
		id, ok := t.pol.ids[key]
		return id, ok
	}
	for i := range t.cur.Policies {
		if t.cur.Policies[i].Key == key {
			return PolicyID(i), true
		}
	}
	return 0, false
}

// peerMatcher parses a peer's selectors as the build does (a pod selector
// nil selects every pod); false when one does not parse (the peer matches
// nothing and makes no set).
func peerMatcher(ns string, nsSel, podSel *metav1.LabelSelector) (selMatcher, bool) {
	pr, path := &problems{}, field.NewPath("spec")
	m := selMatcher{ns: ns, podSel: labels.Everything()}
	if podSel != nil {
		s, ok := pr.parseSelector(path, podSel)
		if !ok {
			return m, false
		}
		m.podSel = s
	}
	if nsSel != nil {
		s, ok := pr.parseSelector(path, nsSel)
		if !ok {
			return m, false
		}
		m.nsSel, m.ns = s, ""
	}
	return m, true
}

// newContents checks the peers of a policy version against the tracked
// sets (checkPolicyShares).
type newContents struct {
	t    *Tracker
	seen map[string]shareKey
}

func (t *Tracker) newContents() *newContents { return &newContents{t: t, seen: map[string]shareKey{}} }

// check checks one peer (ok false: it does not parse, and makes no set).
func (c *newContents) check(m selMatcher, ok bool) Fallback {
	if !ok {
		return NoFallback
	}
	key, _ := selectionKey(m.ns, m.nsSel, m.podSel)
	if sid, known := c.t.b.sels[key]; known {
		if c.t.shared(sid) {
			return FallbackSharedSet
		}
		return NoFallback
	}
	return c.checkNew(key, m)
}

// checkNew checks a peer the tracker has not interned (key): it must not
// select what a set of shareMinMembers pods or more, or another new peer
// of the version, selects.
func (c *newContents) checkNew(key string, m selMatcher) Fallback {
	t := c.t
	if _, dup := c.seen[key]; dup {
		return NoFallback
	}
	k := t.matcherContent(&m)
	c.seen[key] = k
	if k.n < shareMinMembers {
		return NoFallback
	}
	if len(t.shares.big[k]) > 0 {
		return FallbackSharedSet
	}
	for other, ok := range c.seen {
		if other != key && ok == k {
			return FallbackSharedSet
		}
	}
	return NoFallback
}

// matcherContent returns the content of what a peer selects among the
// tracked pods.
func (t *Tracker) matcherContent(m *selMatcher) shareKey {
	var k shareKey
	visit := func(key string, v *Pod) {
		if m.podSel.Matches(labels.Set(v.Labels)) {
			k = k.with(podKeyHash(key), true)
		}
	}
	if m.nsSel == nil {
		t.podsIn(m.ns, visit)
		return k
	}
	for _, ns := range t.namespaces() {
		if m.nsSel.Matches(t.nsLabelsOf(ns)) {
			t.podsIn(ns, visit)
		}
	}
	return k
}

// checkClusterShares is checkPolicyShares for a ClusterNetworkPolicy.
func (t *Tracker) checkClusterShares(name string, cnp *npav1beta1.ClusterNetworkPolicy) Fallback {
	t.extendShares()
	for i := range t.cur.ClusterPolicies {
		cp := &t.cur.ClusterPolicies[i]
		if cp.Name != name {
			continue
		}
		for _, rules := range [][]ClusterRule{cp.Ingress, cp.Egress} {
			for j := range rules {
				if slices.ContainsFunc(rules[j].Selectors, t.shared) {
					return FallbackSharedSet
				}
			}
		}
	}
	if cnp == nil {
		return NoFallback
	}
	nc := t.newContents()
	peer := func(ns *metav1.LabelSelector, pods *npav1beta1.NamespacedPod) Fallback {
		switch {
		case ns != nil:
			m, ok := peerMatcher("", ns, nil)
			return nc.check(m, ok)
		case pods != nil:
			m, ok := peerMatcher("", &pods.NamespaceSelector, &pods.PodSelector)
			return nc.check(m, ok)
		}
		return NoFallback
	}
	for i := range cnp.Spec.Ingress {
		for j := range cnp.Spec.Ingress[i].From {
			f := &cnp.Spec.Ingress[i].From[j]
			if fb := peer(f.Namespaces, f.Pods); fb != NoFallback {
				return fb
			}
		}
	}
	for i := range cnp.Spec.Egress {
		for j := range cnp.Spec.Egress[i].To {
			p := &cnp.Spec.Egress[i].To[j]
			if fb := peer(p.Namespaces, p.Pods); fb != NoFallback {
				return fb
			}
		}
	}
	return NoFallback
}

// Re-costing as pods come. The build charges each NetworkPolicy for the
// pods its podSelector and its peers are matched against and for its
// sets' members (budget.go), all of which grow as pods join. A pod that
// joins namespace X may add to the charge of a policy P: one for P's
// podSelector (P in X), and per peer of P matched against X, one for the
// matching and one for the set it may join; a pod whose labels change,
// one per such peer (a set it may join); the first pod of a namespace,
// one per namespace-selector peer of every policy (the namespaces they
// are matched against). checkPodCost adds this bound to what the tracker
// knows of each charge before the change is applied; a pod that would
// take a policy past its budget, or its namespace's NetworkPolicies past
// theirs, is not tracked in place (FallbackCost): the build charges what
// the policy makes now and rejects it, fail-closed, on its own. Pods
// that leave are not subtracted: the charges only fall at the next build.
// A change costs the policies whose peers are matched against the pod's
// namespace (after a policy change, every policy's peers once per
// namespace, to find them).

// checkPodCost bounds what a pod change adds to the charges of the
// NetworkPolicies, and tells whether each stays within its budgets.
func (t *Tracker) checkPodCost(key string, old, cur *Pod) Fallback {
	c := &t.costs
	c.pending = c.pending[:0]
	added := old == nil && cur != nil
	if !added && (cur == nil || old == nil || slices.Equal(old.MemberOf, cur.MemberOf)) {
		return NoFallback
	}
	ns := cur.Namespace
	per := 1
	if added {
		per = 2
	}
	for _, e := range t.nsCharges(ns) {
		n := per * e.n
		if added && e.ns == ns {
			n++ // its podSelector's matching
		}
		if n > 0 {
			c.pending = append(c.pending, podCharge{e.key, e.ns, n})
		}
	}
	if added && t.namespaceEmpty(ns) {
		for pk, scopes := range c.scopes {
			n := 0
			for _, s := range scopes {
				if s != nil {
					n++
				}
			}
			if n > 0 {
				pns, _, _ := strings.Cut(pk, "/")
				c.pending = append(c.pending, podCharge{pk, pns, n})
			}
		}
	}
	b := t.b.budgets
	pol, nsSum := map[string]int{}, map[string]int{}
	for _, p := range c.pending {
		pol[p.key] += p.n
		nsSum[p.ns] += p.n
		if c.pol[p.key]+pol[p.key] > b.Policy || c.ns[p.ns]+nsSum[p.ns] > b.Namespace {
			return FallbackCost
		}
	}
	return NoFallback
}

// notePodCost records the charges checkPodCost checked.
func (t *Tracker) notePodCost() {
	c := &t.costs
	for _, p := range c.pending {
		c.pol[p.key] += p.n
		c.ns[p.ns] += p.n
	}
	c.pending = c.pending[:0]
}

// nsCharges lists, for a namespace, the admitted NetworkPolicies that a
// pod joining it is charged to: those of the namespace, and those with a
// peer matched against it; n counts the peers.
func (t *Tracker) nsCharges(ns string) []podCharge {
	c := &t.costs
	if out, ok := c.byNS[ns]; ok {
		return out
	}
	nsl := t.nsLabelsOf(ns)
	var out []podCharge
	for key, scopes := range c.scopes {
		pns, _, _ := strings.Cut(key, "/")
		n := 0
		for _, s := range scopes {
			if (s == nil && pns == ns) || (s != nil && s.Matches(nsl)) {
				n++
			}
		}
		if n > 0 || pns == ns {
			out = append(out, podCharge{key, pns, n})
		}
	}
	if c.byNS == nil {
		c.byNS = map[string][]podCharge{}
	}
	c.byNS[ns] = out
	return out
}

// namespaceEmpty reports whether no tracked pod is in the namespace (as
// podsIn visits them, stopping at the first).
func (t *Tracker) namespaceEmpty(ns string) bool {
	moved := t.moved[ns]
	for _, pid := range t.b.byNS[ns] {
		if !moved[t.prog.Pods[pid].Key] {
			return false
		}
	}
	for key := range moved {
		if t.view(key) != nil {
			return false
		}
	}
	return true
}

// policyScopes lists the namespace selectors of a NetworkPolicy's
// selecting peers (nil: its own namespace), as the build charges them; a
// peer whose selectors do not parse is left out (it makes nothing).
func policyScopes(np *networkingv1.NetworkPolicy) []labels.Selector {
	var out []labels.Selector
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			p := &ps[i]
			if p.IPBlock != nil || (p.PodSelector == nil && p.NamespaceSelector == nil) {
				continue
			}
			if m, ok := peerMatcher(np.Namespace, p.NamespaceSelector, p.PodSelector); ok {
				out = append(out, m.nsSel)
			}
		}
	}
	for i := range np.Spec.Ingress {
		peers(np.Spec.Ingress[i].From)
	}
	for i := range np.Spec.Egress {
		peers(np.Spec.Egress[i].To)
	}
	return out
}
