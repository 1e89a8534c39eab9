package compile_test

import (
	"fmt"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
)

// TestAdoptedProgramDerivesAsBuilt checks the program refresh built off the
// tracker: after random policy changes (which leave the program Stale and
// number new selectors the tracker's way) the tracker adopts a program
// built from scratch from the same objects, then follows random pod
// changes; the program it derives after every step equals a full build of
// the objects, in hybrid and kernel mode (queue mode applies no policy
// change: a full build).
func TestAdoptedProgramDerivesAsBuilt(t *testing.T) {
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel} {
		t.Run(string(mode), func(t *testing.T) { testAdoptedProgramDerivesAsBuilt(t, compile.RenderConfig{Mode: mode}) })
	}
}

func testAdoptedProgramDerivesAsBuilt(t *testing.T, cfg compile.RenderConfig) {
	adopted, compared := 0, 0
	for seed := uint64(1); seed <= 20; seed++ {
		w := newWorld(seed, scenariogen.Nodes[int(seed)%len(scenariogen.Nodes)])
		tr, _ := newTracker(t, cfg, w)
		step := 0
		where := func() string { return fmt.Sprintf("seed %d step %d", seed, step) }
		for round := 0; round < 6; round++ {
			// Policy changes, and pod changes while the program is stale.
			for i := 0; i < 4; i++ {
				step++
				key, np, _ := w.policyEvent()
				if tr.ApplyPolicy(key, np) != compile.NoFallback {
					rebuild(t, tr, w)
				}
				if i%2 == 1 {
					step++
					key, p, _ := w.podEvent()
					if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
						rebuild(t, tr, w)
					}
				}
			}
			if !tr.Stale() {
				continue
			}
			base := compile.BuildBase(w.input())
			tr.Adopt(base)
			adopted++
			if tr.Stale() || tr.Program() != base.Program() {
				t.Fatalf("%s: the tracker did not adopt the built program", where())
			}
			checkProgram(t, tr, compile.Build(w.input()), where)
			for i := 0; i < 12; i++ {
				step++
				key, p, _ := w.podEvent()
				if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
					rebuild(t, tr, w)
				}
				if checkProgram(t, tr, compile.Build(w.input()), where) {
					compared++
				}
			}
		}
	}
	if adopted < 40 || compared < 300 {
		t.Fatalf("only %d adoptions and %d derived programs compared", adopted, compared)
	}
}

// rebuild rebuilds the tracker after a fallback.
func rebuild(t *testing.T, tr *compile.Tracker, w *world) {
	t.Helper()
	if _, _, err := tr.Rebuild(w.input()); err != nil {
		t.Fatal(err)
	}
}

// TestGenerationMovesWithTheState checks what the off-loop refresh relies
// on: the tracker's generation moves with every applied change that
// changes the program (a pod change, a policy change that leaves the
// program stale, a rebuild), and with a policy edit (a new
// resourceVersion) exactly when it leaves the program stale: an edit that
// compiles to what it was (a policy rejected before and after, edited in
// a loop) does not discard the refresh under way.
func TestGenerationMovesWithTheState(t *testing.T) {
	unchanged := 0
	for seed := uint64(1); seed <= 10; seed++ {
		w := newWorld(seed, scenariogen.Nodes[0])
		for i := range w.in.Policies {
			tr, _ := newTracker(t, compile.RenderConfig{Mode: compile.ModeHybrid}, w)
			g := tr.Generation()
			same := w.in.Policies[i].DeepCopy()
			same.ResourceVersion += "1"
			if tr.ApplyPolicy(same.Namespace+"/"+same.Name, same) != compile.NoFallback {
				continue
			}
			if moved := tr.Generation() != g; moved != tr.Stale() {
				t.Fatalf("seed %d policy %d: a new resourceVersion moved the generation: %v, left the program stale: %v", seed, i, moved, tr.Stale())
			}
			if !tr.Stale() {
				unchanged++
			}
			g = tr.Generation()
			key, p, _ := w.podEvent()
			if _, f := tr.ApplyPod(key, p); f == compile.NoFallback && tr.Generation() == g {
				t.Fatalf("seed %d: an applied pod change did not move the generation", seed)
			}
			g = tr.Generation()
			rebuild(t, tr, w)
			if tr.Generation() == g {
				t.Fatalf("seed %d: a rebuild did not move the generation", seed)
			}
		}
	}
	t.Logf("%d edits compiled to what they were", unchanged)
}
