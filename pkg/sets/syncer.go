package sets

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// ExternalRules installs the rules of a chain that nft cannot write (the
// xt-compat queue rule). It must replace the chain's rules atomically.
type ExternalRules func(ctx context.Context, chain string) error

// Config configures a Syncer.
type Config struct {
	// NFT talks to the kernel (knftables.New) or to a knftables.Fake.
	NFT knftables.Interface
	// External installs the rules of chains marked External; required
	// when the ruleset has such chains.
	External ExternalRules
	// Netlink, when set, writes the syncs that only change set and map
	// elements (pod churn) in one netlink batch instead of through nft.
	Netlink *nftnl.Conn
	// OneCommandPerSet makes full syncs write each set's elements as one
	// "add element" command instead of one command per element: nft parses
	// it in half the time. Only for the real nft (knftables.New): the Fake
	// does not parse element lists.
	OneCommandPerSet bool
	Logger           klog.Logger
}

// Validate reports an unusable configuration.
func (c *Config) Validate() error {
	if c.NFT == nil {
		return errors.New("sets: Config.NFT is required")
	}
	return nil
}

// Result describes one sync.
type Result struct {
	// Full is true when the whole table was rewritten.
	Full bool
	// Operations is the number of operations in the transaction (0: the
	// kernel already matched).
	Operations int
	Duration   time.Duration
	// ElementsAdded and ElementsDeleted count set and map element changes.
	ElementsAdded, ElementsDeleted int
	// ChainsWritten counts chains created or refilled; ChainsDeleted removed ones.
	ChainsWritten, ChainsDeleted int
	// Netlink is true when the element changes went over netlink
	// (Config.Netlink) instead of through nft.
	Netlink bool
	// NetlinkFallback is true when the kernel refused the netlink element
	// batch and this sync was a full one instead.
	NetlinkFallback bool
	// NetlinkFill is true when a full sync found the table without base
	// chains and wrote the elements over netlink before hooking it
	// (fullfill.go).
	NetlinkFill bool
	// ElementsUnchanged counts the elements a full sync found in the
	// kernel as desired and left alone; ReadDuration is the time it took
	// to read and compare the kernel's sets (resync.go).
	ElementsUnchanged int
	ReadDuration      time.Duration
	// SetsPrefetched counts the sets a full sync compared from the read
	// Prefetch made while the ruleset was built; the others it read
	// itself, in ReadDuration.
	SetsPrefetched int
}

// Syncer owns the nftpolicy table: it keeps what it last applied and turns
// each desired ruleset into one transaction with only the differences. Any
// failure makes the next sync a full one. Not safe for concurrent use.
type Syncer struct {
	cfg              Config
	applied          *compile.Ruleset
	netlinkFallbacks atomic.Int64
	// committed is the ruleset of the last sync that succeeded, for
	// readers on other goroutines (CommittedRule).
	committed atomic.Pointer[compile.Ruleset]
	// dynamic holds the declarations of the dynamic sets last committed.
	dynamic map[string]*compile.Set
	// pre is the read of the kernel's sets Prefetch started, which the
	// next full sync takes (prefetch.go).
	pre *kernelRead
}

// New returns a Syncer whose first sync is full.
func New(cfg Config) (*Syncer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return &Syncer{cfg: cfg}, nil
}

// ForceFull makes the next sync a full one (after an external change to
// the table, or periodically as a safety net).
func (s *Syncer) ForceFull() { s.applied = nil }

// Applied returns the ruleset the kernel is believed to hold; nil when
// unknown.
func (s *Syncer) Applied() *compile.Ruleset { return s.applied }

// Sync makes the table match desired, in one transaction.
func (s *Syncer) Sync(ctx context.Context, desired *compile.Ruleset) (Result, error) {
	return s.sync(ctx, desired, nil)
}

