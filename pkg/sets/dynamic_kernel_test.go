package sets_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// TestDynamicSetKeepsElements: elements written into a dynamic set (DNS
// learning's, with timeouts) survive incremental and forced full syncs,
// and an element added again gets its timeout refreshed; a changed
// declaration recreates the set empty.
func TestDynamicSetKeepsElements(t *testing.T) {
	k := newKernelNode(t, true)
	ctx := context.Background()
	ruleset := func(comment string) *compile.Ruleset {
		return &compile.Ruleset{
			Table:  knftables.Table{Comment: knftables.PtrTo("t")},
			Chains: map[string]*compile.Chain{},
			Sets:   map[string]*compile.Set{"learned-v4": {Dynamic: true, Key: []compile.KeyKind{compile.KeyIPv4, compile.KeyIPv4}, Set: &knftables.Set{Name: "learned-v4", Type: "ipv4_addr . ipv4_addr", Flags: []knftables.SetFlag{knftables.TimeoutFlag}, Comment: knftables.PtrTo(comment)}}},
		}
	}
	if _, err := k.syncer.Sync(ctx, ruleset("a")); err != nil {
		t.Fatal(err)
	}
	w := nsElementWriter(t, k.r)
	el := nftnl.TimedElement{Set: "learned-v4", Pod: netip.MustParseAddr("10.0.0.1"), Addr: netip.MustParseAddr("192.0.2.1"), Timeout: 30 * time.Second}
	if err := w.AddTimed(ctx, []nftnl.TimedElement{el}); err != nil {
		t.Fatal(err)
	}
	has := func() string { return string(k.nft(t, "list", "set", "inet", compile.TableName, "learned-v4")) }
	if !strings.Contains(has(), "10.0.0.1 . 192.0.2.1 timeout 30s") {
		t.Fatalf("element not written:\n%s", has())
	}
	el.Timeout = time.Hour
	if err := w.AddTimed(ctx, []nftnl.TimedElement{el}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(has(), "timeout 1h") {
		t.Errorf("adding an element again does not refresh its timeout:\n%s", has())
	}
	if _, err := k.syncer.Sync(ctx, ruleset("a")); err != nil {
		t.Fatal(err)
	}
	k.syncer.ForceFull()
	if _, err := k.syncer.Sync(ctx, ruleset("a")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(has(), "10.0.0.1 . 192.0.2.1") {
		t.Errorf("a full sync lost the learned element:\n%s", has())
	}
	if _, err := k.syncer.Sync(ctx, ruleset("b")); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(has(), "192.0.2.1") {
		t.Errorf("a set whose declaration changed kept its elements:\n%s", has())
	}
}

// TestNewExternalChainInstalled: an External chain that appears in an
// incremental sync (DNS learning's, with the first domainNames rule) gets
// its rules from the installer.
func TestNewExternalChainInstalled(t *testing.T) {
	k := newKernelNode(t, true)
	var installed []string
	k.syncer = mustSyncer(t, k, func(_ context.Context, chain string) error {
		installed = append(installed, chain)
		return nil
	})
	ctx := context.Background()
	rs := &compile.Ruleset{Table: knftables.Table{Comment: knftables.PtrTo("t")}, Chains: map[string]*compile.Chain{}, Sets: map[string]*compile.Set{}}
	if _, err := k.syncer.Sync(ctx, rs); err != nil {
		t.Fatal(err)
	}
	rs2 := &compile.Ruleset{Table: rs.Table, Sets: rs.Sets, Chains: map[string]*compile.Chain{
		compile.ChainDNS: {Chain: knftables.Chain{Name: compile.ChainDNS}, External: true}}, ChainOrder: []string{compile.ChainDNS}}
	if _, err := k.syncer.Sync(ctx, rs2); err != nil {
		t.Fatal(err)
	}
	if len(installed) != 1 || installed[0] != compile.ChainDNS {
		t.Errorf("installer called for %v, want [%s]", installed, compile.ChainDNS)
	}
}

// mustSyncer is a netlink-writing Syncer in k's namespace with an External
// installer.
func mustSyncer(t *testing.T, k *kernelNode, ext sets.ExternalRules) *sets.Syncer {
	t.Helper()
	nft, err := newNSNFT(k.r)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sets.New(sets.Config{NFT: nft, Netlink: nsElementWriter(t, k.r), OneCommandPerSet: true, External: ext})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
