package controller

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Policy changes are applied in passes of the sync loop, and a pass cannot
// be interrupted: a change that arrives while a namespace's expensive edit
// is applied waits for it. One namespace's user, editing a policy whose
// peers select every pod again and again, would otherwise make every other
// namespace's changes wait behind each of its edits (issue 43, item 6).
//
// The sync loop therefore shares its time between namespaces as a fair
// queue does. Each namespace ("" for the cluster-scoped
// ClusterNetworkPolicies) owes the time its changes took to apply (the
// tracker's work and its part of the transaction); a namespace that comes
// back after being idle starts at the loop's clock, the debt of the
// namespace served last, so that idleness is not banked. A pass applies the
// pending namespaces in order of debt, the least first, and defers to the
// next pass (run right after) those whose debt is more than fairQuantum
// ahead of the least: a namespace whose edits cost more than its share
// waits while others have changes pending, and a namespace's new change
// waits at most for the change being applied when it came. Changes of one
// object between two passes were always applied once (the pending keys
// are a set). Alone, a namespace is applied at every pass: the loop never
// idles while changes are pending.

// fairQuantum is how far ahead of the least indebted pending namespace a
// namespace may be and still be applied in the same pass: changes cheaper
// than this are batched into one transaction, costlier ones take turns.
const fairQuantum = 5 * time.Millisecond

// fairShare is the sync loop's ledger of what each namespace's policy
// changes cost it. Only the sync loop uses it.
type fairShare struct {
	// debt is, by namespace, the loop's clock when it was last served plus
	// what its changes cost since; only namespaces ahead of clock are kept.
	debt map[string]time.Duration
	// clock is the debt of the namespace served first in the last pass.
	clock time.Duration
}

func newFairShare() *fairShare { return &fairShare{debt: map[string]time.Duration{}} }

// policyNamespace is the namespace a policy key is fair-shared in: its
// namespace, "" for a ClusterNetworkPolicy.
func policyNamespace(key string) string {
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return ""
	}
	return ns
}

// pick splits the pending policy keys into those to apply in this pass,
// in the order to apply them, and those deferred to the next pass.
func (f *fairShare) pick(keys map[string]struct{}) (now []string, later []string) {
	byNS := map[string][]string{}
	for k := range keys {
		ns := policyNamespace(k)
		byNS[ns] = append(byNS[ns], k)
	}
	type pending struct {
		ns   string
		debt time.Duration
	}
	order := make([]pending, 0, len(byNS))
	for ns := range byNS {
		order = append(order, pending{ns, max(f.debt[ns], f.clock)})
	}
	slices.SortFunc(order, func(a, b pending) int {
		return cmp.Or(cmp.Compare(a.debt, b.debt), strings.Compare(a.ns, b.ns))
	})
	f.clock = order[0].debt
	for ns, d := range f.debt {
		if d <= f.clock {
			delete(f.debt, ns)
		}
	}
	for _, p := range order {
		ks := byNS[p.ns]
		slices.Sort(ks)
		if p.debt > f.clock+fairQuantum {
			later = append(later, ks...)
		} else {
			now = append(now, ks...)
		}
	}
	return now, later
}

// charge adds what a namespace's change cost to its debt.
func (f *fairShare) charge(ns string, cost time.Duration) {
	f.debt[ns] = max(f.debt[ns], f.clock) + cost
}
