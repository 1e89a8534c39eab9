package compile

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ApplyNamespace tracks a change of the Namespace named name (ns nil when
// deleted): its labels are what namespace selectors match (NetworkPolicy
// peers, ClusterNetworkPolicy subjects and peers). It records the new
// labels and places every tracked pod of that namespace again, as
// ApplyPodInfo places a changed pod: the pods whose selections or
// policies change move between sets, tier-skip sets and combination
// chains, and nothing outside the namespace's pods is visited. Like
// ApplyPolicy it replaces the Ruleset with a new one that shares every
// unchanged chain and set with the previous one (a set it changes is
// copied first), for Syncer.Sync to diff; Program lags until the next
// Rebuild (Stale).
//
// The change is not tracked, and nothing was changed, in queue mode, for a
// name that does not name the object, when the namespace's stagedness
// changes (which NetworkPolicies are in force: FallbackNamespaceStaged),
// and when the NetworkPolicies' budgets might be passed or a policy was
// rejected for one (FallbackCost). A pod of the namespace that ApplyPod
// would leave to a rebuild (a contested address, the DNS capture's or the
// staged log's shape, shared peer sets) leaves the tracker reset: its
// Ruleset is nil, and the caller rebuilds.
func (t *Tracker) ApplyNamespace(name string, ns *corev1.Namespace) Fallback {
	if t.r == nil {
		return FallbackNotBuilt
	}
	if ns != nil && ns.Name != name {
		return FallbackKeyMismatch
	}
	if t.cfg.Mode == ModeQueue {
		return FallbackQueueMode
	}
	if t.b.stagedNS != nil && (ns != nil && Staged(ns)) != t.b.stagedNS[name] {
		return FallbackNamespaceStaged
	}
	want := namespaceLabelSet(name, ns)
	have, known := t.b.nsLabels[name]
	if known == (ns != nil) && maps.Equal(have, want) {
		return NoFallback // nothing a selector reads changed
	}
	if f := t.checkNamespaceCost(name, want); f != NoFallback {
		return f
	}
	t.ownNamespaces()
	if ns != nil {
		t.b.nsLabels[name] = want
	} else {
		delete(t.b.nsLabels, name)
	}
	t.cur.NamespaceLabels = t.b.nsLabels
	delete(t.costs.byNS, name)
	t.policyChanged()

	type placed struct {
		key  string
		info *PodInfo
	}
	var pods []placed
	t.podsIn(name, func(key string, v *Pod) { pods = append(pods, placed{key, v.PodInfo}) })
	slices.SortFunc(pods, func(a, b placed) int { return strings.Compare(a.key, b.key) })
	t.newRuleset()
	t.cow = map[string]bool{}
	defer func() { t.cow = nil }()
	for _, p := range pods {
		if _, f := t.ApplyPodInfo(p.key, p.info); f != NoFallback {
			t.Reset()
			return f
		}
	}
	return NoFallback
}

// namespaceLabelSet is a namespace's labels as the build matches them:
// its own with the name label (NamespaceNameLabel); only the name label
// for a deleted one.
func namespaceLabelSet(name string, ns *corev1.Namespace) labels.Set {
	l := labels.Set{}
	if ns != nil {
		for k, v := range ns.Labels {
			l[k] = v
		}
	}
	l[NamespaceNameLabel] = name
	return l
}

// ownNamespaces makes the namespaces' labels the tracker's own: the
// published program holds the build's map.
func (t *Tracker) ownNamespaces() {
	if t.nsOwned {
		return
	}
	t.b.nsLabels = maps.Clone(t.b.nsLabels)
	t.nsOwned = true
}

// checkNamespaceCost bounds what a namespace's new labels add to the
// NetworkPolicies' charges, as checkPodCost does for a pod: each pod of
// the namespace may be matched, and join the set, of every peer whose
// namespace selector matches the new labels. A policy rejected for a
// budget may fit once fewer pods are matched, which the build decides.
func (t *Tracker) checkNamespaceCost(name string, nsl labels.Set) Fallback {
	if len(t.costs.nsRejected) > 0 {
		return FallbackCost
	}
	for i := range t.cur.Policies {
		if t.cur.Policies[i].RejectedFor != "" {
			return FallbackCost
		}
	}
	c := &t.costs
	pods := t.podsAtMost(name)
	b := t.b.budgets
	pol, nsSum := map[string]int{}, map[string]int{}
	for key, scopes := range c.scopes {
		n := 0
		for _, s := range scopes {
			if s != nil && s.Matches(nsl) {
				n++
			}
		}
		if n == 0 {
			continue
		}
		pns, _, _ := strings.Cut(key, "/")
		pol[key] += 2 * n * pods
		nsSum[pns] += 2 * n * pods
		if c.pol[key]+pol[key] > b.Policy || c.ns[pns]+nsSum[pns] > b.Namespace {
			return FallbackCost
		}
	}
	for key, n := range pol {
		c.pol[key] += n
	}
	for ns, n := range nsSum {
		c.ns[ns] += n
	}
	return NoFallback
}

// checkCharges is checkPodCharges, but during a namespace change, whose
// pods checkNamespaceCost charged already (each, per peer its namespace
// now matches, more than checkPodCost would), only the shared sets are
// checked: at ten thousand policies, costing each pod again would take
// longer than the rest of the change.
func (t *Tracker) checkCharges(key string, old, cur *Pod) Fallback {
	if t.cow == nil {
		return t.checkPodCharges(key, old, cur)
	}
	t.costs.pending = t.costs.pending[:0]
	return t.checkPodShares(key, old, cur)
}

// applySet applies element changes to a set of rs: in place, or, during a
// namespace change (cow set), to a copy the first time the change touches
// the set, since the ruleset a Syncer holds shares it.
func (t *Tracker) applySet(rs *Ruleset, n string, d *SetDelta) {
	if t.cow != nil && !t.cow[n] {
		s := *rs.Sets[n]
		s.Elements = slices.Clone(s.Elements)
		rs.Sets[n] = &s
		t.cow[n] = true
	}
	rs.Sets[n].apply(d)
}
