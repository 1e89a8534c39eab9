package compile

import (
	"maps"
	"slices"
)

// reshape applies a pod change that creates or deletes combination chains
// (the pod is the first or the last local pod of a combination of
// policies of either API), after ApplyPodInfo's bookkeeping. It makes a
// new Ruleset that shares the previous one's sets and chains (a Syncer
// holds the previous one): the combinations the pod left and no other pod
// uses deleted, with the policy chains no local pod needs any more and
// their sets; the combinations it entered rendered, with the policy chains
// they newly need and their sets, filled; and the pod's element changes
// applied in place, as ApplyPodInfo applies them, to the sets the two
// rulesets share. It returns those changes: the caller hands the new
// ruleset and them to Syncer.ApplyDelta, which writes what differs between
// the two rulesets (chains, new and deleted sets) and the changes.
func (t *Tracker) reshape(old, cur *Pod, oldCombos, newCombos []namedCombo, changes setChanges) (delta Delta) {
	t.ownProgram()
	rs := t.newRuleset()
	var left, entered []namedCombo
	cluster, clusterEntered := false, false
	for _, c := range oldCombos {
		if !hasCombo(newCombos, c.name) && t.comboUse[c.name] == 0 {
			delete(t.comboUse, c.name)
			left = append(left, c)
			cluster = cluster || c.t != 0
		}
	}
	for _, c := range newCombos {
		if _, ok := rs.Chains[c.name]; !ok && !hasCombo(oldCombos, c.name) {
			entered = append(entered, c)
			cluster = cluster || c.t != 0
			clusterEntered = clusterEntered || c.t != 0
		}
	}
	if cluster {
		t.ownCluster()
	}
	ns := ""
	for _, v := range []*Pod{old, cur} {
		if v != nil {
			ns = v.Namespace
		}
	}
	t.dropLeft(rs, left, ns)

	// What comes: the policy chains the entered combinations need that
	// no other local pod needed (a policy without rules in a direction has
	// none), then the combinations' chains (a ClusterNetworkPolicy one
	// with its tier-skip sets, from the tracked pods).
	r2 := t.subRenderer()
	for _, c := range entered {
		r2.comboChain(c.combo, t.ruleChains(rs, r2, c.combo, true))
	}
	t.placeRendered(rs, r2)
	t.r.combos = append(t.r.combos, r2.combos...)
	fresh := t.mergeSets(rs, r2)
	if clusterEntered {
		ns = "" // ClusterNetworkPolicy named ports resolve on subjects anywhere
	}
	t.fill(rs, fresh, ns)
	if t.cow != nil {
		for n := range fresh {
			t.cow[n] = true // new: no Syncer holds it
		}
	}
	if cluster {
		t.indexCombos()
	}

	// The pod's own element changes, in sets that are not new (those
	// were filled with it) and still exist.
	for _, n := range slices.Sorted(maps.Keys(changes)) {
		d := changes[n]
		if rs.Sets[n] == nil || fresh[n] || len(d.Add) == 0 && len(d.Delete) == 0 {
			continue
		}
		t.applySet(rs, n, d)
		delta = append(delta, *d)
	}
	return delta
}

// dropLeft deletes the chains of the combinations a pod left as their
// last local pod (with their deny-log chains and tier-skip sets), and
// the rule chains of the policies no local pod uses any more in that
// direction (with the sets they own). ns is the pod's namespace.
func (t *Tracker) dropLeft(rs *Ruleset, left []namedCombo, ns string) {
	for _, c := range left {
		t.dropCombo(rs, c.combo, c.name)
		for i := 0; i < c.size(); i++ {
			n := c.ruleChainName(t.cur, i)
			if _, ok := rs.Chains[n]; ok && !t.ruleChainUsed(c.combo, i, ns) {
				t.removeRuleChain(rs, n)
			}
		}
	}
	dropDeletedChains(rs)
}

// ruleChains reports, for each policy of a combination, whether its rule
// chain exists in rs or was rendered by r2; with render set, it renders
// (with r2) those that are in neither. It returns the answer as
// comboChain's hasRules.
func (t *Tracker) ruleChains(rs *Ruleset, r2 *renderer, c combo, render bool) func(i int) bool {
	has := make([]bool, c.size())
	for i := range has {
		n := c.ruleChainName(t.cur, i)
		_, had := rs.Chains[n]
		_, rendered := r2.rs.Chains[n]
		has[i] = had || rendered || render && r2.ruleChain(c, i)
	}
	return func(i int) bool { return has[i] }
}

// ruleChainUsed reports whether a tracked local pod still uses the rule
// chain of a combination's policy i: a pod of the namespace ns isolated by
// the NetworkPolicy, or a subject of the ClusterNetworkPolicy, in the
// combination's direction.
func (t *Tracker) ruleChainUsed(c combo, i int, ns string) bool {
	if c.t == 0 {
		return t.isolatesLocal(ns, c.ids[i], c.d)
	}
	return t.clusterSubjectLocal(c.cids[i], c.d)
}

// clusterComboTrackable tells whether reshape may create or delete a
// combination chain of the pod: any NetworkPolicy one; a
// ClusterNetworkPolicy one unless a policy of the pod has domainNames
// rules (as ApplyClusterPolicy).
func (t *Tracker) clusterComboTrackable(c combo, pod *Pod) Fallback {
	if c.t == 0 {
		return NoFallback
	}
	ok := true
	podCombos(pod, func(pc combo) {
		for _, id := range pc.cids {
			ok = ok && clusterRulesTrackable(&t.cur.ClusterPolicies[id])
		}
	})
	if !ok {
		return FallbackDomainNames
	}
	return NoFallback
}

// clusterSubjectLocal reports whether a tracked local pod is a subject of
// the ClusterNetworkPolicy in that direction (its chain is then rendered).
func (t *Tracker) clusterSubjectLocal(id ClusterPolicyID, d Direction) bool {
	for _, e := range t.pods {
		if v := e.view; v != nil && v.Local && (slices.Contains(v.ClusterPolicies(TierAdmin, d), id) || slices.Contains(v.ClusterPolicies(TierBaseline, d), id)) {
			return true
		}
	}
	return false
}

// isolatesLocal reports whether a tracked local pod of the namespace is
// isolated by the policy in that direction (its chain is then rendered).
func (t *Tracker) isolatesLocal(ns string, id PolicyID, d Direction) bool {
	found := false
	t.podsIn(ns, func(_ string, v *Pod) {
		if !found && v.Local && slices.Contains(v.Policies(d), id) {
			found = true
		}
	})
	return found
}
