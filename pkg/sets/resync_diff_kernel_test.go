package sets_test

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// recordingNode is a kernel node whose netlink syncer records its nft
// transactions.
func recordingNode(t *testing.T) (*kernelNode, *recordingNFT) {
	t.Helper()
	k := newKernelNode(t, true)
	nft, err := newNSNFT(k.r)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingNFT{nsNFT: nft}
	s, err := sets.New(sets.Config{NFT: rec, Netlink: nsElementWriter(t, k.r), OneCommandPerSet: true})
	if err != nil {
		t.Fatal(err)
	}
	k.syncer = s
	return k, rec
}

// elementOps matches the commands of a transaction that write elements or
// replace a set: their set or map names are what a re-sync rewrote.
var elementOps = regexp.MustCompile(`(?m)^(add element|delete element|flush set|flush map|delete set|delete map) inet ` + compile.TableName + ` (\S+)`)

// touchedSets returns "command name" for every element or set operation
// of tx; adding a set's declaration alone is not one.
func touchedSets(tx string) []string {
	var out []string
	for _, m := range elementOps.FindAllStringSubmatch(tx, -1) {
		out = append(out, m[1]+" "+m[2])
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// syncedNode is a recording node whose table holds the ruleset of a
// small generated cluster, returned.
func syncedNode(t *testing.T) (*kernelNode, *recordingNFT, *compile.Ruleset) {
	t.Helper()
	in := compiletest.Cluster(400, 40, 3)
	in.NodeName = "node-0"
	rs := render(t, in)
	k, rec := recordingNode(t)
	if _, err := k.syncer.Sync(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	return k, rec, rs
}

// restarted is a new Syncer of k's table, writing through rec: nothing
// remembered, as after a restart.
func restarted(t *testing.T, k *kernelNode, rec *recordingNFT) *sets.Syncer {
	t.Helper()
	s, err := sets.New(sets.Config{NFT: rec, Netlink: nsElementWriter(t, k.r), OneCommandPerSet: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestResyncUnchangedTable: a full sync over a table that already holds
// the desired ruleset (an agent restarted on its node) writes no element
// and replaces no set: every element is found unchanged; the table stays
// the same.
func TestResyncUnchangedTable(t *testing.T) {
	k, rec, rs := syncedNode(t)
	ctx := context.Background()
	want := k.dump(t)
	total := 0
	for _, s := range rs.Sets {
		total += len(s.Elements)
	}
	s := restarted(t, k, rec)
	rec.txs = nil
	res, err := s.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.txs) != 1 {
		t.Fatalf("re-sync ran %d nft transactions, want 1", len(rec.txs))
	}
	if ops := touchedSets(rec.txs[0]); len(ops) != 0 {
		t.Errorf("re-sync of an unchanged table wrote elements or replaced sets: %v", ops)
	}
	if !res.Full || res.ElementsAdded != 0 || res.ElementsDeleted != 0 || res.ElementsUnchanged != total || total == 0 {
		t.Errorf("re-sync %+v: want a full sync with no element added or deleted and %d unchanged", res, total)
	}
	if diff := cmp.Diff(want, k.dump(t)); diff != "" {
		t.Fatalf("re-sync changed the table (-before +after):\n%s", diff)
	}
}

// freshTable is the table a plain knftables syncer writes for rs into a
// new namespace: what any sync of rs must end with.
func freshTable(t *testing.T, rs *compile.Ruleset) map[string]string {
	t.Helper()
	ref := newKernelNode(t, false)
	if _, err := ref.syncer.Sync(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	return ref.dump(t)
}

// hookedRuleset is a table with one base chain of one rule and these sets.
func hookedRuleset(rule string, sets ...*compile.Set) *compile.Ruleset {
	rs := &compile.Ruleset{
		Table: knftables.Table{Comment: knftables.PtrTo("t")},
		Chains: map[string]*compile.Chain{"forward": {
			Chain: knftables.Chain{Name: "forward", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.FilterPriority)},
			Rules: []compile.TableRule{{Exprs: []compile.RuleExpr{{Kind: compile.ExprNft, Text: rule}}}},
		}},
		ChainOrder: []string{"forward"},
		Sets:       map[string]*compile.Set{},
	}
	for _, s := range sets {
		rs.Sets[s.Name()] = s
	}
	return rs
}

// pickSet returns the name of the first set or map of rs (in name order)
// that ok accepts.
func pickSet(t *testing.T, rs *compile.Ruleset, what string, ok func(*compile.Set) bool) *compile.Set {
	t.Helper()
	for _, n := range rs.SortedSetNames() {
		if s := rs.Sets[n]; ok(s) {
			return s
		}
	}
	t.Fatalf("the rendered ruleset has no %s", what)
	return nil
}

func isInterval(s *compile.Set) bool {
	return s.Set != nil && slices.Contains(s.Set.Flags, "interval")
}

// TestResyncRepairsDrift: a full sync over a table that someone changed
// by hand (elements deleted, added, a comment and a verdict changed, a
// range added to an interval set, a stale set) ends with the table a
// plain knftables syncer writes from scratch, and its transaction touches
// only the sets that differ: element deletions and additions for hash
// sets and maps, a flush and refill for the interval set.
func TestResyncRepairsDrift(t *testing.T) {
	in := compiletest.Cluster(400, 40, 3)
	in.NodeName = "node-0"
	rs := render(t, in)
	want := freshTable(t, rs)

	plain := pickSet(t, rs, "hash set of 10+ single addresses with comments", func(s *compile.Set) bool {
		return s.Set != nil && !isInterval(s) && len(s.Elements) >= 10 && s.Elements[0].Shape == compile.ShapeAddr && s.Elements[1].Comment != nil
	})
	vmap := pickSet(t, rs, "verdict map with 5+ elements", func(s *compile.Set) bool {
		return s.Map != nil && strings.HasSuffix(s.Map.Type, ": verdict") && len(s.Elements) >= 5 && strings.HasSuffix(s.Map.Name, "-v4")
	})
	self := rs.Sets["self-v4"]
	if self == nil || len(self.Elements) < 3 {
		t.Fatal("the rendered ruleset has no self-v4 set with 3+ elements")
	}
	ranges := pickSet(t, rs, "interval set of addresses with elements", func(s *compile.Set) bool {
		return isInterval(s) && len(s.Elements) > 0 && (s.Set.Type == "ipv4_addr")
	})
	k, rec := recordingNode(t)
	ctx := context.Background()
	if _, err := k.syncer.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	tbl := []string{"inet", compile.TableName}
	el := func(verb, set, elems string) {
		k.nft(t, append(append([]string{verb, "element"}, tbl...), set, "{ "+elems+" }")...)
	}
	p0, p1 := plain.Elements[0].Text(), plain.Elements[1].Text()
	el("delete", plain.Set.Name, p0)                          // missing
	el("delete", plain.Set.Name, p1)                          // comment changed
	el("add", plain.Set.Name, p1+` comment "edited by hand"`) //
	el("add", plain.Set.Name, "10.99.99.99")                  // extra
	m0 := string(vmap.Elements[0].AppendKey(nil))             //
	el("delete", vmap.Map.Name, m0)                           // verdict changed
	el("add", vmap.Map.Name, m0+" : accept")                  //
	el("add", vmap.Map.Name, "10.99.99.98 : accept")          // extra
	el("add", self.Set.Name, "10.99.99.97 . 10.99.99.97")     // extra, concatenated
	el("add", ranges.Set.Name, "192.0.2.0/24")                // extra range
	k.nft(t, append(append([]string{"add", "set"}, tbl...), "stale-set", "{ type ipv4_addr ; }")...)
	if d := k.dump(t); cmp.Equal(want, d) {
		t.Fatal("the hand edits did not change the table")
	}

	k.syncer.ForceFull()
	rec.txs = nil
	res, err := k.syncer.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, k.dump(t)); diff != "" {
		t.Fatalf("re-synced table differs from a fresh load (-fresh +re-synced):\n%s", diff)
	}
	if len(rec.txs) != 1 {
		t.Fatalf("re-sync ran %d nft transactions, want 1", len(rec.txs))
	}
	wantOps := []string{
		"add element " + plain.Set.Name, "add element " + ranges.Set.Name, "add element " + vmap.Map.Name,
		"delete element " + plain.Set.Name, "delete element " + self.Set.Name, "delete element " + vmap.Map.Name,
		"delete set stale-set",
		"flush set " + ranges.Set.Name,
	}
	sort.Strings(wantOps)
	if diff := cmp.Diff(wantOps, touchedSets(rec.txs[0])); diff != "" {
		t.Errorf("re-sync touched other sets than the edited ones (-want +got):\n%s", diff)
	}
	// plain: p0 added, p1 replaced, 10.99.99.99 deleted; vmap: m0
	// replaced, 10.99.99.98 deleted; self: one deleted; ranges: refilled.
	if wantAdd, wantDel := 2+1+len(ranges.Elements), 2+2+1; res.ElementsAdded != wantAdd || res.ElementsDeleted != wantDel {
		t.Errorf("re-sync %+v: want %d elements added, %d deleted", res, wantAdd, wantDel)
	}
}

// TestResyncKeepsDynamicSet: a full sync over a hooked table by a new
// Syncer (the agent restarted: it remembers no dynamic set) leaves a
// dynamic set whose declaration is the desired one alone, learned
// elements included, while it repairs a regular set next to it; a changed
// declaration still recreates the dynamic set empty.
func TestResyncKeepsDynamicSet(t *testing.T) {
	ctx := context.Background()
	ruleset := func(comment string) *compile.Ruleset {
		return hookedRuleset("ip saddr . ip daddr @learned-v4 ip saddr @pods-v4 counter accept",
			&compile.Set{Dynamic: true, Key: []compile.KeyKind{compile.KeyIPv4, compile.KeyIPv4}, Set: &knftables.Set{Name: "learned-v4", Type: "ipv4_addr . ipv4_addr", Flags: []knftables.SetFlag{knftables.TimeoutFlag}, Comment: knftables.PtrTo(comment)}},
			&compile.Set{Key: []compile.KeyKind{compile.KeyIPv4}, Set: &knftables.Set{Name: "pods-v4", Type: "ipv4_addr"}, Elements: []compile.Element{
				compile.AddrElement(netip.MustParseAddr("10.0.0.1"), nil), compile.AddrElement(netip.MustParseAddr("10.0.0.2"), nil),
				compile.AddrElement(netip.MustParseAddr("10.0.0.3"), nil)}})
	}
	k, rec := recordingNode(t)
	if _, err := k.syncer.Sync(ctx, ruleset("a")); err != nil {
		t.Fatal(err)
	}
	w := nsElementWriter(t, k.r)
	if err := w.AddTimed(ctx, []nftnl.TimedElement{{Set: "learned-v4", Pod: netip.MustParseAddr("10.0.0.1"),
		Addr: netip.MustParseAddr("192.0.2.1"), Timeout: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	k.nft(t, "delete", "element", "inet", compile.TableName, "pods-v4", "{ 10.0.0.2 }")
	learned := func() string { return string(k.nft(t, "list", "set", "inet", compile.TableName, "learned-v4")) }
	for i, comment := range []string{"a", "b"} {
		// A new Syncer each time: nothing remembered, as after a restart.
		s, err := sets.New(sets.Config{NFT: rec, Netlink: nsElementWriter(t, k.r), OneCommandPerSet: true})
		if err != nil {
			t.Fatal(err)
		}
		rec.txs = nil
		if _, err := s.Sync(ctx, ruleset(comment)); err != nil {
			t.Fatal(err)
		}
		if len(rec.txs) != 1 {
			t.Fatalf("re-sync ran %d nft transactions, want 1", len(rec.txs))
		}
		ops := touchedSets(rec.txs[0])
		if i == 0 {
			if diff := cmp.Diff([]string{"add element pods-v4"}, ops); diff != "" {
				t.Errorf("re-sync touched (-want +got):\n%s", diff)
			}
			if !strings.Contains(learned(), "10.0.0.1 . 192.0.2.1") {
				t.Errorf("the re-sync lost the learned element:\n%s", learned())
			}
			if got := string(k.nft(t, "list", "set", "inet", compile.TableName, "pods-v4")); !strings.Contains(got, "10.0.0.2") {
				t.Errorf("the re-sync did not repair pods-v4:\n%s", got)
			}
			continue
		}
		if !slices.Contains(ops, "delete set learned-v4") || strings.Contains(learned(), "192.0.2.1") {
			t.Errorf("a dynamic set whose declaration changed was kept (ops %v):\n%s", ops, learned())
		}
	}
}

// TestResyncFallsBackToRewrite: when the transaction of the differences
// fails (here: elements of a constant set, which the kernel never
// changes), nothing changed, and the same sync rewrites the table whole
// in a second transaction.
func TestResyncFallsBackToRewrite(t *testing.T) {
	ctx := context.Background()
	ruleset := func(elems ...string) *compile.Ruleset {
		s := &compile.Set{Key: []compile.KeyKind{compile.KeyIPv4}, Set: &knftables.Set{Name: "fixed-v4", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.ConstantFlag}}}
		for _, e := range elems {
			s.Elements = append(s.Elements, compile.AddrElement(netip.MustParseAddr(e), nil))
		}
		return hookedRuleset("ip saddr @fixed-v4 counter accept", s)
	}
	k, rec := recordingNode(t)
	if _, err := k.syncer.Sync(ctx, ruleset("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	rs := ruleset("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.5")
	want := freshTable(t, rs)
	k.syncer.ForceFull()
	rec.txs = nil
	res, err := k.syncer.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.txs) != 2 || !res.Full {
		t.Fatalf("re-sync %+v in %d transactions, want a failed one of differences and a full rewrite", res, len(rec.txs))
	}
	if ops := touchedSets(rec.txs[0]); !slices.Contains(ops, "delete element fixed-v4") || slices.Contains(ops, "delete set fixed-v4") {
		t.Errorf("first transaction: %v, want only element changes in fixed-v4", ops)
	}
	if ops := touchedSets(rec.txs[1]); !slices.Contains(ops, "delete set fixed-v4") {
		t.Errorf("second transaction: %v, want fixed-v4 replaced", ops)
	}
	if diff := cmp.Diff(want, k.dump(t)); diff != "" {
		t.Fatalf("table differs from a fresh load (-fresh +re-synced):\n%s", diff)
	}
}

// TestPrefetchedResync: a re-sync whose kernel read was started before the
// build (Prefetch) compares every set from it and leaves the unchanged
// table as it was; a set deleted and added again by hand after the read,
// under the same name and declaration but with other elements, is read
// again, and the sync ends with the table a fresh one would be.
func TestPrefetchedResync(t *testing.T) {
	k, rec, rs := syncedNode(t)
	ctx := context.Background()
	want := k.dump(t)
	restart := func() *sets.Syncer { return restarted(t, k, rec) }

	s := restart()
	s.Prefetch(ctx)
	res, err := s.Sync(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if res.SetsPrefetched == 0 || res.ElementsAdded != 0 || res.ElementsDeleted != 0 {
		t.Errorf("prefetched re-sync of an unchanged table: %+v, want sets compared from the prefetch and no element written", res)
	}
	if diff := cmp.Diff(want, k.dump(t)); diff != "" {
		t.Fatalf("prefetched re-sync changed the table (-before +after):\n%s", diff)
	}

	// A set no rule names, deleted by hand after the read and added
	// again with the same declaration and one of its elements.
	addrs := func(name string, elems ...string) *compile.Set {
		s := &compile.Set{Key: []compile.KeyKind{compile.KeyIPv4}, Set: &knftables.Set{Name: name, Type: "ipv4_addr"}}
		for _, e := range elems {
			s.Elements = append(s.Elements, compile.AddrElement(netip.MustParseAddr(e), nil))
		}
		return s
	}
	spare := addrs("spare-v4", "10.0.0.1", "10.0.0.2", "10.0.0.3")
	k, rec = recordingNode(t)
	rs = hookedRuleset("ip saddr @fixed-v4 counter accept", addrs("fixed-v4", "10.0.1.1"), spare)
	if _, err := restart().Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	s = restart()
	s.Prefetch(ctx)
	sets.WaitPrefetch(s)
	k.nft(t, "delete", "set", "inet", compile.TableName, "spare-v4")
	nft, err := newNSNFT(k.r)
	if err != nil {
		t.Fatal(err)
	}
	tx := nft.NewTransaction()
	addrs("spare-v4", "10.0.0.3").AddTo(tx)
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if res, err = s.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if res.SetsPrefetched != 1 || res.ElementsAdded != 2 {
		t.Errorf("re-sync after spare-v4 was replaced by hand: %+v, want fixed-v4 compared from the prefetch, spare-v4 read again and 2 elements added", res)
	}
	if diff := cmp.Diff(freshTable(t, rs), k.dump(t)); diff != "" {
		t.Fatalf("table after the prefetched re-sync differs from a fresh one (-fresh +got):\n%s", diff)
	}
}
