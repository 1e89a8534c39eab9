package compile

import (
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
// The change is not tracked, and nothing was changed (a Fallback other
// than NoFallback tells why), in queue mode (a policy change is a full
// build there, as for NetworkPolicy; pod changes are tracked), for a policy with domainNames peers before
// or after the change (the DNS capture, its subjects and the learned
// addresses are shared state the build alone decides), or for a name that
// does not name the object. With the deny log on, the deny chains of the
// policy's Deny rules come and go with its rule chains (removeDenyChains).
// The caller rebuilds. A nodes peer resolves on
// the nodes of the last build (node changes rebuild) and shares its node
// set with the other rules that name the same nodes. A staged policy
// (Staged) is applied as deleted, unless the last Rebuild's input
// enforced staged policies.
func (t *Tracker) ApplyClusterPolicy(name string, cnp *npav1beta1.ClusterNetworkPolicy) Fallback {
	if f := t.stagedPolicyChange(name, cnp != nil && t.b != nil && !t.b.enforcedClusterPolicy(cnp)); f != NoFallback {
		return f
	}
	if cnp != nil && t.b != nil && cnp.Name == name && !t.b.enforcedClusterPolicy(cnp) {
		cnp = nil
	}
	return t.applyPolicyChange(&cnpChange{name: name, cnp: cnp})
}

// cnpChange is a ClusterNetworkPolicy change (ApplyClusterPolicy).
type cnpChange struct {
	name string
	cnp  *npav1beta1.ClusterNetworkPolicy
	// Set by install: the policy's ID, whether it existed, its chains
	// before, its subject before and after and its compiled new version.
	id            ClusterPolicyID
	existed       bool
	old           []string
	oldSubj, subj clusterSubject
	newCP         ClusterPolicy
}

func (k *cnpChange) check(t *Tracker) Fallback {
	if k.cnp != nil && k.cnp.Name != k.name {
		return FallbackKeyMismatch
	}
	if k.cnp != nil && hasDomainPeers(k.cnp) {
		return FallbackDomainNames
	}
	if t.clusterCostBound(k.cnp) > t.b.budgets.ClusterPolicy {
		return FallbackCost
	}
	if t.cpol.owned {
		if id, ok := t.cpol.ids[k.name]; ok && !clusterRulesTrackable(&t.cur.ClusterPolicies[id]) {
			return FallbackDomainNames
		}
		return t.checkClusterShares(k.name, k.cnp)
	}
	for i := range t.cur.ClusterPolicies {
		if t.cur.ClusterPolicies[i].Name == k.name && !clusterRulesTrackable(&t.cur.ClusterPolicies[i]) {
			return FallbackDomainNames
		}
	}
	return t.checkClusterShares(k.name, k.cnp)
}

func (k *cnpChange) own(t *Tracker) { t.ownCluster() }

func (k *cnpChange) find(t *Tracker) (int, bool) {
	return findID(t.cpol.ids, k.name, len(t.cur.ClusterPolicies))
}
func (k *cnpChange) deleted() bool { return k.cnp == nil }

func (k *cnpChange) install(t *Tracker, i int, existed bool) {
	cur, id := t.cur, ClusterPolicyID(i)
	k.oldSubj = clusterSubject{ns: labels.Nothing()}
	if existed {
		old := &cur.ClusterPolicies[id]
		k.old = []string{ClusterPolicyChainName(old, Ingress), ClusterPolicyChainName(old, Egress)}
		k.oldSubj = t.b.subjects[id]
	}
	// Deleted: no rules, no subjects.
	newCP, subj := ClusterPolicy{Name: k.name}, clusterSubject{ns: labels.Nothing()}
	if k.cnp != nil {
		sb := t.scratchBuilder()
		sb.prog.ClusterPolicies = cur.ClusterPolicies[:id:id]
		newCP, subj = sb.compileCluster(k.cnp, true), sb.subjects[0]
		t.adopt(sb)
		t.cpol.ids[k.name] = id
	} else {
		delete(t.cpol.ids, k.name)
	}
	installAt(&cur.ClusterPolicies, i, newCP)
	installAt(&t.b.subjects, i, subj)
	k.id, k.existed, k.subj, k.newCP = id, existed, subj, newCP
}

// reselect visits the local pods of the namespaces either version's
// subject selects that are subjects before or after.
func (k *cnpChange) reselect(t *Tracker, f func(key string, old, cur *Pod)) {
	for _, ns := range t.namespaces() {
		nsl, ok := t.b.nsLabels[ns]
		if !ok {
			nsl = labels.Set{NamespaceNameLabel: ns}
		}
		if !k.oldSubj.matchesNamespace(nsl) && !k.subj.matchesNamespace(nsl) {
			continue
		}
		t.podsIn(ns, func(key string, v *Pod) {
			if !v.Local {
				return
			}
			is := k.cnp != nil && k.subj.matchesLabels(nsl, v.Labels)
			if !is && !(k.existed && v.hasClusterPolicy(k.id)) {
				return // neither before nor after
			}
			nv := *v
			nv.OwnSubject()
			nv.AdminIngress = withoutCluster(v.AdminIngress, k.id)
			nv.AdminEgress = withoutCluster(v.AdminEgress, k.id)
			nv.BaselineIngress = withoutCluster(v.BaselineIngress, k.id)
			nv.BaselineEgress = withoutCluster(v.BaselineEgress, k.id)
			if is {
				nv.addClusterPolicy(&k.newCP, k.id)
				t.cur.orderClusterPolicies(&nv)
			}
			if samePolicyLists(v, &nv) {
				f(key, v, v)
				return
			}
			f(key, v, &nv)
		})
	}
}

func (k *cnpChange) cluster() bool                           { return true }
func (k *cnpChange) has(c combo) bool                        { return slices.Contains(c.cids, k.id) }
func (k *cnpChange) oldChains() []string                     { return k.old }
func (k *cnpChange) namespace() string                       { return "" }
func (k *cnpChange) ruleChain(r *renderer, d Direction) bool { return r.clusterPolicyChain(k.id, d) }

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
	t.cpol = clusterState{owned: true, ids: map[string]ClusterPolicyID{}}
	for i := range t.cur.ClusterPolicies {
		if _, dup := t.cpol.ids[t.cur.ClusterPolicies[i].Name]; !dup {
			t.cpol.ids[t.cur.ClusterPolicies[i].Name] = ClusterPolicyID(i)
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
