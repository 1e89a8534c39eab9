package compile

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
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
// The change is not tracked (a Fallback other than NoFallback tells why)
// in queue mode (the evaluator decides every selected pod's connections
// and must have the current program, so every change there is a full
// build), or for a key that does not name the object. Nothing was changed
// then; the caller rebuilds. The Program lags, as it does for pod changes:
// Stale reports true until the next Rebuild; not after a change that
// compiles to the policy the program holds and moves no pod (a policy
// rejected for its budget before and after, alike).
//
// A staged policy (Staged; its namespace's stagedness is the last
// Rebuild's, as namespace changes rebuild) is applied as deleted, unless
// the last Rebuild's input enforced staged policies.
func (t *Tracker) ApplyPolicy(key string, np *networkingv1.NetworkPolicy) Fallback {
	ns, _, _ := strings.Cut(key, "/")
	if f := t.stagedPolicyChange(key, np != nil && t.b != nil && !t.b.enforced(np)); f != NoFallback {
		return f
	}
	if np != nil && t.b != nil && policyKey(np) == key && !t.b.enforced(np) {
		np = nil
	}
	k := &npChange{key: key, ns: ns, np: np}
	f := t.applyPolicyChange(k)
	if f == NoFallback && t.r != nil {
		t.noteCost(key, ns, k.resolved(), k.bound)
		t.notePeerKeys(key, k.peerKeys)
	}
	return f
}

// policyKind is the part of a policy change (applyPolicyChange) that
// depends on the policy's API: npChange or cnpChange.
type policyKind interface {
	// check tells why the change cannot be tracked (NoFallback when it
	// can), before anything changed.
	check(t *Tracker) Fallback
	// own makes the program's policies of the kind the tracker's own.
	own(t *Tracker)
	// find returns the policy's ID, a new one when it did not exist;
	// deleted reports whether the change deletes it.
	find(t *Tracker) (id int, existed bool)
	deleted() bool
	// install compiles the new version into the tracker's program in
	// place of the old one.
	install(t *Tracker, id int, existed bool)
	// reselect calls f with each tracked local pod the policy may select,
	// before or after the change, as it is and as it is after the change
	// (the same pointer when its policies do not change).
	reselect(t *Tracker, f func(key string, old, cur *Pod))
	// cluster reports whether the policy is a ClusterNetworkPolicy; has
	// whether a combination chain of its API lists it.
	cluster() bool
	has(c combo) bool
	// oldChains are the policy's rule chains before the change.
	oldChains() []string
	// ruleChain renders the policy's rule chain in direction d with r;
	// false when it has no rule there.
	ruleChain(r *renderer, d Direction) bool
	// namespace is where its subjects are ("" for any namespace).
	namespace() string
}

// policyEdit is where a changed policy stands among the tracked pods.
type policyEdit struct {
	// changed are the pods whose policies or selectors change.
	changed map[string]podChange
	// old and new are the combination chains of the policy's API that
	// list it or that a changed pod leaves (old) or enters (new), by name.
	old, new map[string]combo
	// used reports, per direction, whether a local pod has the policy
	// after the change (its rule chain is rendered).
	used [2]bool
}

