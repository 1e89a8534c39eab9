package nftnl

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestTableObjects: the netlink listing of a full sync names the table's
// chains, sets and maps as nft lists them, and nothing of other tables
// (another inet table, a table of the same name in another family), nor
// the anonymous sets of rules.
func TestTableObjects(t *testing.T) {
	ns, f := scratchNetns(t)
	w := NewConn(compile.TableName, int(f.Fd()))
	t.Cleanup(func() { w.Close() })
	got, err := w.tableObjects(context.Background())
	if err != nil {
		t.Fatalf("listing a table that does not exist: %v", err)
	}
	if len(got) != 0 {
		t.Fatalf("a table that does not exist lists %v", got)
	}
	nftIn(t, ns, `
add table inet nftpolicy
add chain inet nftpolicy forward { type filter hook forward priority 0 ; }
add chain inet nftpolicy isolated
add set inet nftpolicy peers-v4 { type ipv4_addr ; elements = { 10.0.0.1 comment "x/a" } ; }
add set inet nftpolicy ranges-v4 { type ipv4_addr ; flags interval ; elements = { 10.0.0.0/8 } ; }
add set inet nftpolicy ports-v4 { type ipv4_addr . inet_proto . inet_service ; }
add map inet nftpolicy ingress-pods-v4 { type ipv4_addr : verdict ; elements = { 10.0.0.1 : goto isolated } ; }
add map inet nftpolicy marks-v4 { type ipv4_addr : mark ; }
add counter inet nftpolicy denied
add map inet nftpolicy counters-v4 { type ipv4_addr : counter ; }
add rule inet nftpolicy forward tcp dport { 80, 443 } ip saddr @peers-v4 counter goto isolated
add table inet other
add chain inet other forward
add set inet other peers-v4 { type ipv4_addr ; }
add table ip nftpolicy
add chain ip nftpolicy ipchain
add set ip nftpolicy ipset { type ipv4_addr ; }
`, "-f", "-")
	got, err = w.tableObjects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range got {
		slices.Sort(names)
	}
	want := map[string][]string{
		BaseChains: {"forward"},
		"chain":    {"forward", "isolated"},
		"set":      {"peers-v4", "ports-v4", "ranges-v4"},
		"map":      {"counters-v4", "ingress-pods-v4", "marks-v4"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("table objects (-want +got):\n%s", diff)
	}
}

// tableObjects is ListTable's names.
func (w *Conn) tableObjects(ctx context.Context) (map[string][]string, error) {
	objs, _, err := w.ListTable(ctx)
	return objs, err
}
