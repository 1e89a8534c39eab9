package compile

import (
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
}

// indexCosts records the build's charges.
func (t *Tracker) indexCosts() {
	p := t.prog
	c := trackedCosts{ns: make(map[string]int, len(p.NamespaceCosts)), pol: make(map[string]int, len(p.Policies)), nsRejected: map[string]bool{}}
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
}

// policyCostBound bounds what the build would charge a NetworkPolicy
// (chargeBudget) with the pods tracked now, without matching any pod:
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
// as far as budgets go: the new version surely fits its budget and its
// namespace's, and no policy of the namespace waits for room in the
// namespace's budget. Otherwise the build charges what it makes
// (FallbackCost). It returns the new version's bound.
func (t *Tracker) checkCost(key, ns string, np *networkingv1.NetworkPolicy) (int, Fallback) {
	b := t.b.budgets
	bound := t.policyCostBound(np)
	if t.costs.nsRejected[ns] || bound > b.Policy || t.costs.ns[ns]-t.costs.pol[key]+bound > b.Namespace {
		return 0, FallbackCost
	}
	return bound, NoFallback
}

// noteCost records a NetworkPolicy change tracked in place.
func (t *Tracker) noteCost(key, ns string, bound int) {
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
