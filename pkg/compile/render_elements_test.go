package compile

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// TestSortElementsIsStableSortAndDedup checks the in-place sort against
// its definition: a stable sort by compareElements (the order the tracker
// inserts in), then the first of each run of equal keys. The keys mix
// addresses of both families, ranges, numbers, words and concatenations
// of different lengths, with duplicates that differ in value and comment.
func TestSortElementsIsStableSortAndDedup(t *testing.T) {
	fields := []string{"10.0.0.1", "10.0.0.10", "10.0.0.2", "10.0.0.0/24", "10.0.0.1-10.0.0.9", "fd00::1", "fd00::1:0",
		"::ffff:10.0.0.1", "tcp", "udp", "80", "8080", "1-1024", "443", "", "x"}
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		n := r.IntN(60)
		var es []knftables.Element
		for i := 0; i < n; i++ {
			key := make([]string, 1+r.IntN(3))
			for j := range key {
				key[j] = fields[r.IntN(len(fields))]
			}
			e := knftables.Element{Key: key, Comment: ptr(fmt.Sprint("emitted ", i))}
			if r.IntN(2) == 0 {
				e.Value = []string{fmt.Sprint("goto c", i)}
			}
			es = append(es, e)
		}
		want := slices.Clone(es)
		slices.SortStableFunc(want, compareElements)
		want = slices.CompactFunc(want, func(a, b knftables.Element) bool { return slices.Equal(a.Key, b.Key) })
		got := sortElements(slices.Clone(es))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: sortElements differs from a stable sort (-want +got):\n%s", round, diff)
		}
	}
}

// TestElementSorterReusesScratch sorts sets of different sizes and key
// widths with one sorter, as render does: what an earlier set left in the
// scratch space must not leak into a later set's order.
func TestElementSorterReusesScratch(t *testing.T) {
	var so elementSorter
	wide := []knftables.Element{
		{Key: []string{"10.0.0.2", "tcp", "80"}}, {Key: []string{"10.0.0.1", "udp", "53"}}, {Key: []string{"10.0.0.1", "tcp", "8080"}},
	}
	narrow := []knftables.Element{{Key: []string{"10.0.0.9"}}, {Key: []string{"10.0.0.10"}}}
	so.sort(wide)
	got := so.sort(narrow)
	want := []knftables.Element{{Key: []string{"10.0.0.9"}}, {Key: []string{"10.0.0.10"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("second set (-want +got):\n%s", diff)
	}
}
