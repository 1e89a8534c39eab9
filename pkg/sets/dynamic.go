package sets

import "github.com/nftpolicy/nftpolicy/pkg/compile"

// Dynamic sets (compile.Set.Dynamic: DNS learning's fqdn sets) hold
// elements that another writer adds with timeouts; the desired ruleset
// lists none. Incremental syncs leave them alone by construction (both
// sides have no elements). A full sync with the netlink writer keeps a
// dynamic set whose kernel declaration is the desired one, without reading
// its elements, after a restart of the agent too (resync.go). Without it, a
// full sync deletes and re-adds every set, which would forget every
// learned address: it keeps a dynamic set whose declaration this Syncer
// last committed unchanged. That record survives ForceFull but not a
// restart: an unknown set is then recreated empty, and pods resolve again
// to reach their names (established connections stay). A table without
// base chains (fullfill.go) uses the record too.

// keptDynamic reports whether a full sync keeps the kernel's set n.
func (s *Syncer) keptDynamic(desired *compile.Ruleset, n string) bool {
	d, ok := desired.Sets[n]
	if !ok || !d.Dynamic {
		return false
	}
	prev, ok := s.dynamic[n]
	return ok && sameDeclaration(prev, d)
}

// recordDynamic remembers the dynamic sets of a committed ruleset.
func (s *Syncer) recordDynamic(desired *compile.Ruleset) {
	s.dynamic = map[string]*compile.Set{}
	for n, set := range desired.Sets {
		if set.Dynamic {
			s.dynamic[n] = set
		}
	}
}

// newExternalChain reports whether desired has an External chain that the
// applied ruleset lacks (or had as a regular chain): its rules need the
// installer, which only full syncs run.
func newExternalChain(old, desired *compile.Ruleset) bool {
	for n, c := range desired.Chains {
		if prev, ok := old.Chains[n]; c.External && (!ok || !prev.External) {
			return true
		}
	}
	return false
}
