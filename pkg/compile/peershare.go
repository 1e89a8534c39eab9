package compile

import (
	"fmt"
	"hash/fnv"
	"slices"
)

// Peer sets shared by content.
//
// Peers are interned by what they say (internSelector's key), so two
// peers whose selectors differ make two sets even when they select the
// same pods: issue 43's policy of 2,300 peers, each "label nope-<i> does
// not exist", made 2,300 sets of every pod. A peer set is therefore also
// shared by what it holds: a peer whose pods are exactly those of a set
// already interned uses that set (the set's Aliases list the peer), so N
// peers selecting the same pods make one set and are charged for one
// (budget.go charges each distinct set an object uses once).
//
// Only sets of at least ShareMinMembers pods are shared by content. A
// small set costs little, and small selections coincide often and briefly
// (two peers that both select nothing yet, or one pod): each pod that
// joins or leaves one of them would split or merge them, and the tracker
// leaves that to a build (FallbackSharedSet).
//
// The set keeps the name of the first peer interned with it (in build
// order: NetworkPolicies by key, then ClusterNetworkPolicies), and its
// comment says how many other peers share it; Users lists every rule of
// every peer that uses it.

// ShareMinMembers is the fewest pods a peer set holds to be shared with
// peers that say something else but select the same pods.
const ShareMinMembers = 32

// shareMinMembers is ShareMinMembers, lowered by tests to share in small
// clusters.
var shareMinMembers = ShareMinMembers

// shareKey identifies a selection's content up to a hash: its number of
// pods and the sum of its pods' hashes (podKeyHash). The sum does not
// depend on the order the pods are added in and a pod leaving subtracts
// its hash, so the Tracker keeps it as pods come and go.
type shareKey struct {
	n int
	h uint64
}

// with returns the key with a pod (of hash ph) added, or removed.
func (k shareKey) with(ph uint64, in bool) shareKey {
	if in {
		return shareKey{k.n + 1, k.h + ph}
	}
	return shareKey{k.n - 1, k.h - ph}
}

// podKeyHash hashes a pod's "namespace/name" (the same in every build,
// unlike its PodID), mixed so that sums of hashes of similar keys spread.
func podKeyHash(key string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(key))
	x := f.Sum64()
	// splitmix64's finalizer
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// aliasEntry records a peer interned as an alias of a set, so that a
// rejected object's aliases can be dropped again (dropSelectorsFrom).
type aliasEntry struct {
	id  SelectorID
	key string
}

// selMark is how far the builder's selectors and aliases were interned
// (markSelectors), to drop what came after.
type selMark struct{ sels, aliases int }

// markSelectors returns the builder's current mark.
func (b *builder) markSelectors() selMark {
	return selMark{sels: len(b.prog.Selectors), aliases: len(b.aliasLog)}
}

// contentOf returns the share key of a build's selection.
func (b *builder) contentOf(members []PodID) shareKey {
	// Hashed even when too small to share: the Tracker follows it as
	// pods join.
	k := shareKey{n: len(members)}
	if len(b.podHash) < len(b.prog.Pods) {
		b.podHash = make([]uint64, len(b.prog.Pods))
	}
	for _, pid := range members {
		ph := b.podHash[pid]
		if ph == 0 {
			ph = podKeyHash(b.prog.Pods[pid].Key)
			b.podHash[pid] = ph
		}
		k.h += ph
	}
	return k
}

// sharedWith returns the interned set holding exactly members, if any.
func (b *builder) sharedWith(k shareKey, members []PodID) (SelectorID, bool) {
	if k.n < shareMinMembers {
		return 0, false
	}
	for _, id := range b.shares[k] {
		if slices.Equal(b.prog.Selectors[id].Members, members) {
			return id, true
		}
	}
	return 0, false
}

// noteContent records a new set's content, by ID.
func (b *builder) noteContent(id SelectorID, k shareKey) {
	b.selContent = append(b.selContent, k)
	if k.n < shareMinMembers {
		return
	}
	if b.shares == nil {
		b.shares = map[shareKey][]SelectorID{}
	}
	b.shares[k] = append(b.shares[k], id)
}

// alias makes a peer (key, m) use the set id.
func (b *builder) alias(id SelectorID, key string, m selMatcher) {
	b.sels[key] = id
	if b.aliasMatch == nil {
		b.aliasMatch = map[SelectorID][]selMatcher{}
	}
	b.aliasMatch[id] = append(b.aliasMatch[id], m)
	s := &b.prog.Selectors[id]
	s.Aliases = append(s.Aliases, key)
	b.aliasLog = append(b.aliasLog, aliasEntry{id, key})
}

// dropAliasesFrom undoes the aliases recorded from index mark on.
func (b *builder) dropAliasesFrom(mark int) {
	for i := len(b.aliasLog) - 1; i >= mark; i-- {
		e := b.aliasLog[i]
		delete(b.sels, e.key)
		ms := b.aliasMatch[e.id]
		if len(ms) == 1 {
			delete(b.aliasMatch, e.id)
		} else {
			b.aliasMatch[e.id] = ms[:len(ms)-1]
		}
		s := &b.prog.Selectors[e.id]
		s.Aliases = s.Aliases[:len(s.Aliases)-1]
		if len(s.Aliases) == 0 {
			s.Aliases = nil
		}
	}
	b.aliasLog = b.aliasLog[:mark]
}

// dropContent forgets the content of a set being dropped (the last
// interned of its key's list).
func (b *builder) dropContent(id SelectorID) {
	k := b.selContent[id]
	b.selContent = b.selContent[:id]
	if ids := b.shares[k]; len(ids) > 0 && ids[len(ids)-1] == id {
		if len(ids) == 1 {
			delete(b.shares, k)
		} else {
			b.shares[k] = ids[:len(ids)-1]
		}
	}
}

// Shared reports whether peers that say different things use the set.
func (s *Selector) Shared() bool { return len(s.Aliases) > 0 }

// setComment is the comment of the set's kernel sets: what its first
// peer selects and, for a shared set, first (the comment may be cut), how
// many others select the same.
func (s *Selector) setComment() string {
	if !s.Shared() {
		return s.Description
	}
	return fmt.Sprintf("shared with %d other peers selecting the same pods: %s", len(s.Aliases), s.Description)
}
