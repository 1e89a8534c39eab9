package controller

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testdata/nft-list-table.json is `nft -t -j list table inet nftpolicy` of the
// golden scenario deny-and-allow on node-1, with each rule's counter set to
// its handle so that sums are checkable.
func TestParsePolicyCounters(t *testing.T) {
	data, err := os.ReadFile("testdata/nft-list-table.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePolicyCounters(data)
	if err != nil {
		t.Fatal(err)
	}
	want := map[PolicyCounterKey]uint64{
		{"x/allow-web", "ingress", "allowed"}:   32 + 33 + 34 + 35 + 36 + 37,
		{"x/allow-web", "ingress", "denied"}:    30,
		{"x/default-deny", "ingress", "denied"}: 30 + 31,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	if _, err := ParsePolicyCounters([]byte("not json")); err == nil {
		t.Error("bad input accepted")
	}
}