// sync is Sync; shared lists element changes made in place to sets that
// the applied ruleset and desired share (ApplyDelta).
func (s *Syncer) sync(ctx context.Context, desired *compile.Ruleset, shared compile.Delta) (Result, error) {
	start := time.Now()
	var res Result
	var err error
	if s.applied == nil {
		res, err = s.full(ctx, desired)
	} else {
		res, err = s.incremental(ctx, desired, shared)
	}
	res.Duration = time.Since(start)
	if err != nil {
		s.applied = nil
		return res, err
	}
	s.applied = desired
	s.committed.Store(desired)
	s.recordDynamic(desired)
	return res, nil
}

// CommittedRule returns rule i of a chain as the last successful sync
// wrote it (nil when that ruleset has no such rule): the per-policy
// counters read the owner of the rule the kernel counted. Safe for
// concurrent use: a ruleset's chains are not changed once it is synced
// (the tracker changes chains in a copy, Tracker.newRuleset).
func (s *Syncer) CommittedRule(chain string, i int) *compile.TableRule {
	rs := s.committed.Load()
	if rs == nil {
		return nil
	}
	c := rs.Chains[chain]
	if c == nil || i < 0 || i >= len(c.Rules) {
		return nil
	}
	return &c.Rules[i]
}

// full rewrites every chain and set of the table without deleting the table:
// deleting it would drop packets waiting in the queue and leave a window
// with no enforcement.
func (s *Syncer) full(ctx context.Context, desired *compile.Ruleset) (Result, error) {
	res := Result{Full: true}
	pre := s.takePrefetch()
	// External chains must hold their rules before anything jumps to them.
	if err := s.ensureExternal(ctx, desired); err != nil {
		return res, err
	}
	existing, decls, err := s.listExisting(ctx)
	if err != nil {
		return res, fmt.Errorf("listing table: %w", err)
	}
	if s.unhooked(existing) {
		return s.fullUnhooked(ctx, desired, existing)
	}
	if decls != nil {
		// Only what differs from the kernel's sets (resync.go).
		if res, ok := s.resync(ctx, desired, existing, decls, pre); ok {
			return res, nil
		}
	}
	tx := s.cfg.NFT.NewTransaction()
	s.clearTable(tx, desired, existing, &res, true)
	for _, n := range desired.SortedSetNames() {
		set := desired.Sets[n]
		if s.keptDynamic(desired, n) && slices.Contains(existing["set"], n) {
			continue
		}
		s.addSet(tx, set)
		res.ElementsAdded += len(set.Elements)
	}
	addAllRules(tx, desired, &res)
	res.Operations = tx.NumOperations()
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("full sync transaction (%d operations): %w", res.Operations, err)
	}
	return res, nil
}

