package sets

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// The incremental syncs Config.Netlink writes: element changes alone
// (netlinkSync) and changes of chains, rules and set declarations
// (netlinkObjects), each as one nfnetlink batch that pkg/nftnl encodes.

// elementOnlyDiff returns, for each set whose elements differ, the indices
// of the elements to delete (in old's set) and add (in desired's), when
// that is all that separates the two rulesets: same table, chains, rules
// and set declarations. ok is false otherwise.
func elementOnlyDiff(old, desired *compile.Ruleset) (diffs []setDiff, ok bool) {
	if !equalStrPtr(old.Table.Comment, desired.Table.Comment) ||
		len(old.Chains) != len(desired.Chains) || len(old.Sets) != len(desired.Sets) {
		return nil, false
	}
	for n, c := range desired.Chains {
		prev, ok := old.Chains[n]
		if !ok || prev != c && (prev.External != c.External || !equalRules(prev.Rules, c.Rules)) {
			return nil, false
		}
	}
	for n, set := range desired.Sets {
		prev, ok := old.Sets[n]
		if !ok || prev != set && !sameDeclaration(prev, set) {
			return nil, false
		}
		if prev == set || equalElements(prev.Elements, set.Elements) {
			continue
		}
		add, del := diffElements(prev, set)
		diffs = append(diffs, setDiff{name: n, prev: prev, set: set, add: add, del: del})
	}
	// In name order (the batch's), sorting only the sets that changed: a
	// ruleset has thousands.
	slices.SortFunc(diffs, func(a, b setDiff) int { return strings.Compare(a.name, b.name) })
	return diffs, true
}

type setDiff struct {
	name      string
	prev, set *compile.Set
	add, del  []int
}