// applyPolicyChange is ApplyPolicy and ApplyClusterPolicy: it installs the
// new version of the policy, reselects its subjects, deletes its chains
// and the combination chains that list it or that no local pod uses any
// more, renders its chains and the combinations its subjects are in, and
// updates the elements of the pods that moved.
func (t *Tracker) applyPolicyChange(k policyKind) Fallback {
	if t.r == nil {
		return FallbackNotBuilt
	}
	if t.cfg.Mode == ModeQueue {
		return FallbackQueueMode
	}
	if f := k.check(t); f != NoFallback {
		return f
	}
	k.own(t)
	id, existed := k.find(t)
	if !existed && k.deleted() {
		// Never seen: Build would not see it either, but the program's
		// list of staged policies may name it.
		t.policyChanged()
		return NoFallback
	}
	// The new version is compiled with the tracker's selectors: a peer
	// that selects what an existing selector selects shares its ID (and
	// set).
	firstNewSel := SelectorID(len(t.cur.Selectors))
	k.install(t, id, existed)
	newSels := t.indexSelectorsFrom(firstNewSel)
	e := t.reselectPods(k)
	t.addSelectorMembers(newSels, e.changed)
	before := t.moveChanged(k, e)

	// What goes: the policy's chains and the sets they own, and every
	// combination chain that lists it (rendered again below) or that no
	// local pod uses any more.
	rs := t.newRuleset()
	for _, n := range k.oldChains() {
		t.removeRuleChain(rs, n)
	}
	for n, c := range e.old {
		if t.comboUse[n] > 0 && !k.has(c) {
			continue
		}
		if t.comboUse[n] <= 0 {
			delete(t.comboUse, n)
		}
		t.dropCombo(rs, c, n)
	}
	dropDeletedChains(rs)

	// What comes: the policy's chains in the directions it has a local
	// pod in, then every combination chain not in the ruleset.
	r2 := t.subRenderer()
	for _, d := range []Direction{Ingress, Egress} {
		if e.used[d] {
			k.ruleChain(r2, d)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(e.new)) {
		if _, ok := rs.Chains[n]; !ok {
			r2.comboChain(e.new[n], t.ruleChains(rs, r2, e.new[n], false))
		}
	}
	t.placeRendered(rs, r2)
	t.r.combos = append(t.r.combos, r2.combos...)
	fresh := t.mergeSets(rs, r2)

	// The pods: the new sets filled from every pod that can be in them,
	// then the changed pods' other elements.
	t.fill(rs, fresh, k.namespace())
	t.applyElementChanges(rs, e.changed, before, fresh)
	if k.cluster() {
		t.indexCombos()
	}
	if nk, ok := k.(*npChange); !ok || !nk.sameCompiled || len(e.changed) > 0 || len(newSels) > 0 {
		t.policyChanged()
	}
	return NoFallback
}

// policyChanged records that the program lags the tracked ruleset until
// the next Rebuild: Program does not follow policy changes.
func (t *Tracker) policyChanged() {
	t.stale = true
	t.gen++
	t.pending = nil
}

// reselectPods finds where a changed policy stands among the tracked
// local pods: its subjects before and after and the combinations of its
// API that list it.
func (t *Tracker) reselectPods(k policyKind) *policyEdit {
	e := &policyEdit{changed: map[string]podChange{}, old: map[string]combo{}, new: map[string]combo{}}
	k.reselect(t, func(key string, v, nv *Pod) {
		if nv != v {
			e.changed[key] = podChange{v, nv}
		}
		for _, c := range t.combos(v) {
			if (c.t != 0) == k.cluster() && k.has(c.combo) {
				e.old[c.name] = c.combo
			}
		}
		for _, c := range t.combos(nv) {
			if (c.t != 0) == k.cluster() && k.has(c.combo) {
				e.new[c.name] = c.combo
				e.used[c.d] = true
			}
		}
	})
	return e
}

// moveChanged returns what the pods whose policies change contribute
// before the change, by pod key; it records the combinations they leave
// and enter and their uses, and tracks the changed pods as they are after
// the change (the tier-skip sets of new combination chains list the
// members of their selectors as tracked now).
func (t *Tracker) moveChanged(k policyKind, e *policyEdit) map[string]map[string]setElement {
	before := make(map[string]map[string]setElement, len(e.changed))
	for key, c := range e.changed {
		if samePolicyLists(c.old, c.cur) {
			continue
		}
		before[key] = t.elementsOf(c.old)
		for _, nc := range t.combos(c.old) {
			t.comboUse[nc.name]--
			if (nc.t != 0) == k.cluster() {
				e.old[nc.name] = nc.combo
			}
		}
		for _, nc := range t.combos(c.cur) {
			t.comboUse[nc.name]++
			if (nc.t != 0) == k.cluster() {
				e.new[nc.name] = nc.combo
			}
		}
	}
	for key, c := range e.changed {
		t.setView(key, c.cur)
	}
	return before
}

// samePolicyLists reports whether two versions of a pod have the same
// policies of both APIs in every tier and direction.
func samePolicyLists(a, b *Pod) bool {
	return slices.Equal(a.IngressPolicies, b.IngressPolicies) && slices.Equal(a.EgressPolicies, b.EgressPolicies) &&
		slices.Equal(a.AdminIngress, b.AdminIngress) && slices.Equal(a.AdminEgress, b.AdminEgress) &&
		slices.Equal(a.BaselineIngress, b.BaselineIngress) && slices.Equal(a.BaselineEgress, b.BaselineEgress)
}

// npChange is a NetworkPolicy change (ApplyPolicy).
type npChange struct {
	key, ns string
	np      *networkingv1.NetworkPolicy
	// Set by install: the policy's ID, whether it existed, its chains
	// before, its target and the directions it isolates after.
	id       PolicyID
	existed  bool
	old      []string
	target   labels.Selector
	isolates [2]bool
	// bound is checkCost's bound on what the new version makes, or its
	// budget when overBudget (the build rejects it for its budget);
	// peerKeys the new version's peer keys (checkPolicyShares).
	bound      int
	overBudget bool
	peerKeys   []string
	// sameCompiled is set by install when the new version compiles to
	// the policy the program holds (its subjects aside).
	sameCompiled bool
}

// sameCompiled reports whether two compiled versions of a policy are the
// same but for the pods they select.
func sameCompiled(a, b *Policy) bool {
	x, y := *a, *b
	x.Selected, y.Selected = nil, nil
	return reflect.DeepEqual(x, y)
}

func (k *npChange) check(t *Tracker) Fallback {
	if k.np != nil && policyKey(k.np) != k.key {
		return FallbackKeyMismatch
	}
	var f Fallback
	if k.bound, k.overBudget, f = t.checkCost(k.key, k.ns, k.np); f != NoFallback {
		return f
	}
	k.peerKeys, f = t.checkPolicyShares(k.key, k.resolved())
	return f
}

// resolved is the new version as far as its peers go: none when it is
// deleted or rejected for its budget (no set is made for it).
func (k *npChange) resolved() *networkingv1.NetworkPolicy {
	if k.overBudget {
		return nil
	}
	return k.np
}

func (k *npChange) own(t *Tracker) { t.ownProgram() }

func (k *npChange) find(t *Tracker) (int, bool) { return findID(t.pol.ids, k.key, len(t.cur.Policies)) }
func (k *npChange) deleted() bool               { return k.np == nil }

// findID returns the ID of a policy by key, or the next one (n) when
// there is none.
func findID[ID ~int32](ids map[string]ID, key string, n int) (int, bool) {
	if id, ok := ids[key]; ok {
		return int(id), true
	}
	return n, false
}

func (k *npChange) install(t *Tracker, i int, existed bool) {
	cur, id := t.cur, PolicyID(i)
	if existed {
		k.old = []string{PolicyChainName(&cur.Policies[id], Ingress), PolicyChainName(&cur.Policies[id], Egress)}
	}
	newPol, target := Policy{Namespace: k.ns, Name: k.key[len(k.ns)+1:], Key: k.key}, labels.Nothing()
	if k.np != nil {
		sb := t.scratchBuilder()
		sb.budgets, sb.overBudget = t.b.budgets, k.overBudget
		sb.prog.Policies = cur.Policies[:id:id]
		newPol, target = sb.compilePolicy(k.np), sb.targets[0]
		t.adopt(sb)
	}
	if existed && sameCompiled(&cur.Policies[id], &newPol) {
		// An edit that compiles to what was there (metadata; a policy
		// rejected for its budget before and after, with the same
		// podSelector): with no pod moved and no selector interned, the
		// program is unchanged and does not lag (applyPolicyChange).
		newPol.Selected = cur.Policies[id].Selected
		k.sameCompiled = true
	}
	installAt(&cur.Policies, i, newPol)
	installAt(&t.b.targets, i, target)
	t.pol.ids[k.key] = id
	t.placePolicy(k.ns, id, k.np != nil)
	if k.np == nil {
		delete(t.pol.ids, k.key)
	}
	k.id, k.existed, k.target = id, existed, target
	k.isolates = [2]bool{Ingress: newPol.IsolatesIngress, Egress: newPol.IsolatesEgress}
}

// installAt puts v at index i of a list, appended when i is its length.
func installAt[T any](list *[]T, i int, v T) {
	if i < len(*list) {
		(*list)[i] = v
	} else {
		*list = append(*list, v)
	}
}

// reselect visits the namespace's local pods: a NetworkPolicy selects
// pods of its own namespace only.
func (k *npChange) reselect(t *Tracker, f func(key string, old, cur *Pod)) {
	t.podsIn(k.ns, func(key string, v *Pod) {
		if !v.Local {
			return
		}
		match := k.np != nil && k.target.Matches(labels.Set(v.Labels))
		var was, is [2]bool
		for _, d := range []Direction{Ingress, Egress} {
			was[d] = k.existed && slices.Contains(v.Policies(d), k.id)
			is[d] = match && k.isolates[d]
		}
		nv := v
		if was != is {
			c := *v
			c.OwnSubject()
			c.IngressPolicies = t.withPolicy(v.IngressPolicies, k.id, is[Ingress])
			c.EgressPolicies = t.withPolicy(v.EgressPolicies, k.id, is[Egress])
			nv = &c
		}
		f(key, v, nv)
	})
}

func (k *npChange) cluster() bool                           { return false }
func (k *npChange) has(c combo) bool                        { return slices.Contains(c.ids, k.id) }
func (k *npChange) oldChains() []string                     { return k.old }
func (k *npChange) namespace() string                       { return k.ns }
func (k *npChange) ruleChain(r *renderer, d Direction) bool { return r.policyChain(k.id, d) }

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
	t.pol = policyState{owned: true, ids: map[string]PolicyID{}, peerRefs: map[string]int{}}
	for i := range c.Policies {
		if _, dup := t.pol.ids[c.Policies[i].Key]; !dup {
			t.pol.ids[c.Policies[i].Key] = PolicyID(i)
		}
	}
	for _, ch := range t.r.rs.Chains {
		t.countShares(ch, +1)
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
func (t *Tracker) selects(sid SelectorID, pod *Pod) bool { return t.matches(&t.b.selMatch[sid], pod) }

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
			f(key, t.view(key))
		}
	}
	for key := range moved {
		if v := t.view(key); v != nil {
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