// clearTable adds to tx the table, the desired chains (base chains only
// with withBase), and what empties the table of the last ruleset: every
// chain flushed, every set and map deleted but the kept dynamic sets,
// chains no longer wanted deleted.
func (s *Syncer) clearTable(tx *knftables.Transaction, desired *compile.Ruleset, existing map[string][]string, res *Result, withBase bool) {
	tx.Add(&knftables.Table{Comment: desired.Table.Comment})
	for _, n := range desired.ChainOrder {
		ch := desired.Chains[n].Chain
		if !withBase && ch.Hook != nil {
			continue
		}
		tx.Add(&ch)
	}
	// Empty every chain we own first, so no rule stops a deletion.
	for _, n := range existing["chain"] {
		if c, ok := desired.Chains[n]; ok && c.External {
			continue
		}
		tx.Flush(&knftables.Chain{Name: n})
	}
	// Every set and map is deleted and added again rather than flushed: the
	// kernel's may have another type, flags or timeout than the desired one
	// of the same name (written by another version of the agent, or by
	// hand), and adding over it would fail every sync. Nothing tells which
	// without listing them with their elements. Maps go before chains: their
	// verdict elements jump to chains.
	for _, n := range existing["map"] {
		tx.Delete(&knftables.Map{Name: n})
	}
	for _, n := range existing["set"] {
		if !s.keptDynamic(desired, n) {
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

// listExisting returns the names of the objects of the table, over netlink
// when the Syncer has a netlink writer, else through nft; and, over
// netlink only, the declarations of its sets and maps (nil otherwise).
func (s *Syncer) listExisting(ctx context.Context) (map[string][]string, map[string]*nftnl.SetDecl, error) {
	if s.cfg.Netlink != nil {
		return s.cfg.Netlink.ListTable(ctx)
	}
	existing, err := s.cfg.NFT.ListAll(ctx)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, nil, err
	}
	return existing, nil, nil
}

// ensureExternal creates the table and external chains and has their rules
// installed. It runs only on full syncs: the rules never change otherwise.
func (s *Syncer) ensureExternal(ctx context.Context, desired *compile.Ruleset) error {
	var ext []string
	for _, n := range desired.ChainOrder {
		if desired.Chains[n].External {
			ext = append(ext, n)
		}
	}
	if len(ext) == 0 {
		return nil
	}
	if s.cfg.External == nil {
		return fmt.Errorf("chains %s need external rules but no installer is configured", strings.Join(ext, ", "))
	}
	tx := s.cfg.NFT.NewTransaction()
	tx.Add(&knftables.Table{Comment: desired.Table.Comment})
	for _, n := range ext {
		ch := desired.Chains[n].Chain
		tx.Add(&ch)
	}
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return fmt.Errorf("creating external chains: %w", err)
	}
	for _, n := range ext {
		if err := s.cfg.External(ctx, n); err != nil {
			return fmt.Errorf("installing rules of chain %s: %w", n, err)
		}
	}
	return nil
}

// addAllRules adds the rules of every chain but the external ones.
func addAllRules(tx *knftables.Transaction, desired *compile.Ruleset, res *Result) {
	for _, n := range desired.ChainOrder {
		c := desired.Chains[n]
		if c.External {
			continue
		}
		addRules(tx, n, c)
		res.ChainsWritten++
	}
}

func addRules(tx *knftables.Transaction, chain string, c *compile.Chain) {
	for i := range c.Rules {
		r := c.Rules[i].Knft()
		r.Chain = chain
		tx.Add(&r)
	}
}

// incremental writes only what differs from the applied ruleset: element
// changes for pod churn, refilled chains for edited policies.
func (s *Syncer) incremental(ctx context.Context, desired *compile.Ruleset, shared compile.Delta) (Result, error) {
	var res Result
	old := s.applied
	if !equalStrPtr(old.Table.Comment, desired.Table.Comment) {
		// The mode changed: rewrite everything.
		return s.full(ctx, desired)
	}
	if newExternalChain(old, desired) {
		// Only full syncs install external rules (DNS learning's chain
		// appears with the first domainNames rule).
		return s.full(ctx, desired)
	}
	for n, set := range desired.Sets {
		if prev, ok := old.Sets[n]; ok && prev != set && !sameDefinition(prev, set) {
			// A set or map keeps its name but not its type, flags or
			// timeout: it must be replaced, after every rule that names it
			// is gone, which is what a full sync does.
			return s.full(ctx, desired)
		}
	}
	if s.cfg.Netlink != nil {
		if shared == nil {
			// Element changes only: no rule compared twice.
			if res, ok, err := s.netlinkSync(ctx, desired); ok {
				return res, err
			}
		}
		if res, ok, err := s.netlinkObjects(ctx, desired, shared); ok {
			return res, err
		}
	}
	tx := s.cfg.NFT.NewTransaction()
	_ = writeDiff(old, desired, shared, txWriter{tx}, &res)
	res.Operations = tx.NumOperations()
	if res.Operations == 0 {
		return res, nil
	}
	if err := s.cfg.NFT.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("incremental sync transaction (%d operations): %w", res.Operations, err)
	}
	return res, nil
}

