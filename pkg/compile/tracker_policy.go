package compile

import (
	"maps"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/knftables"
)

// policyState is what the tracker learns, after a Rebuild, to apply
// NetworkPolicy changes; it is filled on the first one.
type policyState struct {
	// owned is set once cur is the tracker's own copy of the program.
	owned bool
	// ids maps a policy's key to its index in cur.Policies. A deleted
	// policy keeps its index (nothing refers to it any more): the indices
	// the tracked pods hold stay valid without renumbering.
	ids map[string]PolicyID
	// chainKeys orders the NetworkPolicy chains as Render creates them:
	// chain name -> policy key, NUL (so that "x/a" sorts before "x/a-b" as
	// the keys do), then "0" for ingress or "1" for egress.
	chainKeys map[string]string
	// peerRefs counts, per peer or node set, the chain rules that name it: a peer
	// set exists while a rendered rule uses its selector.
	peerRefs map[string]int
}

// ApplyPolicy tracks an add, update or delete of the NetworkPolicy with key
// "namespace/name" (np nil when deleted). It recompiles that policy alone,
// reselects its subjects among the namespace's local pods, fills the peer
// sets it is the first to use and drops those it was the last to use, and
// rewrites its chains and the isolation chains of the combinations it is
// in. The tracked ruleset is then equal to Render(Build(...)) of the same
// objects. Unlike ApplyPod it does not update the ruleset in place: it
// replaces it with a new Ruleset that shares every unchanged chain and set
// with the previous one, so that sets.Syncer.Sync can diff the two (the
// chains and sets a policy owns are no element changes).
//
// ok is false when the change is not tracked: queue mode (the evaluator
// decides every selected pod's connections and must have the current
// program, so every change there is a full build), or a key that does not
// name the object. Nothing was changed then; the caller rebuilds. The
// Program lags, as it does for pod changes: Stale reports true until the
// next Rebuild.
func (t *Tracker) ApplyPolicy(key string, np *networkingv1.NetworkPolicy) (ok bool) {
	if t.r == nil || t.cfg.Mode == ModeQueue {
		return false
	}
	if np != nil && policyKey(np) != key {
		return false
	}
	t.ownProgram()
	cur := t.cur
	id, existed := t.pol.ids[key]
	if !existed && np == nil {
		return true // never seen: Build would not see it either
	}
	ns, _, _ := strings.Cut(key, "/")

	// Compile the new version with the tracker's selectors: a peer that
	// selects what an existing selector selects shares its ID (and set).
	nid := id
	if !existed {
		nid = PolicyID(len(cur.Policies))
	}
	var oldPol Policy
	if existed {
		oldPol = cur.Policies[id]
	}
	firstNewSel := SelectorID(len(cur.Selectors))
	newPol := Policy{Namespace: ns, Name: key[len(ns)+1:], Key: key}
	target := labels.Nothing()
	if np != nil {
		sb := t.scratchBuilder()
		sb.prog.Policies = cur.Policies[:nid:nid]
		newPol = sb.compilePolicy(np)
		target = sb.targets[0]
		t.adopt(sb)
	}
	newSels := t.indexSelectorsFrom(firstNewSel)
	if existed {
		cur.Policies[id] = newPol
		t.b.targets[id] = target
	} else {
		cur.Policies = append(cur.Policies, newPol)
		t.b.targets = append(t.b.targets, target)
		t.pol.ids[key] = nid
		for d, n := range policyChainNames(&newPol) {
			t.pol.chainKeys[n] = chainKey(key, d)
		}
	}
	t.placePolicy(ns, nid, np != nil)
	if np == nil {
		delete(t.pol.ids, key)
	}

	// Where the policy stands among the tracked pods: its subjects before
	// and after, the combinations of policies they are in, and the pods
	// that the new selectors select.
	changed := map[string]podChange{}
	var used [2]bool
	type combo struct {
		d   Direction
		ids []PolicyID
	}
	oldCombos := map[string]combo{}
	newCombos := map[string]combo{}
	t.podsIn(ns, func(k string, v *Pod) {
		if !v.Local {
			return
		}
		var was, is [2]bool
		match := np != nil && target.Matches(labels.Set(v.Labels))
		is[Ingress] = match && newPol.IsolatesIngress
		is[Egress] = match && newPol.IsolatesEgress
		for _, d := range []Direction{Ingress, Egress} {
			if existed && slices.Contains(v.Policies(d), id) {
				was[d] = true
				oldCombos[IsolationChainName(cur, d, v.Policies(d))] = combo{d, v.Policies(d)}
			}
		}
		nv := v
		if was != is {
			c := *v
			c.IngressPolicies = t.withPolicy(v.IngressPolicies, nid, is[Ingress])
			c.EgressPolicies = t.withPolicy(v.EgressPolicies, nid, is[Egress])
			nv = &c
			changed[k] = podChange{v, nv}
		}
		for _, d := range []Direction{Ingress, Egress} {
			if is[d] {
				used[d] = true
				newCombos[IsolationChainName(cur, d, nv.Policies(d))] = combo{d, nv.Policies(d)}
			}
		}
	})
	t.addSelectorMembers(newSels, changed)

	// What the changed pods contribute now, before the ruleset changes,
	// and every combination they leave or enter (with the policy or not).
	before := make(map[string]map[string]setElement, len(changed))
	for k, c := range changed {
		if !slices.Equal(c.old.IngressPolicies, c.cur.IngressPolicies) || !slices.Equal(c.old.EgressPolicies, c.cur.EgressPolicies) {
			before[k] = t.elementsOf(c.old)
			for _, d := range []Direction{Ingress, Egress} {
				if ids := c.old.Policies(d); len(ids) > 0 {
					oldCombos[IsolationChainName(cur, d, ids)] = combo{d, ids}
				}
				if ids := c.cur.Policies(d); len(ids) > 0 {
					newCombos[IsolationChainName(cur, d, ids)] = combo{d, ids}
				}
			}
		}
	}

	rs := t.newRuleset()
	gone := false
	removeChain := func(n string) {
		if t.removeChain(rs, n) {
			gone = true
		}
	}

	// The policy's chains and the sets named after them go; the named-port
	// sets stop being filled.
	if existed {
		for _, n := range policyChainNames(&oldPol) {
			t.removeRuleChain(rs, n)
			gone = true
		}
	}

	// Combination chains: the count of local pods in each.
	for _, c := range changed {
		for _, n := range t.combos(c.old) {
			t.comboUse[n]--
		}
		for _, n := range t.combos(c.cur) {
			t.comboUse[n]++
		}
	}
	for n, c := range oldCombos {
		if t.comboUse[n] > 0 {
			continue
		}
		delete(t.comboUse, n)
		removeChain(n)
		if t.cfg.DenyLogGroup != 0 {
			deny := networkPolicyDeny(cur, c.d, c.ids).ID()
			removeChain(DenyChainName(deny))
			delete(rs.DenyIDs, deny)
		}
	}

	if gone {
		rs.ChainOrder = slices.DeleteFunc(rs.ChainOrder, func(n string) bool {
			_, ok := rs.Chains[n]
			return !ok
		})
	}

	// Render what is new: the policy's chains in the directions it
	// isolates a local pod, then every combination it is in.
	// A renderer of its own collects them (the configuration is the
	// tracker's, validated by NewTracker).
	r2 := &renderer{prog: cur, cfg: t.r.cfg, rs: &Ruleset{Chains: map[string]*Chain{}, Sets: map[string]*Set{}}}
	var has [2]bool
	for _, d := range []Direction{Ingress, Egress} {
		if used[d] {
			has[d] = r2.policyChain(nid, d)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(newCombos)) {
		c := newCombos[n]
		hasRules := map[PolicyID][2]bool{}
		for _, x := range c.ids {
			var h [2]bool
			if x == nid {
				h = has
			} else if _, ok := rs.Chains[PolicyChainName(&cur.Policies[x], c.d)]; ok {
				h[c.d] = true
			}
			hasRules[x] = h
		}
		r2.isolationChain(c.d, c.ids, hasRules)
	}
	t.placeRendered(rs, r2)

	fresh := t.mergeSets(rs, r2)

	// The pods: new places, then the new sets filled from every pod that
	// can be in them, then the changed pods' other elements.
	for k, c := range changed {
		t.views[k] = c.cur
	}
	t.fill(rs, fresh, ns)
	t.applyElementChanges(rs, changed, before, fresh)
	t.stale = true
	return true
}

// placeRendered adds the chains a policy or pod change rendered (r2) to
// rs, counting the shared sets they name: a chain rs has is replaced in
// place; a new one goes where Render would have created it (a deny-log
// chain just before its isolation chain, a ClusterNetworkPolicy's chains
// after the NetworkPolicy ones, combinations in name order); and the deny
// log's IDs.
func (t *Tracker) placeRendered(rs *Ruleset, r2 *renderer) {
	pendingDeny := ""
	for _, n := range r2.rs.ChainOrder {
		c := r2.rs.Chains[n]
		t.countPeerRefs(c, +1)
		if prev, ok := rs.Chains[n]; ok {
			t.countPeerRefs(prev, -1)
			rs.Chains[n] = c
			pendingDeny = ""
			continue
		}
		rs.Chains[n] = c
		_, clusterChain := t.cpol.chainKeys[n]
		switch {
		case strings.HasPrefix(n, denyChainPrefix):
			pendingDeny = n // placed with its isolation chain, just before it
		case isIsolationChain(n):
			i := comboPosition(rs.ChainOrder, n)
			if pendingDeny != "" {
				rs.ChainOrder = slices.Insert(rs.ChainOrder, i, pendingDeny, n)
			} else {
				rs.ChainOrder = slices.Insert(rs.ChainOrder, i, n)
			}
			pendingDeny = ""
		case isComboChain(n):
			rs.ChainOrder = slices.Insert(rs.ChainOrder, comboPosition(rs.ChainOrder, n), n)
		case clusterChain:
			rs.ChainOrder = slices.Insert(rs.ChainOrder, t.clusterChainPosition(rs.ChainOrder, n), n)
		default:
			rs.ChainOrder = slices.Insert(rs.ChainOrder, t.policyChainPosition(rs.ChainOrder, n), n)
		}
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

// scratchBuilder returns a builder that compiles one policy of either API
// into the tracker's program: it shares the tracker's selectors (a peer
// equal to an existing one reuses its ID and set) and, since nodes change
// only with a Rebuild, the last build's nodes and node sets. It resolves
// no pod: the tracker places its pods itself. Set prog's policies up to
// the ID to compile, then adopt what it interned.
func (t *Tracker) scratchBuilder() *builder {
	cur := t.cur
	return &builder{
		prog:       &Program{Node: cur.Node, Selectors: cur.Selectors, NodeAddrs: cur.NodeAddrs, NodeSets: cur.NodeSets},
		nsLabels:   map[string]labels.Set{},
		byNS:       map[string][]PodID{},
		sels:       t.b.sels,
		nsMatch:    map[string][]string{},
		selMatch:   t.b.selMatch,
		nodeLabels: t.b.nodeLabels,
		nodeNames:  t.b.nodeNames,
		nodeSets:   t.b.nodeSets,
	}
}

// adopt takes the selectors and node sets a scratch builder interned.
func (t *Tracker) adopt(sb *builder) {
	t.cur.Selectors = sb.prog.Selectors
	t.cur.NodeSets = sb.prog.NodeSets
	t.b.selMatch = sb.selMatch
}

// chainKey orders a policy's rule chain as Render creates them: by policy
// key (NUL after it, so that "x/a" sorts before "x/a-b"), then ingress (0)
// before egress (1).
func chainKey(policy string, d int) string { return policy + "\x00" + string(rune('0'+d)) }

// podChange is a tracked pod before and after a policy change.
type podChange struct{ old, cur *Pod }

// indexSelectorsFrom registers the selectors a policy change interned
// (IDs from first on) where place looks for them, and lists them.
func (t *Tracker) indexSelectorsFrom(first SelectorID) []SelectorID {
	out := make([]SelectorID, 0, len(t.cur.Selectors)-int(first))
	for sid := first; int(sid) < len(t.cur.Selectors); sid++ {
		out = append(out, sid)
		if m := t.b.selMatch[sid]; m.nsSel == nil {
			t.selByNS[m.ns] = append(t.selByNS[m.ns], sid)
		} else {
			t.nsSels = append(t.nsSels, sid)
		}
	}
	return out
}

// addSelectorMembers adds the new selectors to the MemberOf lists of the
// pods they select, recording each such pod in changed.
func (t *Tracker) addSelectorMembers(newSels []SelectorID, changed map[string]podChange) {
	for _, sid := range newSels {
		t.selectorPods(sid, func(k string, v *Pod) {
			c, ok := changed[k]
			if !ok {
				c = podChange{v, v}
			}
			if !t.selects(sid, c.cur) {
				return
			}
			if c.cur == v {
				nv := *v
				c.cur = &nv
			}
			// Clipped: the old slice may be the published program's.
			c.cur.MemberOf = append(c.cur.MemberOf[:len(c.cur.MemberOf):len(c.cur.MemberOf)], sid)
			changed[k] = c
		})
	}
}

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
	t.countPeerRefs(c, -1)
	delete(rs.Chains, n)
	return true
}

// removeRuleChain deletes a policy's rule chain and the sets named after
// it; its named-port sets stop being filled.
func (t *Tracker) removeRuleChain(rs *Ruleset, n string) {
	t.removeChain(rs, n)
	for s := range rs.Sets {
		if ownedBy(s, n) {
			delete(rs.Sets, s)
		}
	}
	t.r.named = slices.DeleteFunc(t.r.named, func(u namedPortUser) bool {
		if ownedBy(u.base+"-v4", n) {
			delete(t.r.namedBases, u.base)
			return true
		}
		return false
	})
}

// mergeSets adds the sets a policy change rendered (r2) to rs, and drops
// the peer sets no rule names any more. The policy's own sets come from
// the render (addresses and ports filled, named ports filled by fill); a
// peer set is new when no other rule used its selector, and goes when no
// rule does any more. It returns the sets that fill must fill.
func (t *Tracker) mergeSets(rs *Ruleset, r2 *renderer) map[string]bool {
	fresh := map[string]bool{}
	for n, s := range r2.rs.Sets {
		if _, ok := rs.Sets[n]; ok && isSharedSet(n) {
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

// ownProgram makes cur the tracker's own copy of the program, and indexes
// what policy changes need, on the first policy change after a Rebuild.
func (t *Tracker) ownProgram() {
	if t.pol.owned {
		return
	}
	c := *t.cur
	c.Policies = slices.Clone(c.Policies)
	c.Selectors = slices.Clone(c.Selectors)
	for i := range c.Selectors {
		// Appends must never write into the published program's arrays.
		s := &c.Selectors[i]
		s.Users = s.Users[:len(s.Users):len(s.Users)]
		s.Members = s.Members[:len(s.Members):len(s.Members)]
	}
	t.cur = &c
	t.r.prog = t.cur
	t.b.targets = slices.Clone(t.b.targets)
	t.b.selMatch = slices.Clone(t.b.selMatch)
	t.pol = policyState{owned: true, ids: map[string]PolicyID{}, chainKeys: map[string]string{}, peerRefs: map[string]int{}}
	for i := range c.Policies {
		p := &c.Policies[i]
		if _, dup := t.pol.ids[p.Key]; !dup {
			t.pol.ids[p.Key] = PolicyID(i)
		}
		for d, n := range policyChainNames(p) {
			t.pol.chainKeys[n] = chainKey(p.Key, d)
		}
	}
	for _, ch := range t.r.rs.Chains {
		t.countPeerRefs(ch, +1)
	}
}

// placePolicy keeps the namespace's policy list (which place reads) in key
// order, as the program's pods list their policies.
func (t *Tracker) placePolicy(ns string, id PolicyID, exists bool) {
	ids := slices.DeleteFunc(slices.Clone(t.polsByNS[ns]), func(x PolicyID) bool { return x == id })
	if exists {
		ids = t.withPolicy(ids, id, true)
	}
	t.polsByNS[ns] = ids
}

// withPolicy returns ids (policy IDs in key order) with id in or out, in
// a new slice.
func (t *Tracker) withPolicy(ids []PolicyID, id PolicyID, in bool) []PolicyID {
	out := make([]PolicyID, 0, len(ids)+1)
	key := t.cur.Policies[id].Key
	placed := !in
	for _, x := range ids {
		if x == id {
			continue
		}
		if !placed && t.cur.Policies[x].Key > key {
			out = append(out, id)
			placed = true
		}
		out = append(out, x)
	}
	if !placed {
		out = append(out, id)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// selects reports whether a pod belongs to a selector, as the build
// decides it.
func (t *Tracker) selects(sid SelectorID, pod *Pod) bool {
	m := &t.b.selMatch[sid]
	if m.nsSel == nil {
		if pod.Namespace != m.ns {
			return false
		}
	} else {
		nsl, ok := t.b.nsLabels[pod.Namespace]
		if !ok {
			nsl = labels.Set{NamespaceNameLabel: pod.Namespace}
		}
		if !m.nsSel.Matches(nsl) {
			return false
		}
	}
	return m.podSel.Matches(labels.Set(pod.Labels))
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
	emit := func(set string, e knftables.Element) {
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
		if !fresh[u.base+"-v4"] && !fresh[u.base+"-v6"] {
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
			for k, v := range t.views {
				covered(k, v)
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

// countPeerRefs adds n for each shared set a chain's rules name: the peer
// sets and the node sets of ClusterNetworkPolicy nodes peers.
func (t *Tracker) countPeerRefs(c *Chain, n int) {
	for i := range c.Rules {
		text := c.Rules[i].Rule
		for {
			j := strings.IndexByte(text, '@')
			if j < 0 {
				break
			}
			text = text[j+1:]
			end := strings.IndexByte(text, ' ')
			if end < 0 {
				end = len(text)
			}
			if name := text[:end]; isSharedSet(name) {
				t.pol.peerRefs[name] += n
			}
			text = text[end:]
		}
	}
}

// isSharedSet reports whether rules of several policies can name a set:
// a peer set or a node set, which exists while a rendered rule names it.
func isSharedSet(name string) bool {
	return strings.HasPrefix(name, "peers-") || strings.HasPrefix(name, "nodes-")
}

// policyChainNames are a policy's chains, ingress and egress.
func policyChainNames(p *Policy) [2]string {
	return [2]string{PolicyChainName(p, Ingress), PolicyChainName(p, Egress)}
}

// ownedBy reports whether a set is one of a policy chain's rule sets:
// <chain>-<rule index>-ports, -cidrs-v4/-v6 or -named-v4/-v6.
func ownedBy(set, chain string) bool {
	rest, ok := strings.CutPrefix(set, chain+"-")
	if !ok {
		return false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || i == len(rest) || rest[i] != '-' {
		return false
	}
	switch rest[i+1:] {
	case "ports", "cidrs-v4", "cidrs-v6", "named-v4", "named-v6":
		return true
	}
	return false
}

// isIsolationChain reports whether a chain is a NetworkPolicy combination
// chain (policy chains hold a "/" in their names).
func isIsolationChain(n string) bool {
	return (strings.HasPrefix(n, "ingress-isolated-") || strings.HasPrefix(n, "egress-isolated-")) && !strings.Contains(n, "/")
}

// isComboChain reports whether a chain is a combination chain of either
// API: Render creates them after every policy chain, in name order.
func isComboChain(n string) bool {
	if isIsolationChain(n) {
		return true
	}
	if strings.Contains(n, "/") {
		return false
	}
	for _, p := range []string{"ingress-admin-", "ingress-baseline-", "egress-admin-", "egress-baseline-"} {
		if rest, ok := strings.CutPrefix(n, p); ok && len(rest) == 8 {
			return true
		}
	}
	return false
}

// isTailChain reports whether Render creates a chain after the combination
// chains: the base chains and the DNS capture.
func isTailChain(n string) bool {
	return n == ChainInput || n == ChainForward || n == ChainOutput || n == ChainDNS || n == ChainDNSQueryShare || n == ChainDNSReplyShare || n == ChainDNSQueriesForward || n == ChainDNSQueriesInput
}

// comboPosition is where Render would have created a new combination
// chain: before the first combination chain named after it or the base
// chains, and before the deny chain that goes with that chain.
func comboPosition(order []string, name string) int {
	i := 0
	for ; i < len(order); i++ {
		if isTailChain(order[i]) || isComboChain(order[i]) && order[i] > name {
			break
		}
	}
	if i > 0 && i < len(order) && isIsolationChain(order[i]) && strings.HasPrefix(order[i-1], denyChainPrefix) {
		i--
	}
	return i
}

// policyChainPosition is where Render would have created a new
// NetworkPolicy chain: after the static chains and the policy chains that
// come before it (policy key, then ingress before egress).
func (t *Tracker) policyChainPosition(order []string, name string) int {
	key := t.pol.chainKeys[name]
	for i, n := range order {
		if isStaticChain(n) {
			continue
		}
		if k, ok := t.pol.chainKeys[n]; ok && k < key {
			continue
		}
		return i
	}
	return len(order)
}

// isStaticChain reports whether Render creates a chain before every
// policy chain: the queue chain, the per-source share chains and the tier
// dispatch chains.
func isStaticChain(n string) bool {
	switch n {
	case ChainQueue, ChainQueueHeld, ChainQueueShare, ChainDenyLogLimits, ChainEgressAllow:
		return true
	}
	for _, d := range []Direction{Ingress, Egress} {
		tc := tiers(d)
		if n == tc.entry || n == tc.networkPolicy || n == tc.baseline {
			return true
		}
	}
	return false
}

// notePodMoved records that a pod changed since the last build.
func (t *Tracker) notePodMoved(key string) {
	ns, _, _ := strings.Cut(key, "/")
	if t.moved == nil {
		t.moved = map[string]map[string]bool{}
	}
	if t.moved[ns] == nil {
		t.moved[ns] = map[string]bool{}
	}
	t.moved[ns][key] = true
}

// podsIn calls f with every tracked pod of a namespace: the build's pods
// of the namespace that did not move since, then those that did and are
// still tracked. It costs the namespace's pods, not the cluster's.
func (t *Tracker) podsIn(ns string, f func(key string, v *Pod)) {
	moved := t.moved[ns]
	for _, pid := range t.b.byNS[ns] {
		key := t.prog.Pods[pid].Key
		if !moved[key] {
			f(key, t.views[key])
		}
	}
	for key := range moved {
		if v := t.views[key]; v != nil {
			f(key, v)
		}
	}
}

// namespaces lists every namespace that can hold a tracked pod.
func (t *Tracker) namespaces() []string {
	out := make([]string, 0, len(t.b.byNS)+len(t.moved))
	for ns := range t.b.byNS {
		out = append(out, ns)
	}
	for ns := range t.moved {
		if _, ok := t.b.byNS[ns]; !ok {
			out = append(out, ns)
		}
	}
	return out
}

// selectorPods calls f with every tracked pod in the namespaces a
// selector can select (its members among them).
func (t *Tracker) selectorPods(sid SelectorID, f func(key string, v *Pod)) {
	m := &t.b.selMatch[sid]
	if m.nsSel == nil {
		t.podsIn(m.ns, f)
		return
	}
	for _, ns := range t.namespaces() {
		nsl, ok := t.b.nsLabels[ns]
		if !ok {
			nsl = labels.Set{NamespaceNameLabel: ns}
		}
		if m.nsSel.Matches(nsl) {
			t.podsIn(ns, f)
		}
	}
}
