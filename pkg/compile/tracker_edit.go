package compile

import (
	"maps"
	"slices"
	"strings"
)

// Edits of the tracked ruleset that policy and pod changes share: a change
// replaces the ruleset with a copy (newRuleset), deletes what goes,
// renders what comes with a renderer of its own (subRenderer) and merges
// it in where a full render would have it.

// newRuleset replaces the tracked ruleset with a shallow copy that a
// policy change can edit: the previous one, which a Syncer may hold,
// keeps its chains and sets.
func (t *Tracker) newRuleset() *Ruleset {
	old := t.r.rs
	rs := &Ruleset{Table: old.Table, Chains: maps.Clone(old.Chains), Sets: maps.Clone(old.Sets),
		ChainOrder: slices.Clone(old.ChainOrder), DenyIDs: maps.Clone(old.DenyIDs)}
	t.r.rs = rs
	return rs
}

// removeChain deletes a chain (not yet from ChainOrder) and uncounts the
// peer sets it names; false when there was none.
func (t *Tracker) removeChain(rs *Ruleset, n string) bool {
	c, ok := rs.Chains[n]
	if !ok {
		return false
	}
	t.countShares(c, -1)
	delete(rs.Chains, n)
	return true
}

// removeRuleChain deletes a policy's rule chain, the deny-log chains its
// rules go to and the sets it owns; its named-port sets stop being filled.
func (t *Tracker) removeRuleChain(rs *Ruleset, n string) {
	if c, ok := rs.Chains[n]; ok {
		t.removeDenyChains(rs, c)
	}
	t.removeChain(rs, n)
	for name, s := range rs.Sets {
		if s.owner == n {
			delete(rs.Sets, name)
		}
	}
	t.r.named = slices.DeleteFunc(t.r.named, func(u namedPortUser) bool {
		if u.owner == n {
			delete(t.r.namedBases, u.base)
			return true
		}
		return false
	})
}

// removeDenyChains deletes the deny-log chains a rule chain's rules go
// to, with their DenyIDs. A ClusterNetworkPolicy's deny chains are its
// own: a denial's ID names the policy, its tier, direction and rule, and
// only the policy's rule chain of that direction renders it
// (clusterPolicyChain), placed just before it.
func (t *Tracker) removeDenyChains(rs *Ruleset, c *Chain) {
	for i := range c.Rules {
		v := c.Rules[i].Verdict
		if v.Kind != VerdictGoto {
			continue
		}
		if dc, ok := rs.Chains[v.Chain]; ok && dc.place.deny {
			t.removeChain(rs, v.Chain)
			delete(rs.DenyIDs, strings.TrimPrefix(v.Chain, names.deny))
		}
	}
}

// dropCombo deletes a combination chain (not yet from ChainOrder) with its
// deny-log chain and its tier-skip sets.
func (t *Tracker) dropCombo(rs *Ruleset, c combo, n string) {
	t.removeChain(rs, n)
	if c.t == 0 && t.cfg.DenyLogGroup != 0 {
		deny := networkPolicyDeny(t.cur, c.d, c.ids).ID()
		t.removeChain(rs, DenyChainName(deny))
		delete(rs.DenyIDs, deny)
	}
	t.r.combos = slices.DeleteFunc(t.r.combos, func(s comboSet) bool {
		if s.chain != n {
			return false
		}
		delete(rs.Sets, s.sets[0])
		delete(rs.Sets, s.sets[1])
		return true
	})
}

// dropDeletedChains removes the deleted chains from ChainOrder.
func dropDeletedChains(rs *Ruleset) {
	rs.ChainOrder = slices.DeleteFunc(rs.ChainOrder, func(n string) bool {
		_, ok := rs.Chains[n]
		return !ok
	})
}

// subRenderer returns a renderer of the tracker's program and
// configuration (validated by NewTracker) that collects, in a ruleset of
// its own, the chains and sets a change renders.
func (t *Tracker) subRenderer() *renderer {
	return &renderer{prog: t.cur, cfg: t.r.cfg, rs: &Ruleset{Chains: map[string]*Chain{}, Sets: map[string]*Set{}}, addrs: t.trackedSelectorAddrs}
}

// placeRendered adds the chains a policy or pod change rendered (r2) to
// rs, counting the shared sets they name: a chain rs has is replaced in
// place; a new one goes where Render would have created it (its place),
// and the deny log's IDs.
func (t *Tracker) placeRendered(rs *Ruleset, r2 *renderer) {
	for _, n := range r2.rs.ChainOrder {
		c := r2.rs.Chains[n]
		t.countShares(c, +1)
		if prev, ok := rs.Chains[n]; ok {
			t.countShares(prev, -1)
			rs.Chains[n] = c
			continue
		}
		rs.Chains[n] = c
		i := slices.IndexFunc(rs.ChainOrder, func(x string) bool { return c.place.before(rs.Chains[x].place) })
		if i < 0 {
			i = len(rs.ChainOrder)
		}
		rs.ChainOrder = slices.Insert(rs.ChainOrder, i, n)
	}
	for id, info := range r2.rs.DenyIDs {
		if rs.DenyIDs == nil {
			rs.DenyIDs = map[string]DenyInfo{}
		}
		rs.DenyIDs[id] = info
	}
	if len(rs.DenyIDs) == 0 {
		rs.DenyIDs = nil
	}
}