// diffWriter takes an incremental sync's changes, in the order they must
// apply: an nft transaction (txWriter) or a netlink batch (nlWriter), which
// may refuse a change it cannot express (nftnl.ErrUnsupported).
type diffWriter interface {
	addChain(c *knftables.Chain) error
	addSet(s *compile.Set) error
	delElement(s *compile.Set, e *compile.Element) error
	addElement(s *compile.Set, e *compile.Element) error
	flushChain(name string) error
	addRule(chain string, r *compile.TableRule) error
	delChain(name string) error
	delSet(s *compile.Set) error
}

// writeDiff writes what differs between the applied ruleset and desired,
// when only chains' rules, sets and elements do (incremental checks the
// rest), and stops at the first change w refuses. A set both rulesets
// share (the same object) differs by its changes in shared, if any; other
// sets are compared.
func writeDiff(old, desired *compile.Ruleset, shared compile.Delta, w diffWriter, res *Result) error {
	// 1. New chains (empty for now: rules may reference sets added below).
	for _, n := range desired.ChainOrder {
		if _, ok := old.Chains[n]; !ok {
			ch := desired.Chains[n].Chain
			if err := w.addChain(&ch); err != nil {
				return err
			}
		}
	}
	// 2. New sets with their elements; element changes in existing ones.
	var inPlace map[string]*compile.SetDelta
	for i := range shared {
		if inPlace == nil {
			inPlace = map[string]*compile.SetDelta{}
		}
		inPlace[shared[i].Set] = &shared[i]
	}
	// In name order, but only the sets that may differ are sorted: a
	// ruleset has thousands, and after a policy or pod change nearly all
	// are the applied ruleset's own.
	var maybe []string
	for n, set := range desired.Sets {
		if old.Sets[n] != set || inPlace[n] != nil {
			maybe = append(maybe, n)
		}
	}
	slices.Sort(maybe)
	for _, n := range maybe {
		if err := writeSetDiff(old.Sets[n], desired.Sets[n], inPlace[n], w, res); err != nil {
			return err
		}
	}
	// 3. Chains whose rules changed are refilled; new chains filled.
	for _, n := range desired.ChainOrder {
		c := desired.Chains[n]
		if c.External {
			continue
		}
		prev, ok := old.Chains[n]
		if ok && (prev == c || equalRules(prev.Rules, c.Rules)) {
			continue
		}
		if ok {
			if err := w.flushChain(n); err != nil {
				return err
			}
		}
		for i := range c.Rules {
			if err := w.addRule(n, &c.Rules[i]); err != nil {
				return err
			}
		}
		res.ChainsWritten++
	}
	return writeRemovals(old, desired, w, res)
}

// writeSetDiff writes the changes of one desired set: the set and its
// elements when it is new (prev nil); else the element changes, from d when
// the applied ruleset shares the set, by comparison otherwise. Deletions go
// first, so that an element whose value changed (a pod moved to another
// isolation chain) is replaced within the transaction.
func writeSetDiff(prev, set *compile.Set, d *compile.SetDelta, w diffWriter, res *Result) error {
	if prev == nil {
		res.ElementsAdded += len(set.Elements)
		return w.addSet(set)
	}
	var del, add []*compile.Element
	delFrom := prev
	switch {
	case d != nil && prev == set:
		delFrom = set
		for i := range d.Delete {
			del = append(del, &d.Delete[i])
		}
		for i := range d.Add {
			add = append(add, &d.Add[i])
		}
	case prev == set || equalElements(prev.Elements, set.Elements):
		return nil
	default:
		addIdx, delIdx := diffElements(prev, set)
		for _, i := range delIdx {
			del = append(del, &prev.Elements[i])
		}
		for _, i := range addIdx {
			add = append(add, &set.Elements[i])
		}
	}
	for _, e := range del {
		if err := w.delElement(delFrom, e); err != nil {
			return err
		}
	}
	for _, e := range add {
		if err := w.addElement(set, e); err != nil {
			return err
		}
	}
	res.ElementsAdded += len(add)
	res.ElementsDeleted += len(del)
	return nil
}

