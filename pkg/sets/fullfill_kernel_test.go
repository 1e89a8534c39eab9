package sets_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// recordingNFT keeps the text of every transaction it runs.
type recordingNFT struct {
	*nsNFT
	txs []string
}

func (n *recordingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	n.txs = append(n.txs, tx.String())
	return n.nsNFT.Run(ctx, tx)
}

// TestFullSyncUnhooked: a full sync into a table without base chains fills
// the sets before any chain is hooked: the first nft transaction has no
// base chain and no rule, the elements go over netlink, the last
// transaction hooks the base chains with every rule; the table is then the
// one a single nft transaction writes. With the table hooked, the next full
// sync is one nft transaction again. A writer whose batches the kernel
// refuses (it names another table) makes the elements go through nft in
// the last transaction, with the same result; so do batches of a few
// elements each (sets split across batches).
func TestFullSyncUnhooked(t *testing.T) {
	in := compiletest.Cluster(600, 60, 3)
	in.NodeName = "node-0"
	rs := render(t, in)
	ref := newKernelNode(t, false)
	if _, err := ref.syncer.Sync(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	want := ref.dump(t)
	for _, tc := range []struct {
		refused bool
		chunk   int
	}{{false, 0}, {false, 7}, {true, 0}} {
		refused := tc.refused
		if tc.chunk > 0 {
			sets.SetFillChunk(t, tc.chunk)
		}
		k := newKernelNode(t, true)
		nft, err := newNSNFT(k.r)
		if err != nil {
			t.Fatal(err)
		}
		rec := &recordingNFT{nsNFT: nft}
		w := nftnl.NewConn(compile.TableName, int(nsFile(t, k.r).Fd()))
		if refused {
			w = nftnl.NewConn("not-"+compile.TableName, int(nsFile(t, k.r).Fd()))
		}
		t.Cleanup(func() { w.Close() })
		s, err := sets.New(sets.Config{NFT: rec, Netlink: w, OneCommandPerSet: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Sync(context.Background(), rs)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Full || res.NetlinkFill == refused || len(rec.txs) != 2 {
			t.Fatalf("refused %v: first sync %+v in %d nft transactions, want a full sync in 2, elements over netlink %v", refused, res, len(rec.txs), !refused)
		}
		first, last := rec.txs[0], rec.txs[1]
		if strings.Contains(first, " hook ") || strings.Contains(first, "add rule ") {
			t.Errorf("refused %v: the first transaction hooks a chain or adds a rule:\n%s", refused, first)
		}
		if strings.Contains(first, "add element ") {
			t.Errorf("refused %v: the first transaction writes elements the netlink writer can write", refused)
		}
		if got := strings.Contains(last, "add element "); got != refused {
			t.Errorf("refused %v: the last transaction writes elements: %v", refused, got)
		}
		if got, want := strings.Count(last, " hook "), strings.Count(string(ref.nft(t, "list", "table", "inet", compile.TableName)), " hook "); got != want || got == 0 {
			t.Errorf("refused %v: the last transaction hooks %d chains, the table has %d", refused, got, want)
		}
		if diff := cmp.Diff(want, k.dump(t)); diff != "" {
			t.Fatalf("refused %v: table differs from one nft transaction's (-nft +filled):\n%s", refused, diff)
		}
		if refused {
			continue
		}
		rec.txs = nil
		s.ForceFull()
		res, err = s.Sync(context.Background(), rs)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Full || res.NetlinkFill || len(rec.txs) != 1 {
			t.Fatalf("full sync of a hooked table: %+v in %d nft transactions, want one", res, len(rec.txs))
		}
		if diff := cmp.Diff(want, k.dump(t)); diff != "" {
			t.Fatalf("re-sync: table differs (-nft +got):\n%s", diff)
		}
	}
}

// TestFullSyncUnhookedIntervals: interval sets filled over netlink list as
// nft's own load lists them, with adjacent ranges (pod CIDRs of
// neighbouring nodes), single addresses, a range up to the last address
// and concatenated ranges.
func TestFullSyncUnhookedIntervals(t *testing.T) {
	v4 := &compile.Set{Key: []compile.KeyKind{compile.KeyIPv4}, Set: &knftables.Set{Name: "ranges-v4", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}}}
	for _, p := range []string{"10.244.1.0/24", "10.244.2.0/24", "10.244.3.7/32", "255.255.255.0/24"} {
		v4.Elements = append(v4.Elements, compile.PrefixElement(netip.MustParsePrefix(p)))
	}
	v4.Elements = append(v4.Elements, compile.RangeElement(compile.IPRange{From: netip.MustParseAddr("10.9.0.0"), To: netip.MustParseAddr("10.9.0.5")}))
	cc := &compile.Set{Key: []compile.KeyKind{compile.KeyProto, compile.KeyService}, Set: &knftables.Set{Name: "ports-v4", Type: "inet_proto . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag}}}
	for _, p := range []compile.PortRange{{Protocol: compile.ProtoTCP, First: 80, Last: 89}, {Protocol: compile.ProtoUDP, First: 90, Last: 90}} {
		cc.Elements = append(cc.Elements, compile.Element{Ports: p, Shape: compile.ShapeProtoPorts})
	}
	rs := &compile.Ruleset{
		Table: knftables.Table{Comment: ptrString("intervals")},
		Chains: map[string]*compile.Chain{"forward": {
			Chain: knftables.Chain{Name: "forward", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.FilterPriority)},
			Rules: []compile.TableRule{{Exprs: []compile.RuleExpr{{Kind: compile.ExprNft, Text: "ip saddr @ranges-v4 meta l4proto . th dport @ports-v4 counter accept"}}}},
		}},
		ChainOrder: []string{"forward"},
		Sets:       map[string]*compile.Set{"ranges-v4": v4, "ports-v4": cc},
	}
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	res, err := node.syncer.Sync(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	if !res.NetlinkFill {
		t.Fatalf("sync %+v did not fill the sets over netlink", res)
	}
	if _, err := ref.syncer.Sync(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ref.dump(t), node.dump(t)); diff != "" {
		t.Fatalf("table differs from one nft transaction's (-nft +filled):\n%s", diff)
	}
	// A re-sync over the filled (hooked) table reads the ranges back as
	// the desired ones: adjacent ranges, the open one and the
	// concatenated ones compare unchanged.
	node.syncer.ForceFull()
	res, err = node.syncer.Sync(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	if res.ElementsAdded != 0 || res.ElementsDeleted != 0 || res.ElementsUnchanged != len(v4.Elements)+len(cc.Elements) {
		t.Errorf("re-sync %+v: want every range unchanged", res)
	}
}
