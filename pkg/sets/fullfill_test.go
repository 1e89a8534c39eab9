package sets

import (
	"fmt"
	"slices"
	"testing"
)

// TestTakeElements: batches of an unhooked fill hold at most n additions,
// split sets across batches where needed, and together hold every
// addition once, in order.
func TestTakeElements(t *testing.T) {
	idx := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	diffs := []setDiff{{name: "a", add: idx(5)}, {name: "b", add: idx(1)}, {name: "c", add: idx(12)}, {name: "d", add: idx(3)}}
	for _, n := range []int{1, 3, 4, 6, 7, 100} {
		var got []string
		rest := diffs
		for len(rest) > 0 {
			var head []setDiff
			head, rest = takeElements(rest, n)
			total := 0
			for _, d := range head {
				total += len(d.add)
			}
			if total == 0 || total > n {
				t.Fatalf("n=%d: a batch of %d elements", n, total)
			}
			for _, d := range head {
				for _, i := range d.add {
					got = append(got, fmt.Sprintf("%s%d", d.name, i))
				}
			}
		}
		var want []string
		for _, d := range diffs {
			for _, i := range d.add {
				want = append(want, fmt.Sprintf("%s%d", d.name, i))
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("n=%d: batches hold %v, want %v", n, got, want)
		}
	}
}