// writeRemovals writes the deletions of chains, sets and maps desired no
// longer has: chains flushed all, then deleted, so that jumps between them
// do not block deletion; then the sets no longer referenced.
func writeRemovals(old, desired *compile.Ruleset, w diffWriter, res *Result) error {
	var gone []string
	for i := len(old.ChainOrder) - 1; i >= 0; i-- {
		n := old.ChainOrder[i]
		if _, ok := desired.Chains[n]; !ok {
			gone = append(gone, n)
			if err := w.flushChain(n); err != nil {
				return err
			}
		}
	}
	for _, n := range gone {
		if err := w.delChain(n); err != nil {
			return err
		}
		res.ChainsDeleted++
	}
	var goneSets []string
	for n := range old.Sets {
		if _, ok := desired.Sets[n]; !ok {
			goneSets = append(goneSets, n)
		}
	}
	slices.Sort(goneSets)
	for _, n := range goneSets {
		if err := w.delSet(old.Sets[n]); err != nil {
			return err
		}
	}
	return nil
}

// txWriter writes a diff into an nft transaction; it refuses nothing.
type txWriter struct{ tx *knftables.Transaction }

func (w txWriter) addChain(c *knftables.Chain) error { w.tx.Add(c); return nil }
func (w txWriter) addSet(s *compile.Set) error       { s.AddTo(w.tx); return nil }
func (w txWriter) delElement(s *compile.Set, e *compile.Element) error {
	w.tx.Delete(s.Knft(e))
	return nil
}
func (w txWriter) addElement(s *compile.Set, e *compile.Element) error {
	w.tx.Add(s.Knft(e))
	return nil
}
func (w txWriter) flushChain(name string) error { w.tx.Flush(&knftables.Chain{Name: name}); return nil }
func (w txWriter) addRule(chain string, r *compile.TableRule) error {
	rule := r.Knft()
	rule.Chain = chain
	w.tx.Add(&rule)
	return nil
}
func (w txWriter) delChain(name string) error { w.tx.Delete(&knftables.Chain{Name: name}); return nil }
func (w txWriter) delSet(s *compile.Set) error {
	if s.Map != nil {
		w.tx.Delete(&knftables.Map{Name: s.Map.Name})
	} else {
		w.tx.Delete(&knftables.Set{Name: s.Set.Name})
	}
	return nil
}

// sameDefinition reports whether two versions of a set or map have the
// same declaration (everything but the elements).
func sameDefinition(a, b *compile.Set) bool {
	if (a.Map == nil) != (b.Map == nil) {
		return false
	}
	if a.Map != nil {
		return reflect.DeepEqual(*a.Map, *b.Map)
	}
	return reflect.DeepEqual(*a.Set, *b.Set)
}

func equalStrPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func equalRules(a, b []compile.TableRule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// diffElements returns indices of elements to delete (in prev) and add (in
// desired). An element whose value or comment changed is in both.
func diffElements(prev, desired *compile.Set) (add, del []int) {
	have := make(map[string]struct{}, len(prev.Elements))
	for i := range prev.Elements {
		have[compile.ElementID(&prev.Elements[i])] = struct{}{}
	}
	want := make(map[string]struct{}, len(desired.Elements))
	for i := range desired.Elements {
		id := compile.ElementID(&desired.Elements[i])
		want[id] = struct{}{}
		if _, ok := have[id]; !ok {
			add = append(add, i)
		}
	}
	for i := range prev.Elements {
		if _, ok := want[compile.ElementID(&prev.Elements[i])]; !ok {
			del = append(del, i)
		}
	}
	return add, del
}

// equalElements is the cheap check that lets unchanged sets (most of them,
// on a pod update) cost no allocation.
func equalElements(a, b []compile.Element) bool {
	return slices.EqualFunc(a, b, func(x, y compile.Element) bool { return x.Equal(&y) })
}
