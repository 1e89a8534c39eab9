package sets

import (
	"context"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// A full sync over a table that is hooked (an agent restarted on its node,
// a periodic repair, a fallback after a refused batch) mostly finds what it
// would write: deleting every set and map and writing them again whole has
// nft parse every element for nothing. With the netlink writer, the sync
// reads the kernel's sets instead, as the dataplane has them, and compares
// them with the desired ones:
//
//   - a set or map whose kernel declaration is the one nft writes for the
//     desired declaration (sameKernelDeclaration) is kept; anything else of
//     the table is deleted and written again, as before;
//   - a kept set's elements are dumped over netlink and compared with the
//     desired elements in kernel form (key, data or verdict, comment and
//     flags: the bytes nft writes, pkg/nftnl), so a value, a verdict or a
//     comment changed by hand is seen;
//   - what differs goes into the one nft transaction that also flushes and
//     refills the chains: element deletions and additions, or, when they
//     would be as many as the elements, and for interval sets (whose
//     ranges the kernel splits into start and end elements, hard to map
//     back to the text the transaction needs), a flush of the set and all
//     its elements;
//   - dynamic sets (DNS learning's) whose declaration is the desired one
//     are kept without reading them: their elements are the learner's.
//
// The transaction is still the only kernel change of the sync: the dumps
// only read, and a set the kernel changed between the dump and the commit
// at worst makes the transaction fail (an element to delete is gone, one
// to add is there with another value), after which the sync rewrites the
// table whole (full), as it did before.

// resyncSet is the plan for one desired set a re-sync keeps.
type resyncSet struct {
	set *compile.Set
	// rewrite: flush the set and add all its elements.
	rewrite  bool
	del, add []compile.Element
}

// fullDiff is the full sync of a hooked table with the netlink writer.
// handled is false when the kernel's sets could not be read (the caller
// then rewrites them whole); an error of the transaction is returned with
// handled true.
func (s *Syncer) fullDiff(ctx context.Context, desired *compile.Ruleset, existing map[string][]string, decls map[string]*nftnl.SetDecl, pre *kernelRead) (res Result, handled bool, err error) {
	res = Result{Full: true}
	readStart := time.Now()
	keep, prefetched, err := s.planKept(ctx, desired, decls, pre)
	if err != nil {
		return res, false, err
	}
	res.ReadDuration, res.SetsPrefetched = time.Since(readStart), prefetched

	tx := s.cfg.NFT.NewTransaction()
	s.clearUnkept(tx, desired, existing, keep, &res)
	s.refill(tx, desired, keep, &res)
	addAllRules(tx, desired, &res)
	res.Operations = tx.NumOperations()
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, true, fmt.Errorf("full sync transaction (%d operations): %w", res.Operations, err)
	}
	return res, true, nil
}

// planKept returns the plans of the desired sets the re-sync keeps, by
// name: those whose kernel declaration is the desired one, their elements
// compared with the kernel's (dynamic sets are kept unread).
func (s *Syncer) planKept(ctx context.Context, desired *compile.Ruleset, decls map[string]*nftnl.SetDecl, pre *kernelRead) (keep map[string]*resyncSet, prefetched int, err error) {
	keep = map[string]*resyncSet{}
	var compare []candidate
	for _, n := range desired.SortedSetNames() {
		set := desired.Sets[n]
		k, ok := decls[n]
		if !ok || !k.Matches(set) {
			continue
		}
		if set.Dynamic {
			keep[n] = &resyncSet{set: set}
			continue
		}
		l, err := nftnl.LayoutOf(set)
		if err != nil {
			// A set the element reader cannot compare (a type it does not
			// know): written whole.
			continue
		}
		compare = append(compare, candidate{n, set, k, l})
	}
	if prefetched, err = s.compareSets(ctx, compare, keep, pre); err != nil {
		return nil, 0, err
	}
	return keep, prefetched, nil
}