func sameDeclaration(a, b *compile.Set) bool {
	switch {
	case a.Set != nil && b.Set != nil:
		x, y := a.Set, b.Set
		return x.Type == y.Type && x.TypeOf == y.TypeOf && slices.Equal(x.Flags, y.Flags) &&
			equalPtr(x.Timeout, y.Timeout) && equalPtr(x.GCInterval, y.GCInterval) && equalPtr(x.Size, y.Size) &&
			equalPtr(x.Policy, y.Policy) && equalPtr(x.AutoMerge, y.AutoMerge) && equalPtr(x.Comment, y.Comment)
	case a.Map != nil && b.Map != nil:
		x, y := a.Map, b.Map
		return x.Type == y.Type && x.TypeOf == y.TypeOf && slices.Equal(x.Flags, y.Flags) &&
			equalPtr(x.Timeout, y.Timeout) && equalPtr(x.GCInterval, y.GCInterval) && equalPtr(x.Size, y.Size) &&
			equalPtr(x.Policy, y.Policy) && equalPtr(x.Comment, y.Comment)
	}
	return false
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// encodeDiffs encodes element changes into one batch of w: every set's
// deletions, then every set's additions (so that an element whose data
// changed is replaced within the batch). An error means the netlink path
// cannot express them (nftnl.ErrUnsupported) or an element is malformed.
func encodeDiffs(w *nftnl.Conn, diffs []setDiff) (b *nftnl.Batch, added, deleted int, err error) {
	layouts := make([]nftnl.Layout, len(diffs))
	for i, d := range diffs {
		if layouts[i], err = nftnl.LayoutOf(d.set); err != nil {
			return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
		}
		added += len(d.add)
		deleted += len(d.del)
	}
	b = w.NewBatch(added + deleted)
	for i, d := range diffs {
		for _, j := range d.del {
			if err := b.DeleteElement(d.name, &layouts[i], &d.prev.Elements[j]); err != nil {
				return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
			}
		}
	}
	for i, d := range diffs {
		for _, j := range d.add {
			if err := b.AddElement(d.name, &layouts[i], &d.set.Elements[j]); err != nil {
				return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
			}
		}
	}
	return b, added, deleted, nil
}

// netlinkSync handles a sync that only changes elements: one netlink batch.
// handled is false when the change is more than elements, or when the
// batch cannot be written over netlink (a type it does not know, a batch
// bigger than the socket): the caller writes it with nft. A batch the
// kernel refuses changed nothing; it is counted and followed at once by a
// full sync.
func (s *Syncer) netlinkSync(ctx context.Context, desired *compile.Ruleset) (res Result, handled bool, err error) {
	diffs, ok := elementOnlyDiff(s.applied, desired)
	if !ok {
		return res, false, nil
	}
	if len(diffs) == 0 {
		return res, true, nil
	}
	batch, added, deleted, err := encodeDiffs(s.cfg.Netlink, diffs)
	if err != nil {
		s.cfg.Logger.V(2).Info("Element changes go through nft", "reason", err)
		return res, false, nil
	}
	return s.netlinkWrite(ctx, desired, batch,
		Result{Netlink: true, Operations: added + deleted, ElementsAdded: added, ElementsDeleted: deleted})
}

// netlinkWrite sends a sync's batch, whose changes res counts. handled is
// false when the batch is too big for the socket (the caller writes the
// sync with nft). A batch the kernel refuses changed nothing; it is counted
// and followed at once by a full sync.
func (s *Syncer) netlinkWrite(ctx context.Context, desired *compile.Ruleset, batch *nftnl.Batch, res Result) (_ Result, handled bool, _ error) {
	err := s.cfg.Netlink.Write(ctx, batch)
	if errors.Is(err, nftnl.ErrBatchTooBig) {
		s.cfg.Logger.V(2).Info("Changes go through nft", "reason", err)
		return Result{}, false, nil
	}
	if err != nil {
		n := s.netlinkFallbacks.Add(1)
		s.cfg.Logger.Error(err, "Netlink batch failed, the kernel is unchanged; falling back to a full sync",
			"operations", res.Operations, "elementsAdded", res.ElementsAdded, "elementsDeleted", res.ElementsDeleted,
			"chainsWritten", res.ChainsWritten, "chainsDeleted", res.ChainsDeleted, "fallbacks", n)
		full, err := s.full(ctx, desired)
		full.NetlinkFallback = true
		return full, true, err
	}
	return res, true, nil
}

// netlinkObjects writes a sync that changes chains, rules or set
// declarations (a policy edit, a rebuild) as one netlink batch
// (pkg/nftnl encodes them). handled is false when a change is outside what the batch
// can express: the caller writes the whole sync with nft.
func (s *Syncer) netlinkObjects(ctx context.Context, desired *compile.Ruleset, shared compile.Delta) (res Result, handled bool, err error) {
	w := &nlWriter{b: s.cfg.Netlink.NewBatch(64), desired: desired}
	if err := writeDiff(s.applied, desired, shared, w, &res); err != nil {
		s.cfg.Logger.V(2).Info("Changes go through nft", "reason", err)
		return Result{}, false, nil
	}
	res.Netlink, res.Operations = true, w.ops
	if w.ops == 0 {
		return res, true, nil
	}
	return s.netlinkWrite(ctx, desired, w.b, res)
}

// nlWriter writes a diff into a netlink batch; ops counts its operations
// (elements, chains, rules, sets, as an nft transaction counts them).
type nlWriter struct {
	b       *nftnl.Batch
	desired *compile.Ruleset
	ops     int
	layouts map[string]*nftnl.Layout
}

func (w *nlWriter) addChain(c *knftables.Chain) error {
	w.ops++
	return w.b.AddChain(c)
}

func (w *nlWriter) addSet(s *compile.Set) error {
	w.ops++
	if err := w.b.AddSet(s); err != nil {
		return err
	}
	for i := range s.Elements {
		if err := w.addElement(s, &s.Elements[i]); err != nil {
			return err
		}
	}
	return nil
}

func (w *nlWriter) delElement(s *compile.Set, e *compile.Element) error {
	l, err := w.layout(s)
	if err == nil {
		err = w.b.DeleteElement(s.Name(), l, e)
	}
	return w.elementDone(s, err)
}

func (w *nlWriter) addElement(s *compile.Set, e *compile.Element) error {
	l, err := w.layout(s)
	if err == nil {
		err = w.b.AddElement(s.Name(), l, e)
	}
	return w.elementDone(s, err)
}

// layout is the element layout of s, read once per batch.
func (w *nlWriter) layout(s *compile.Set) (*nftnl.Layout, error) {
	name := s.Name()
	if l, ok := w.layouts[name]; ok {
		return l, nil
	}
	l, err := nftnl.LayoutOf(s)
	if err != nil {
		return nil, err
	}
	if w.layouts == nil {
		w.layouts = map[string]*nftnl.Layout{}
	}
	w.layouts[name] = &l
	return &l, nil
}

// elementDone counts an element written and names the set in an error.
func (w *nlWriter) elementDone(s *compile.Set, err error) error {
	if err != nil {
		return fmt.Errorf("set %s: %w", s.Name(), err)
	}
	w.ops++
	return nil
}

func (w *nlWriter) flushChain(name string) error {
	w.ops++
	w.b.FlushChain(name)
	return nil
}

func (w *nlWriter) addRule(chain string, r *compile.TableRule) error {
	w.ops++
	return w.b.AddRule(chain, r, func(n string) *compile.Set { return w.desired.Sets[n] })
}

func (w *nlWriter) delChain(name string) error {
	w.ops++
	w.b.DelChain(name)
	return nil
}

func (w *nlWriter) delSet(s *compile.Set) error {
	w.ops++
	w.b.DelSet(s.Name())
	return nil
}

// NetlinkFallbacks is the number of netlink element batches the kernel
// refused since the Syncer was created (each followed by a full sync). Safe
// to call from any goroutine (a metrics collector).
func (s *Syncer) NetlinkFallbacks() int64 { return s.netlinkFallbacks.Load() }
