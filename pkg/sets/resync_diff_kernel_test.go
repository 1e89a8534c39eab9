package sets_test

import (
	"context"
	"regexp"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
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

// TestResyncUnchangedTable: a full sync over a table that already holds
// the desired ruleset (an agent restarted on its node) writes no element
// and replaces no set: every element is found unchanged; the table stays
// the same.
func TestResyncUnchangedTable(t *testing.T) {
	in := compiletest.Cluster(400, 40, 3)
	in.NodeName = "node-0"
	rs := render(t, in)
	k, rec := recordingNode(t)
	ctx := context.Background()
	if _, err := k.syncer.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	want := k.dump(t)
	total := 0
	for _, s := range rs.Sets {
		total += len(s.Elements)
	}
	// A new Syncer: nothing remembered, as after a restart.
	s, err := sets.New(sets.Config{NFT: rec, Netlink: nsElementWriter(t, k.r), OneCommandPerSet: true})
	if err != nil {
		t.Fatal(err)
	}
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
