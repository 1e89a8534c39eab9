package bench

import (
	"slices"
	"testing"
)

// TestFirstSyncValues: the values are read from the last "First sync
// committed" line of an agent log (each start appends one), durations in
// milliseconds and counts as they are; a line without one of the keys
// gives none.
func TestFirstSyncValues(t *testing.T) {
	log := `I1201 15:54:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="128.1ms" build="1.5s" apply="20ms" kernelRead="0s" elementsUnchanged=0 cpu="3s" nftCPU="1s" pageFaults=7 gcCycles=1
I1201 15:54:36.000000       1 controller.go:572] "Synced" logger="agent.sync" kind="full"
I1201 15:55:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="1.2s" build="244.5ms" apply="900µs" kernelRead="448ms" elementsUnchanged=12 cpu="1.1s" nftCPU="95ms" pageFaults=36912 gcCycles=3
I1201 15:55:36.000000       1 controller.go:572] "Synced pod changes" logger="agent.sync"`
	for _, c := range []struct {
		keys []string
		want []float64
	}{
		{[]string{"build", "apply", "kernelRead"}, []float64{244.5, 0.9, 448}},
		{[]string{"cpu", "nftCPU", "pageFaults", "gcCycles"}, []float64{1100, 95, 36912, 3}},
	} {
		got, ok := firstSyncValues(log, c.keys...)
		if !ok || !slices.Equal(got, c.want) {
			t.Errorf("firstSyncValues(%v) = %v, %v; want %v", c.keys, got, ok, c.want)
		}
	}
	if _, ok := firstSyncValues(`I1201 15:54:35.376468 1 controller.go:572] "First sync committed" policies=2 duration="1s"`, "build"); ok {
		t.Error("a line without the key gave a value")
	}
	if _, ok := firstSyncValues(`I1201 15:54:35.376468 1 controller.go:572] "Synced" build="1s"`, "build"); ok {
		t.Error("a line other than the first sync's gave a value")
	}
}
