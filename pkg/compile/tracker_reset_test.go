package compile_test

import (
	"runtime"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestTrackerResetReleases: after Reset nothing holds what the tracker
// built its last ruleset with (its builder and renderer, with their
// indexes of every pod), although the program and the ruleset it returned
// are still in use: a rebuild after it does not hold two trackers' worth.
// The tracker then has no ruleset, so that its caller rebuilds.
func TestTrackerResetReleases(t *testing.T) {
	in := compiletest.Cluster(400, 40, 4)
	in.NodeName = in.Pods[0].Spec.NodeName
	tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat})
	if err != nil {
		t.Fatal(err)
	}
	prog, rs, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	b, r := compile.TrackerBuildState(tr)
	if b.Value() == nil || r.Value() == nil {
		t.Fatal("the tracker holds no builder or renderer after a Rebuild")
	}
	tr.Reset()
	runtime.GC()
	if b.Value() != nil || r.Value() != nil {
		t.Errorf("after Reset, the last build's builder (%v) or renderer (%v) is still reachable", b.Value() != nil, r.Value() != nil)
	}
	if tr.Ruleset() != nil {
		t.Error("after Reset, the tracker still has a ruleset")
	}
	runtime.KeepAlive(prog)
	runtime.KeepAlive(rs)
	if _, _, err := tr.Rebuild(in); err != nil || tr.Ruleset() == nil {
		t.Fatalf("Rebuild after Reset: %v", err)
	}
}
