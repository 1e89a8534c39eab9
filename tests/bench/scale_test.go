package bench

import "testing"

// TestFirstSyncSplit: the split is read from the last "First sync
// committed" line of an agent log (each start appends one), in
// milliseconds; a line without it is no split.
func TestFirstSyncSplit(t *testing.T) {
	log := `I1201 15:54:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="128.1ms" build="1.5s" apply="20ms" kernelRead="0s" elementsUnchanged=0
I1201 15:54:36.000000       1 controller.go:572] "Synced" logger="agent.sync" kind="full"
I1201 15:55:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="1.2s" build="244.5ms" apply="900µs" kernelRead="448ms" elementsUnchanged=12
I1201 15:55:36.000000       1 controller.go:572] "Synced pod changes" logger="agent.sync"`
	split, ok := firstSyncSplit(log)
	if want := [3]float64{244.5, 0.9, 448}; !ok || split != want {
		t.Errorf("firstSyncSplit = %v, %v; want %v", split, ok, want)
	}
	if _, ok := firstSyncSplit(`I1201 15:54:35.376468 1 controller.go:572] "First sync committed" policies=2 duration="1s"`); ok {
		t.Error("a line without the split gave one")
	}
}
