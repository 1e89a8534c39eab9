package sets_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestFullResyncOverNetlinkListing: a full sync into a table that holds
// the last agent's objects and some it does not want (a chain, a set and a
// map written by hand) leaves the same table as a full load by the plain
// knftables syncer, which lists the table with nft.
func TestFullResyncOverNetlinkListing(t *testing.T) {
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	in := compiletest.Cluster(400, 40, 3)
	in.NodeName = "node-0"
	old := render(t, in)
	in.Pods = in.Pods[:300]
	rs := render(t, in)
	deleted := map[*kernelNode]int{}
	for _, k := range []*kernelNode{node, ref} {
		if _, err := k.syncer.Sync(context.Background(), old); err != nil {
			t.Fatal(err)
		}
		k.nft(t, "add", "chain", "inet", compile.TableName, "stale-chain")
		k.nft(t, "add", "set", "inet", compile.TableName, "stale-set", "{ type ipv4_addr ; elements = { 10.9.9.9 } ; }")
		k.nft(t, "add", "map", "inet", compile.TableName, "stale-map", "{ type ipv4_addr : verdict ; elements = { 10.9.9.9 : goto stale-chain } ; }")
		k.syncer.ForceFull()
		res, err := k.syncer.Sync(context.Background(), rs)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Full {
			t.Fatalf("re-sync: %+v, want a full sync", res)
		}
		deleted[k] = res.ChainsDeleted
	}
	if deleted[node] != deleted[ref] || deleted[ref] == 0 {
		t.Errorf("chains deleted: %d with the netlink listing, %d with nft's", deleted[node], deleted[ref])
	}
	d := node.dump(t)
	for _, stale := range []string{"chain stale-chain", "set stale-set", "map stale-map"} {
		if _, ok := d[stale]; ok {
			t.Errorf("%s survived the full sync", stale)
		}
	}
	if diff := cmp.Diff(ref.dump(t), d); diff != "" {
		t.Fatalf("re-synced table differs from the nft-listing syncer's (-nft +netlink):\n%s", diff)
	}
}
