package compile

import (
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// The program after pod changes. The tracker keeps the program it last
// published (pub) and the pods changed since (pending); Program derives
// the next one from the two, as Build would make it from the same
// objects, without matching any selector again: the changed pods' views
// (place) say where they stand. The new program is a new value: the
// published one, which the evaluator reads concurrently, is never written,
// and the new one shares with it what the change leaves as it was (the
// pods' objects and records, the policies' rules, the unchanged
// selections).
//
// What it costs is linear in the pods, not in the policies' work: the pod
// list, the selections that hold pods after the changed ones (their IDs
// move) and the evaluator's index are laid out again. A policy change
// since the last Rebuild leaves the program to the next build (Stale), or
// to a program built off the tracker that it adopts (tracker_adopt.go).

// notePending records a pod change for the next derived program: info is
// the pod's new state (nil: deleted).
func (t *Tracker) notePending(key string, info *PodInfo) {
	t.gen++
	if t.stale {
		return // the program waits for a Rebuild anyway
	}
	if t.pending == nil {
		t.pending = map[string]*PodInfo{}
	}
	t.pending[key] = info
}

// derivedPod is a changed pod in the derived program.
type derivedPod struct {
	key  string
	view *Pod // nil: not in the new program
}

// derive makes the program of pub with the pending pod changes applied.
func (t *Tracker) derive() *Program {
	base := t.pub
	keys := slices.Sorted(maps.Keys(t.pending))
	changed := make([]derivedPod, len(keys))
	for i, k := range keys {
		changed[i] = derivedPod{key: k, view: t.derivedView(k)}
	}
	np := *base
	np.Eval = EvalIndex{}
	remap, added := np.mergePods(base, changed)
	np.NamespaceLabels = namespaceLabelsFor(base, added, func(id PodID) string { return np.Pods[id].Namespace })
	np.Selectors = remapSelectors(base, &np, remap, changed, added)
	np.Policies = t.remapPolicies(base, &np, remap, added)
	np.ClusterPolicies = t.remapClusterPolicies(base, &np, remap, added)
	np.deriveTables(base)
	np.buildEvalIndex()
	np.Source.Pods = nil
	np.Source.PodInfos = t.deriveSource(keys)
	return &np
}

// mergePods lays out the new pod list: base's pods in key order with the
// changed ones replaced, added or left out. It returns each base pod's new
// ID (-1: gone) and the IDs of the changed pods' new records.
func (p *Program) mergePods(base *Program, changed []derivedPod) (remap []PodID, added []PodID) {
	pending := make(map[string]bool, len(changed))
	n := 0
	for _, c := range changed {
		pending[c.key] = true
		if c.view != nil {
			n++
		}
	}
	pods := make([]Pod, 0, len(base.Pods)+n)
	remap = make([]PodID, len(base.Pods))
	added = make([]PodID, 0, n)
	j := 0
	addUpTo := func(key string, all bool) {
		for ; j < len(changed) && (all || changed[j].key < key); j++ {
			v := changed[j].view
			if v == nil {
				continue
			}
			added = append(added, PodID(len(pods)))
			pods = append(pods, *v) // a local pod's subject is owned below (deriveTables)
		}
	}
	for i := range base.Pods {
		key := base.Pods[i].Key
		if pending[key] {
			remap[i] = -1
			continue
		}
		addUpTo(key, false)
		remap[i] = PodID(len(pods))
		pods = append(pods, base.Pods[i])
	}
	addUpTo("", true)
	p.Pods = pods
	return remap, added
}

// namespaceLabelsFor is base's namespace labels, with those of a namespace
// that only a new pod names, as Build adds them.
func namespaceLabelsFor(base *Program, added []PodID, p func(PodID) string) map[string]labels.Set {
	out := base.NamespaceLabels
	cloned := false
	for _, id := range added {
		ns := p(id)
		if _, ok := out[ns]; ok {
			continue
		}
		if !cloned {
			out = maps.Clone(out)
			cloned = true
		}
		out[ns] = labels.Set{NamespaceNameLabel: ns}
	}
	return out
}

// remapMembers returns a sorted pod ID list with base's IDs renumbered
// (gone ones left out) and adds merged in; the same slice when nothing
// changes.
func remapMembers(ids []PodID, remap []PodID, adds []PodID, moved bool) []PodID {
	if !moved && len(adds) == 0 {
		return ids
	}
	out := make([]PodID, 0, len(ids)+len(adds))
	j := 0
	for _, id := range ids {
		r := remap[id]
		if r < 0 {
			continue
		}
		for ; j < len(adds) && adds[j] < r; j++ {
			out = append(out, adds[j])
		}
		out = append(out, r)
	}
	out = append(out, adds[j:]...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// moves reports whether a pod ID list holds an ID that the change renumbers
// or removes.
func moves(ids []PodID, remap []PodID) bool {
	for _, id := range ids {
		if remap[id] != id {
			return true
		}
	}
	return false
}

// remapSelectors renumbers the selectors' members and places the changed
// pods in them.
func remapSelectors(base, np *Program, remap []PodID, changed []derivedPod, added []PodID) []Selector {
	adds := map[SelectorID][]PodID{}
	for _, id := range added {
		for _, sid := range np.Pods[id].MemberOf {
			adds[sid] = append(adds[sid], id)
		}
	}
	out := base.Selectors
	cloned := false
	for sid := range base.Selectors {
		m := base.Selectors[sid].Members
		moved := moves(m, remap)
		if !moved && len(adds[SelectorID(sid)]) == 0 {
			continue
		}
		if !cloned {
			out = slices.Clone(base.Selectors)
			cloned = true
		}
		out[sid].Members = remapMembers(m, remap, adds[SelectorID(sid)], moved)
	}
	return out
}

// remapPolicies renumbers the NetworkPolicies' selections and places the
// changed local pods in them.
func (t *Tracker) remapPolicies(base, np *Program, remap []PodID, added []PodID) []Policy {
	adds := map[PolicyID][]PodID{}
	at := t.derivation()
	for _, id := range added {
		pod := &np.Pods[id]
		if !pod.Local {
			continue
		}
		pl := labels.Set(pod.Labels)
		for _, pid := range at.polsByNS[pod.Namespace] {
			if at.b.targets[pid].Matches(pl) {
				adds[pid] = append(adds[pid], id)
			}
		}
	}
	out := base.Policies
	cloned := false
	for i := range base.Policies {
		s := base.Policies[i].Selected
		moved := moves(s, remap)
		if !moved && len(adds[PolicyID(i)]) == 0 {
			continue
		}
		if !cloned {
			out = slices.Clone(base.Policies)
			cloned = true
		}
		out[i].Selected = remapMembers(s, remap, adds[PolicyID(i)], moved)
	}
	return out
}

// remapClusterPolicies renumbers the ClusterNetworkPolicies' subjects and
// places the changed local pods in them.
func (t *Tracker) remapClusterPolicies(base, np *Program, remap []PodID, added []PodID) []ClusterPolicy {
	adds := map[ClusterPolicyID][]PodID{}
	at := t.derivation()
	for _, id := range added {
		pod := &np.Pods[id]
		if !pod.Local {
			continue
		}
		nsl, ok := at.b.nsLabels[pod.Namespace]
		if !ok {
			nsl = labels.Set{NamespaceNameLabel: pod.Namespace}
		}
		for i := range base.ClusterPolicies {
			if at.b.subjects[i].matchesLabels(nsl, pod.Labels) {
				adds[ClusterPolicyID(i)] = append(adds[ClusterPolicyID(i)], id)
			}
		}
	}
	out := base.ClusterPolicies
	cloned := false
	for i := range base.ClusterPolicies {
		s := base.ClusterPolicies[i].Subjects
		moved := moves(s, remap)
		if !moved && len(adds[ClusterPolicyID(i)]) == 0 {
			continue
		}
		if !cloned {
			out = slices.Clone(base.ClusterPolicies)
			cloned = true
		}
		out[i].Subjects = remapMembers(s, remap, adds[ClusterPolicyID(i)], moved)
	}
	return out
}

// deriveTables numbers the decision tables of the local pods' combinations
// in pod order, as Build does, reusing base's tables, and gives each local
// pod its own subject record with its tables and denial reasons.
func (p *Program) deriveTables(base *Program) {
	old := map[string]int32{}
	for i := range base.Pods {
		pod := &base.Pods[i]
		if !pod.Local {
			continue
		}
		if pod.IngressTable >= 0 {
			old[tableKey(pod.IngressPolicies, Ingress)] = pod.IngressTable
		}
		if pod.EgressTable >= 0 {
			old[tableKey(pod.EgressPolicies, Egress)] = pod.EgressTable
		}
	}
	p.Tables = nil
	seen := map[string]int32{}
	table := func(ids []PolicyID, d Direction) int32 {
		if len(ids) == 0 {
			return -1
		}
		key := tableKey(ids, d)
		if idx, ok := seen[key]; ok {
			return idx
		}
		idx := int32(len(p.Tables))
		if o, ok := old[key]; ok {
			p.Tables = append(p.Tables, base.Tables[o])
		} else {
			p.Tables = append(p.Tables, buildTable(p, ids, d))
		}
		seen[key] = idx
		return idx
	}
	for i := range p.Pods {
		pod := &p.Pods[i]
		if !pod.Local {
			continue
		}
		// The evaluator's index writes the reasons back: every local
		// pod's record is the new program's own.
		pod.OwnSubject()
		pod.IngressDenied = deniedReason(p, pod, pod.IngressPolicies, Ingress)
		pod.EgressDenied = deniedReason(p, pod, pod.EgressPolicies, Egress)
		pod.IngressTable = table(pod.IngressPolicies, Ingress)
		pod.EgressTable = table(pod.EgressPolicies, Egress)
	}
}

// deriveSource lists the pods of the new program's input, sorted by key
// (as the last one's, sortedInfos): the last one's with the changed pods'
// new states.
func (t *Tracker) deriveSource(keys []string) []*PodInfo {
	out := make([]*PodInfo, 0, len(t.srcInfos)+len(keys))
	j := 0
	addUpTo := func(key string, all bool) {
		for ; j < len(keys) && (all || keys[j] < key); j++ {
			if pi := t.pending[keys[j]]; pi != nil {
				out = append(out, pi)
			}
		}
	}
	for _, pi := range t.srcInfos {
		addUpTo(pi.Key, false)
		if j < len(keys) && keys[j] == pi.Key {
			continue // changed: its new state comes with the next key
		}
		out = append(out, pi)
	}
	addUpTo("", true)
	return out
}

// sortedInfos is the pods of an input sorted by key (a copy when they
// were not), which deriveSource merges the changed pods into.
func sortedInfos(pods []*PodInfo) []*PodInfo {
	less := func(a, b *PodInfo) int { return strings.Compare(a.Key, b.Key) }
	if slices.IsSortedFunc(pods, less) {
		return pods
	}
	out := slices.Clone(pods)
	slices.SortStableFunc(out, less)
	return out
}