// mergeSets adds the sets a policy change rendered (r2) to rs, and drops
// the peer sets no rule names any more. The policy's own sets come from
// the render (addresses and ports filled, named ports filled by fill); a
// peer set is new when no other rule used its selector, and goes when no
// rule does any more. It returns the sets that fill must fill.
func (t *Tracker) mergeSets(rs *Ruleset, r2 *renderer) map[string]bool {
	fresh := map[string]bool{}
	for n, s := range r2.rs.Sets {
		if _, ok := rs.Sets[n]; ok && s.shared {
			continue
		}
		s.Elements = sortElements(s.Elements)
		rs.Sets[n] = s
		fresh[n] = true
	}
	for sid, names := range r2.peerSets {
		for f, n := range names {
			if n != "" && fresh[n] {
				t.r.peerSets.note(SelectorID(sid), f == 0, n)
			}
		}
	}
	for _, u := range r2.named {
		if t.r.namedBases == nil {
			t.r.namedBases = map[string]bool{}
		}
		t.r.namedBases[u.base] = true
		t.r.named = append(t.r.named, u)
	}
	for n, refs := range t.pol.peerRefs {
		if refs > 0 {
			continue
		}
		delete(t.pol.peerRefs, n)
		delete(rs.Sets, n)
		for sid, names := range t.r.peerSets {
			for f := range names {
				if names[f] == n {
					t.r.peerSets[sid][f] = ""
				}
			}
		}
	}
	return fresh
}

// applyElementChanges edits, in rs, the elements the changed pods
// contributed before (before, by pod key) into those they contribute now;
// fresh sets were filled whole.
func (t *Tracker) applyElementChanges(rs *Ruleset, changed map[string]podChange, before map[string]map[string]setElement, fresh map[string]bool) {
	owned := map[string]bool{}
	for k, b := range before {
		after := t.elementsOf(changed[k].cur)
		diff := map[string]*SetDelta{}
		at := func(set string) *SetDelta {
			if fresh[set] || rs.Sets[set] == nil {
				return nil
			}
			d := diff[set]
			if d == nil {
				d = &SetDelta{Set: set}
				diff[set] = d
			}
			return d
		}
		for eid, e := range b {
			if _, ok := after[eid]; !ok {
				if d := at(e.set); d != nil {
					d.Delete = append(d.Delete, e.e)
				}
			}
		}
		for eid, e := range after {
			if _, ok := b[eid]; !ok {
				if d := at(e.set); d != nil {
					d.Add = append(d.Add, e.e)
				}
			}
		}
		for n, d := range diff {
			if !owned[n] {
				s := *rs.Sets[n]
				s.Elements = slices.Clone(s.Elements)
				rs.Sets[n] = &s
				owned[n] = true
			}
			rs.Sets[n].apply(d)
		}
	}
}

// fill adds every tracked pod's elements of the fresh sets: the peer sets
// of selectors no rule used before, and the named-port sets of the policy
// just rendered: a NetworkPolicy of namespace ns, or with ns "" a
// ClusterNetworkPolicy, whose subjects can be in any namespace. It visits
// the pods that can be in them.
func (t *Tracker) fill(rs *Ruleset, fresh map[string]bool, ns string) {
	if len(fresh) == 0 {
		return
	}
	emit := func(set string, e Element) {
		if fresh[set] {
			s := rs.Sets[set]
			s.Elements = append(s.Elements, e)
		}
	}
	seen := map[string]bool{}
	visit := func(k string, v *Pod) {
		if !seen[k] {
			seen[k] = true
			t.r.podElements(v, emit)
		}
	}
	for sid := range t.r.peerSets {
		for _, n := range t.r.peerSets[sid] {
			if fresh[n] {
				t.selectorPods(SelectorID(sid), func(k string, v *Pod) {
					if v.InSelector(SelectorID(sid)) {
						visit(k, v)
					}
				})
				break
			}
		}
	}
	for i := range t.r.named {
		u := &t.r.named[i]
		if !fresh[u.sets[0]] && !fresh[u.sets[1]] {
			continue
		}
		covered := func(k string, v *Pod) {
			if u.covers(v) {
				visit(k, v)
			}
		}
		switch {
		case u.subject != nil && ns != "":
			t.podsIn(ns, covered)
		case u.subject != nil:
			for _, n := range t.namespaces() {
				t.podsIn(n, covered)
			}
		case u.m.AllPeers || len(u.m.IPBlocks) > 0:
			for k, e := range t.pods {
				if e.view != nil {
					covered(k, e.view)
				}
			}
		default:
			for _, sid := range u.m.Selectors {
				t.selectorPods(sid, covered)
			}
		}
	}
	for n := range fresh {
		s := rs.Sets[n]
		s.Elements = sortElements(s.Elements)
	}
}

// countShares adds n for each shared set a chain's rules name: the peer
// sets and the node sets of ClusterNetworkPolicy nodes peers.
func (t *Tracker) countShares(c *Chain, n int) {
	for _, s := range c.shares {
		t.pol.peerRefs[s] += n
	}
}
