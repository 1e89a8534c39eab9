package compile_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
)

// TestApplyNamespaceLeavesThePreviousRuleset checks that a namespace change
// never writes the ruleset the tracker had before it, which a Syncer holds
// as the kernel's and diffs the new one against: its chains and every
// set's elements stay as they were, while the new ruleset moves the
// namespace's pods.
func TestApplyNamespaceLeavesThePreviousRuleset(t *testing.T) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 5}
	moved := 0
	for seed := uint64(1); seed <= 30; seed++ {
		w := newWorld(seed, scenariogen.Nodes[int(seed)%len(scenariogen.Nodes)])
		tr, _ := newTracker(t, cfg, w)
		for step := 0; step < 40; step++ {
			if step%2 == 0 {
				key, p, _ := w.podEvent()
				if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
					if _, _, err := tr.Rebuild(w.input()); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			prev := tr.Ruleset()
			before := elementsBySet(prev)
			chains := slices.Clone(prev.ChainOrder)
			name, ns, what := w.namespaceEvent()
			if f := tr.ApplyNamespace(name, ns); f != compile.NoFallback {
				if _, _, err := tr.Rebuild(w.input()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if !maps.Equal(before, elementsBySet(prev)) || !slices.Equal(chains, prev.ChainOrder) {
				t.Fatalf("seed %d step %d (%s %s): the previous ruleset changed", seed, step, what, name)
			}
			if !maps.Equal(before, elementsBySet(tr.Ruleset())) {
				moved++
			}
		}
	}
	if moved == 0 {
		t.Error("no namespace change moved an element")
	}
	t.Logf("%d namespace changes moved elements", moved)
}