// clearUnkept adds to tx the table and the desired chains, and what empties
// the table but the kept sets: every chain flushed, the kept sets' planned
// deletions (a flush, or elements), every other set and map deleted, chains
// no longer wanted deleted.
func (s *Syncer) clearUnkept(tx *knftables.Transaction, desired *compile.Ruleset, existing map[string][]string, keep map[string]*resyncSet, res *Result) {
	tx.Add(&knftables.Table{Comment: desired.Table.Comment})
	for _, n := range desired.ChainOrder {
		ch := desired.Chains[n].Chain
		tx.Add(&ch)
	}
	// Empty every chain first, so that no rule stops a deletion.
	for _, n := range existing["chain"] {
		if c, ok := desired.Chains[n]; ok && c.External {
			continue
		}
		tx.Flush(&knftables.Chain{Name: n})
	}
	// Element deletions before chain deletions: a verdict map's element
	// may jump to a chain no longer wanted.
	for _, n := range desired.SortedSetNames() {
		p := keep[n]
		switch {
		case p == nil:
		case p.rewrite:
			if p.set.Map != nil {
				tx.Flush(&knftables.Map{Name: n})
			} else {
				tx.Flush(&knftables.Set{Name: n})
			}
		case len(p.del) > 0:
			s.deleteElements(tx, p.set, p.del)
			res.ElementsDeleted += len(p.del)
		}
	}
	// Sets and maps not kept: deleted (maps before chains: their verdict
	// elements jump to chains), added again by refill.
	for _, n := range existing["map"] {
		if keep[n] == nil {
			tx.Delete(&knftables.Map{Name: n})
		}
	}
	for _, n := range existing["set"] {
		if keep[n] == nil {
			tx.Delete(&knftables.Set{Name: n})
		}
	}
	for _, n := range existing["chain"] {
		if _, ok := desired.Chains[n]; !ok {
			tx.Delete(&knftables.Chain{Name: n})
			res.ChainsDeleted++
		}
	}
}

// refill adds to tx the sets not kept, with their elements, and the kept
// sets' planned additions.
func (s *Syncer) refill(tx *knftables.Transaction, desired *compile.Ruleset, keep map[string]*resyncSet, res *Result) {
	for _, n := range desired.SortedSetNames() {
		set := desired.Sets[n]
		p := keep[n]
		switch {
		case p == nil, p.rewrite:
			s.addSet(tx, set)
			res.ElementsAdded += len(set.Elements)
		case len(p.add) > 0:
			part := *set
			part.Elements = p.add
			// The declaration again (the kernel's: a no-op) and the
			// elements.
			s.addSet(tx, &part)
			res.ElementsAdded += len(p.add)
		}
		if p != nil && !p.rewrite && !set.Dynamic {
			res.ElementsUnchanged += len(set.Elements) - len(p.add)
		}
	}
}

// candidate is a desired set whose kernel declaration is the desired one:
// its elements are compared.
type candidate struct {
	name   string
	set    *compile.Set
	decl   *nftnl.SetDecl
	layout nftnl.Layout
}

// compareSets reads the kernel's elements of the candidates (but those
// pre read before the build, prefetch.go) and stores their plans in keep.
// The kernel's dumps (its CPU, in the reading goroutine's system calls)
// and the encoding of the desired elements overlap: one goroutine reads
// set after set while this one compares.
func (s *Syncer) compareSets(ctx context.Context, compare []candidate, keep map[string]*resyncSet, pre *kernelRead) (prefetched int, err error) {
	readCtx, cancel := context.WithCancel(ctx)
	read := make(chan kernelElements, 8)
	go func() {
		defer close(read)
		for _, c := range compare {
			k, ok := pre.elements(c.name, c.decl)
			if ok {
				k.prefetched = true
			} else {
				k = s.readKernelSet(readCtx, c.name)
			}
			select {
			case read <- k:
			case <-readCtx.Done():
				return
			}
			if k.err != nil {
				return
			}
		}
	}()
	defer func() {
		// Stop the reader and wait for it: the writer's connection is
		// free again when this returns.
		cancel()
		for range read {
		}
	}()
	for _, c := range compare {
		k, ok := <-read
		if !ok {
			return 0, fmt.Errorf("reading the kernel's sets: %w", context.Cause(readCtx))
		}
		if k.err != nil {
			return 0, k.err
		}
		plan, err := planSet(c.name, c.set, &c.layout, k)
		if err != nil {
			return 0, err
		}
		keep[c.name] = plan
		if k.prefetched {
			prefetched++
		}
	}
	return prefetched, nil
}

// kernelElements are the elements of one of the kernel's sets, by
// identity (appendIdentity).
type kernelElements struct {
	// byID indexes els: one allocation per element less than pointers.
	byID map[string]int32
	els  []kernelElementState
	// odd: the set has an element the desired ones never have.
	odd bool
	// prefetched: read before the build (prefetch.go).
	prefetched bool
	err        error
}

type kernelElementState struct {
	// id is the element's identity, which starts with its key.
	id      string
	payload string
	keyLen  int
	seen    bool
}

// emptyPayload is the payload of an element with neither data nor
// userdata (most set elements): shared, not allocated per element.
var emptyPayload = string(new(nftnl.KernelElement).AppendPayload(nil))

