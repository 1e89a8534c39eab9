package sets

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// A full sync is one nft transaction so that packets never meet a
// half-written table. Most of its time is nft parsing set elements, which
// the netlink writer sends without parsing; but a netlink batch and an nft transaction
// are two kernel transactions, and between them the rules would see sets
// not yet filled. When the table has no base chain, though, nothing in it
// sees a packet: a node's first agent (after a boot, or on a new node), or
// the agent after a failure of this very path. Then the sync goes in three
// steps, of which only the last one reaches packets:
//
//  1. nft: the table emptied of what it had, the regular chains (empty)
//     and every set and map declared without elements;
//  2. netlink: every element, in batches of at most fillChunk (verdict
//     maps jump to the chains of step 1);
//  3. nft: the base chains and every rule, in one transaction: the table
//     starts seeing packets with every set filled.
//
// Elements the writer cannot encode (sets with timeouts, typeof
// declarations) go in step 1 through nft; if the batch of step 2 fails
// (too big for the socket, refused), its elements go through nft in
// step 3. Either way no rule sees a set before it is whole.

// fillChunk bounds the elements of one batch of step 2. The kernel grows
// a set's hash table in a worker that runs on the CPU of the writer once
// its batch is done: within one batch of a hundred thousand elements the
// table is outgrown again and again, and each insertion walks ever longer
// chains (a third of the whole fill at 150,000 pods). Between batches of
// fillChunk the worker catches up. (Whatever the batches, step 3 is one
// transaction, and no rule sees a set before it.)
var fillChunk = 16384

// fill writes the elements of diffs in batches of at most fillChunk and
// returns how many it added. On an error the caller writes them all with
// nft (adding an element twice is no error).
func (s *Syncer) fill(ctx context.Context, diffs []setDiff) (int, error) {
	total := 0
	for len(diffs) > 0 {
		var chunk []setDiff
		chunk, diffs = takeElements(diffs, fillChunk)
		batch, added, _, err := encodeDiffs(s.cfg.Netlink, chunk)
		if err == nil {
			err = s.cfg.Netlink.Write(ctx, batch)
		}
		if err != nil {
			return total, err
		}
		total += added
	}
	return total, nil
}

// takeElements splits diffs (additions only) after n elements.
func takeElements(diffs []setDiff, n int) (head, rest []setDiff) {
	for i, d := range diffs {
		if len(d.add) >= n {
			if len(d.add) > n {
				first, second := d, d
				first.add, second.add = d.add[:n], d.add[n:]
				return append(head, first), append([]setDiff{second}, diffs[i+1:]...)
			}
			return append(head, d), diffs[i+1:]
		}
		head = append(head, d)
		n -= len(d.add)
	}
	return head, nil
}

// unhooked reports whether a full sync may fill the sets before hooking
// the table: existing (the netlink listing) has no base chain.
func (s *Syncer) unhooked(existing map[string][]string) bool {
	return s.cfg.Netlink != nil && len(existing[nftnl.BaseChains]) == 0
}

// fullUnhooked is the full sync of a table without base chains (above).
func (s *Syncer) fullUnhooked(ctx context.Context, desired *compile.Ruleset, existing map[string][]string) (Result, error) {
	res := Result{Full: true}
	tx := s.cfg.NFT.NewTransaction()
	s.clearTable(tx, desired, existing, &res, false)
	var diffs []setDiff
	for _, n := range desired.SortedSetNames() {
		set := desired.Sets[n]
		if s.keptDynamic(desired, n) && slices.Contains(existing["set"], n) {
			continue
		}
		res.ElementsAdded += len(set.Elements)
		if _, err := nftnl.LayoutOf(set); err != nil || len(set.Elements) == 0 {
			if err != nil && !errors.Is(err, nftnl.ErrUnsupported) {
				return res, fmt.Errorf("set %s: %w", n, err)
			}
			s.addSet(tx, set)
			continue
		}
		decl := *set
		decl.Elements = nil
		decl.AddTo(tx)
		all := make([]int, len(set.Elements))
		for i := range all {
			all[i] = i
		}
		diffs = append(diffs, setDiff{name: n, set: set, add: all})
	}
	res.Operations = tx.NumOperations()
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("full sync, unhooked table: declarations (%d operations): %w", res.Operations, err)
	}

	tx = s.cfg.NFT.NewTransaction()
	if len(diffs) > 0 {
		added, err := s.fill(ctx, diffs)
		if err == nil {
			res.NetlinkFill = true
			res.Operations += added
		} else {
			s.cfg.Logger.V(2).Info("Full sync: the elements go through nft", "reason", err)
			for _, d := range diffs {
				// The declaration again (unchanged: a no-op) and the elements.
				s.addSet(tx, d.set)
			}
		}
	}
	for _, n := range desired.ChainOrder {
		if ch := desired.Chains[n].Chain; ch.Hook != nil {
			tx.Add(&ch)
		}
	}
	addAllRules(tx, desired, &res)
	ops := tx.NumOperations()
	res.Operations += ops
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("full sync, unhooked table: chains and rules (%d operations): %w", ops, err)
	}
	return res, nil
}

// addSet adds a set or map with its elements, as the full sync writes them.
func (s *Syncer) addSet(tx *knftables.Transaction, set *compile.Set) {
	if s.cfg.OneCommandPerSet {
		addSetOneCommand(tx, set)
	} else {
		set.AddTo(tx)
	}
}
