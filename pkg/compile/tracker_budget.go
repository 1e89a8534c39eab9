package compile

import networkingv1 "k8s.io/api/networking/v1"

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
// (chargeBudget) with the pods tracked now, without matching any: each
// selecting peer as if it were matched against, and selected, every pod
// it could be, and a namespace selector against every namespace. It costs
// the policy's size.
func (t *Tracker) policyCostBound(np *networkingv1.NetworkPolicy) int {
	if np == nil {
		return 0
	}
	c := NetworkPolicyCost(np)
	if c > MaxPolicyCost {
		return 0 // rejected for what it says, without a charge
	}
	nss := len(t.b.byNS) + len(t.moved)
	inNS := len(t.b.byNS[np.Namespace]) + len(t.moved[np.Namespace])
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			switch p := &ps[i]; {
			case p.IPBlock != nil:
			case p.NamespaceSelector != nil:
				c += nss + 2*len(t.pods)
			case p.PodSelector != nil:
				c += 2 * inNS
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
