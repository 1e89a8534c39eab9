package compile

import (
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// clusterState is what the tracker learns, after a Rebuild, to apply
// ClusterNetworkPolicy changes; it is filled on the first one.
type clusterState struct {
	// owned is set once cur.ClusterPolicies and the builder's subjects are
	// the tracker's own copies.
	owned bool
	// ids maps a policy's name to its index in cur.ClusterPolicies. A
	// deleted policy keeps its index as an empty policy that selects no
	// pod: the indices the tracked pods hold stay valid. IDs are then no
	// longer in name order; precedence ties are broken by name, not ID.
	ids map[string]ClusterPolicyID
	// chainKeys orders the ClusterNetworkPolicy rule chains as Render
	// creates them: chain name -> policy name, NUL, then "0" for ingress
	// or "1" for egress.
	chainKeys map[string]string
}

// podCombo is a combination chain of one tier and direction.
type podCombo struct {
	t   Tier
	d   Direction
	ids []ClusterPolicyID
}

// ApplyClusterPolicy tracks an add, update or delete of the
// ClusterNetworkPolicy named name (cnp nil when deleted), as ApplyPolicy
// does for a NetworkPolicy: it recompiles that policy alone, places it on
// the local pods its subject selects in any namespace, rewrites its rule
// chains and every combination chain (with its tier-skip sets) it is or
// was in, fills the peer sets it is the first to use and drops those it
// was the last to use. Priority and tier changes are tracked: precedence
// is priority, then name, so re-placing the one policy in the lists of
// its subjects orders them as the build does. The tracked ruleset is then
// equal to Render(Build(...)) of the same objects, and is a new Ruleset
// sharing every unchanged chain and set with the previous one.
//
// ok is false, and nothing was changed, where the change is not tracked:
// queue mode (every change is a full build there, as for NetworkPolicy),
// a deny log group (deny chains are placed with the rule chains), a
// policy with domainNames peers before or after the change (the DNS
// capture, its subjects and the learned addresses are shared state the
// build alone decides), or a name that does not name the object. The
// caller rebuilds. A nodes peer resolves on the nodes of the last build
// (node changes rebuild) and shares its node set with the other rules
// that name the same nodes.
func (t *Tracker) ApplyClusterPolicy(name string, cnp *npav1beta1.ClusterNetworkPolicy) (ok bool) {
	if t.r == nil || t.cfg.Mode == ModeQueue || t.cfg.DenyLogGroup != 0 {
		return false
	}
	if cnp != nil && (cnp.Name != name || hasDomainPeers(cnp)) {
		return false
	}
	if t.cpol.owned {
		if id, ok := t.cpol.ids[name]; ok && !clusterRulesTrackable(&t.cur.ClusterPolicies[id]) {
			return false
		}
	} else {
		for i := range t.cur.ClusterPolicies {
			if t.cur.ClusterPolicies[i].Name == name && !clusterRulesTrackable(&t.cur.ClusterPolicies[i]) {
				return false
			}
		}
	}
	t.ownCluster()
	cur := t.cur
	id, existed := t.cpol.ids[name]
	if !existed && cnp == nil {
		return true // never seen: Build would not see it either
	}

	// Compile the new version with the tracker's selectors: a peer that
	// selects what an existing selector selects shares its ID (and set).
	nid := id
	if !existed {
		nid = ClusterPolicyID(len(cur.ClusterPolicies))
	}
	var oldCP ClusterPolicy
	oldSubj := clusterSubject{ns: labels.Nothing()}
	if existed {
		oldCP = cur.ClusterPolicies[id]
		oldSubj = t.b.subjects[id]
	}
	firstNewSel := SelectorID(len(cur.Selectors))
	newCP := ClusterPolicy{Name: name} // deleted: no rules, no subjects
	subj := clusterSubject{ns: labels.Nothing()}
	if cnp != nil {
		sb := t.scratchBuilder()
		sb.prog.ClusterPolicies = cur.ClusterPolicies[:nid:nid]
		newCP = sb.compileCluster(cnp, true)
		subj = sb.subjects[0]
		t.adopt(sb)
	}
	newSels := t.indexSelectorsFrom(firstNewSel)
	if existed {
		cur.ClusterPolicies[id] = newCP
		t.b.subjects[id] = subj
	} else {
		cur.ClusterPolicies = append(cur.ClusterPolicies, newCP)
		t.b.subjects = append(t.b.subjects, subj)
	}
	if cnp != nil {
		t.cpol.ids[name] = nid
		for d, n := range clusterChainNames(&newCP) {
			t.cpol.chainKeys[n] = chainKey(name, d)
		}
	} else {
		delete(t.cpol.ids, name)
	}

	// Where the policy stands among the local pods: its subjects before
	// and after (in the namespaces either subject selects), the
	// combinations it is in, and the pods that the new selectors select.
	changed := map[string]podChange{}
	oldCombos := map[string]podCombo{}
	newCombos := map[string]podCombo{}
	var used [2]bool
	for _, ns := range t.namespaces() {
		nsl, ok := t.b.nsLabels[ns]
		if !ok {
			nsl = labels.Set{NamespaceNameLabel: ns}
		}
		if !oldSubj.matchesNamespace(nsl) && !subj.matchesNamespace(nsl) {
			continue
		}
		t.podsIn(ns, func(k string, v *Pod) {
			if !v.Local {
				return
			}
			is := cnp != nil && subj.matchesLabels(nsl, v.Labels)
			if !is && !(existed && v.hasClusterPolicy(id)) {
				return // neither before nor after
			}
			nv := *v
			nv.AdminIngress = withoutCluster(v.AdminIngress, nid)
			nv.AdminEgress = withoutCluster(v.AdminEgress, nid)
			nv.BaselineIngress = withoutCluster(v.BaselineIngress, nid)
			nv.BaselineEgress = withoutCluster(v.BaselineEgress, nid)
			if is {
				nv.addClusterPolicy(&newCP, nid)
				cur.orderClusterPolicies(&nv)
			}
			p := v
			if !sameClusterLists(v, &nv) {
				p = &nv
				changed[k] = podChange{v, p}
			}
			t.forCombos(v, func(c podCombo, n string) {
				if existed && slices.Contains(c.ids, id) {
					oldCombos[n] = c
				}
			})
			t.forCombos(p, func(c podCombo, n string) {
				if slices.Contains(c.ids, nid) {
					used[c.d] = true
					newCombos[n] = c
				}
			})
		})
	}
	t.addSelectorMembers(newSels, changed)

	// What the changed pods contribute now, before the ruleset changes,
	// and every combination they leave or enter (with the policy or not).
	before := make(map[string]map[string]setElement, len(changed))
	for k, c := range changed {
		if sameClusterLists(c.old, c.cur) {
			continue
		}
		before[k] = t.elementsOf(c.old)
		t.forCombos(c.old, func(cc podCombo, n string) { oldCombos[n] = cc })
		t.forCombos(c.cur, func(cc podCombo, n string) { newCombos[n] = cc })
		for _, n := range t.combos(c.old) {
			t.comboUse[n]--
		}
		for _, n := range t.combos(c.cur) {
			t.comboUse[n]++
		}
	}
	// The tier-skip sets of new combination chains list the members of
	// their selectors as tracked now.
	for k, c := range changed {
		t.views[k] = c.cur
	}

	rs := t.newRuleset()
	if existed {
		for _, n := range clusterChainNames(&oldCP) {
			t.removeRuleChain(rs, n)
		}
	}
	// A combination chain goes when no local pod uses it any more, or when
	// it lists the policy (rendered again below, with its tier-skip sets).
	for n, c := range oldCombos {
		if t.comboUse[n] > 0 && !slices.Contains(c.ids, nid) {
			continue
		}
		if t.comboUse[n] <= 0 {
			delete(t.comboUse, n)
		}
		t.removeChain(rs, n)
		delete(rs.Sets, n+famSuffix(true))
		delete(rs.Sets, n+famSuffix(false))
		t.r.combos = slices.DeleteFunc(t.r.combos, func(s comboSet) bool { return s.chain == n })
	}
	rs.ChainOrder = slices.DeleteFunc(rs.ChainOrder, func(n string) bool {
		_, ok := rs.Chains[n]
		return !ok
	})

	// Render what is new: the policy's chains in the directions it has
	// a local subject in, then every combination chain not in the ruleset.
	r2 := &renderer{prog: cur, cfg: t.r.cfg, rs: &Ruleset{Chains: map[string]*Chain{}, Sets: map[string]*Set{}}, addrs: t.trackedSelectorAddrs}
	var has [2]bool
	for _, d := range []Direction{Ingress, Egress} {
		if used[d] {
			has[d] = r2.clusterPolicyChain(nid, d)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(newCombos)) {
		if _, ok := rs.Chains[n]; ok {
			continue
		}
		c := newCombos[n]
		hasRules := map[ClusterPolicyID][2]bool{}
		for _, x := range c.ids {
			var h [2]bool
			if x == nid {
				h = has
			} else if _, ok := rs.Chains[ClusterPolicyChainName(&cur.ClusterPolicies[x], c.d)]; ok {
				h[c.d] = true
			}
			hasRules[x] = h
		}
		r2.clusterComboChain(c.t, c.d, c.ids, hasRules)
	}
	for _, n := range r2.rs.ChainOrder {
		c := r2.rs.Chains[n]
		t.countPeerRefs(c, +1)
		if prev, ok := rs.Chains[n]; ok {
			t.countPeerRefs(prev, -1)
			rs.Chains[n] = c
			continue
		}
		rs.Chains[n] = c
		i := t.clusterChainPosition(rs.ChainOrder, n)
		if isComboChain(n) {
			i = comboPosition(rs.ChainOrder, n)
		}
		rs.ChainOrder = slices.Insert(rs.ChainOrder, i, n)
	}
	t.r.combos = append(t.r.combos, r2.combos...)
	fresh := t.mergeSets(rs, r2)

	// The pods: the new sets filled from every pod that can be in them,
	// then the changed pods' other elements.
	t.fill(rs, fresh, "")
	t.applyElementChanges(rs, changed, before, fresh)
	t.indexCombos()
	t.stale = true
	return true
}

// ownCluster makes the ClusterNetworkPolicies and their subjects the
// tracker's own, and indexes them, on the first change after a Rebuild.
func (t *Tracker) ownCluster() {
	if t.cpol.owned {
		return
	}
	t.ownProgram()
	t.cur.ClusterPolicies = slices.Clone(t.cur.ClusterPolicies)
	t.cur.NodeSets = slices.Clone(t.cur.NodeSets) // appends must not reach the published program
	t.b.subjects = slices.Clone(t.b.subjects)
	t.cpol = clusterState{owned: true, ids: map[string]ClusterPolicyID{}, chainKeys: map[string]string{}}
	for i := range t.cur.ClusterPolicies {
		p := &t.cur.ClusterPolicies[i]
		if _, dup := t.cpol.ids[p.Name]; dup {
			continue
		}
		t.cpol.ids[p.Name] = ClusterPolicyID(i)
		for d, n := range clusterChainNames(p) {
			t.cpol.chainKeys[n] = chainKey(p.Name, d)
		}
	}
}

// hasDomainPeers reports whether a ClusterNetworkPolicy names domainNames
// peers, which ApplyClusterPolicy leaves to the full build.
func hasDomainPeers(cnp *npav1beta1.ClusterNetworkPolicy) bool {
	for _, r := range cnp.Spec.Egress {
		for _, p := range r.To {
			if p.DomainNames != nil {
				return true
			}
		}
	}
	return false
}

// clusterRulesTrackable reports whether a compiled policy has no
// domainNames peers.
func clusterRulesTrackable(cp *ClusterPolicy) bool {
	for _, d := range []Direction{Ingress, Egress} {
		for _, r := range cp.Rules(d) {
			if len(r.Domains) > 0 {
				return false
			}
		}
	}
	return true
}

// clusterChainNames are a ClusterNetworkPolicy's rule chains, ingress and
// egress.
func clusterChainNames(p *ClusterPolicy) [2]string {
	return [2]string{ClusterPolicyChainName(p, Ingress), ClusterPolicyChainName(p, Egress)}
}

// withoutCluster returns ids without id, in a new slice (nil when empty).
func withoutCluster(ids []ClusterPolicyID, id ClusterPolicyID) []ClusterPolicyID {
	var out []ClusterPolicyID
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// sameClusterLists reports whether two versions of a pod have the same
// ClusterNetworkPolicies in every tier and direction.
func sameClusterLists(a, b *Pod) bool {
	return slices.Equal(a.AdminIngress, b.AdminIngress) && slices.Equal(a.AdminEgress, b.AdminEgress) &&
		slices.Equal(a.BaselineIngress, b.BaselineIngress) && slices.Equal(a.BaselineEgress, b.BaselineEgress)
}

// forCombos calls f with each ClusterNetworkPolicy combination chain of a
// local pod, and its name. Names depend on the policies' names only,
// which an ID keeps.
func (t *Tracker) forCombos(pod *Pod, f func(podCombo, string)) {
	for _, d := range []Direction{Ingress, Egress} {
		for _, tier := range []Tier{TierAdmin, TierBaseline} {
			if ids := pod.ClusterPolicies(tier, d); len(ids) > 0 {
				f(podCombo{tier, d, ids}, ClusterComboChainName(t.cur, tier, d, ids))
			}
		}
	}
}

// clusterChainPosition is where Render would have created a new
// ClusterNetworkPolicy rule chain: after the static chains, the
// NetworkPolicy chains and the rule chains of the policies named before
// it (ingress before egress), before the combination chains.
func (t *Tracker) clusterChainPosition(order []string, name string) int {
	key := t.cpol.chainKeys[name]
	for i, n := range order {
		if isStaticChain(n) {
			continue
		}
		if _, ok := t.pol.chainKeys[n]; ok {
			continue
		}
		if k, ok := t.cpol.chainKeys[n]; ok && k < key {
			continue
		}
		return i
	}
	return len(order)
}

// trackedSelectorAddrs lists the addresses of a selector's tracked
// members, for the tier-skip sets; a selector no tier-skip set named yet
// is indexed from the tracked pods.
func (t *Tracker) trackedSelectorAddrs(sid SelectorID, f func(netip.Addr)) {
	m, ok := t.selAddrs[sid]
	if !ok {
		m = map[string][]netip.Addr{}
		t.selectorPods(sid, func(k string, v *Pod) {
			if v.InSelector(sid) {
				m[k] = v.IPs
			}
		})
		t.selAddrs[sid] = m
	}
	for _, ips := range m {
		for _, a := range ips {
			f(a)
		}
	}
}

// indexCombos indexes, after a ClusterNetworkPolicy change, the selectors
// the tier-skip sets name (updateCombos follows them as pods change) and
// forgets the members of those no set names any more.
func (t *Tracker) indexCombos() {
	t.comboSels = map[SelectorID][]int{}
	for ci, c := range t.r.combos {
		for _, id := range c.ids {
			rules := t.cur.ClusterPolicies[id].Rules(c.d)
			for i := range rules {
				for _, sid := range rules[i].Selectors {
					if !slices.Contains(t.comboSels[sid], ci) {
						t.comboSels[sid] = append(t.comboSels[sid], ci)
					}
					if _, ok := t.selAddrs[sid]; !ok {
						t.trackedSelectorAddrs(sid, func(netip.Addr) {})
					}
				}
			}
		}
	}
	for sid := range t.selAddrs {
		if _, ok := t.comboSels[sid]; !ok {
			delete(t.selAddrs, sid)
		}
	}
}

// matchesNamespace reports whether a subject can select pods of a
// namespace with these labels.
func (s clusterSubject) matchesNamespace(ns labels.Set) bool {
	return s.all || s.ns.Matches(ns)
}

// hasClusterPolicy reports whether a ClusterNetworkPolicy applies to the
// pod, in any tier and direction.
func (pod *Pod) hasClusterPolicy(id ClusterPolicyID) bool {
	for _, ids := range [][]ClusterPolicyID{pod.AdminIngress, pod.AdminEgress, pod.BaselineIngress, pod.BaselineEgress} {
		if slices.Contains(ids, id) {
			return true
		}
	}
	return false
}