// readKernelSet dumps the kernel's elements of a set.
func (s *Syncer) readKernelSet(ctx context.Context, name string) kernelElements {
	k := kernelElements{byID: map[string]int32{}}
	var pl []byte
	k.err = s.cfg.Netlink.SetElements(ctx, name, func(e *nftnl.KernelElement) {
		if e.Foreign() {
			k.odd = true
			return
		}
		id := string(e.AppendIdentity(nil))
		pl = e.AppendPayload(pl[:0])
		payload := emptyPayload
		if string(pl) != emptyPayload {
			payload = string(pl)
		}
		k.byID[id] = int32(len(k.els))
		k.els = append(k.els, kernelElementState{id: id, payload: payload, keyLen: len(e.Key())})
	})
	return k
}

// planSet compares the kernel's elements of a kept set with the desired
// ones and plans what makes them equal.
func planSet(name string, set *compile.Set, l *nftnl.Layout, k kernelElements) (*resyncSet, error) {
	kernel, odd := k.byID, k.odd
	plan := &resyncSet{set: set}
	if len(k.els) == 0 && !odd {
		// Nothing to compare with (a set that grew from nothing): every
		// element is added, none encoded here.
		plan.add = set.Elements
		return plan, nil
	}
	if odd {
		// A catch-all element, an element with a timeout or an
		// expression: nothing the desired set has. A flush removes them.
		plan.rewrite = true
		return plan, nil
	}
	var add []int
	var changed []int
	var id, pl []byte
	var els [2]nftnl.Element
	for i := range set.Elements {
		n, err := l.Encode(&set.Elements[i], &els)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		for j := range n {
			e := &els[j]
			// Reused buffers: a lookup by string(buf) does not allocate.
			id = e.AppendIdentity(id[:0])
			pl = e.AppendPayload(pl[:0])
			var h *kernelElementState
			if j, ok := kernel[string(id)]; ok {
				h = &k.els[j]
			}
			switch {
			case h == nil:
				add = append(add, i)
			case h.payload != string(pl):
				h.seen = true
				changed = append(changed, i)
			default:
				h.seen = true
				continue
			}
			if l.Interval() {
				// Any difference rewrites an interval set.
				plan.rewrite = true
				return plan, nil
			}
		}
	}
	var extra [][]byte
	for i := range k.els {
		if e := &k.els[i]; !e.seen {
			extra = append(extra, []byte(e.id[:e.keyLen]))
		}
	}
	if l.Interval() && len(extra) > 0 {
		plan.rewrite = true
		return plan, nil
	}
	if n := len(add) + 2*len(changed) + len(extra); n == 0 {
		return plan, nil
	} else if n >= len(set.Elements) {
		plan.rewrite = true
		return plan, nil
	}
	for _, i := range changed {
		// Deleted by its key (the same in both) and added again with
		// its value and comment.
		e := set.Elements[i]
		e.Verdict, e.Chain, e.Comment = compile.VerdictNone, "", nil
		plan.del = append(plan.del, e)
		add = append(add, i)
	}
	for _, key := range extra {
		k, err := l.DecodeKey(key)
		if err != nil {
			// The key is not one this reader can write back: a flush
			// removes it.
			plan.rewrite, plan.del = true, nil
			return plan, nil
		}
		plan.del = append(plan.del, k)
	}
	for _, i := range add {
		plan.add = append(plan.add, set.Elements[i])
	}
	return plan, nil
}

// deleteElements deletes elements of a set by key, as one command when the
// Syncer writes one command per set.
func (s *Syncer) deleteElements(tx *knftables.Transaction, set *compile.Set, del []compile.Element) {
	if !s.cfg.OneCommandPerSet {
		for i := range del {
			tx.Delete(set.Knft(&del[i]))
		}
		return
	}
	keys := make([]string, 0, len(del))
	for i := range del {
		keys = append(keys, string(del[i].AppendKey(nil)))
	}
	e := knftables.Element{Key: []string{joinList(keys)}}
	set.AddressTo(&e)
	tx.Delete(&e)
}

func joinList(items []string) string { return strings.Join(items, ", ") }

// resync runs fullDiff; ok is false when the caller must rewrite the
// table whole: the kernel's sets could not be read, or the transaction
// failed (the kernel changed since the dump, or holds something the
// comparison missed), which changed nothing.
func (s *Syncer) resync(ctx context.Context, desired *compile.Ruleset, existing map[string][]string, decls map[string]*nftnl.SetDecl, pre *kernelRead) (Result, bool) {
	res, handled, err := s.fullDiff(ctx, desired, existing, decls, pre)
	switch {
	case !handled:
		s.cfg.Logger.Error(err, "Full sync: could not read the kernel's sets, rewriting them all")
		return res, false
	case err != nil:
		s.cfg.Logger.Error(err, "Full sync: the transaction of the differences failed, rewriting the table whole", "operations", res.Operations)
		return res, false
	}
	return res, true
}
