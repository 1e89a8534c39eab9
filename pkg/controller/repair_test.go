package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

// deleteTable deletes the fake's table behind the controller's back, as
// `nft flush ruleset` does.
func (f *flakyNFT) deleteTable(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Fake.Run(context.Background(), tx); err != nil && !knftables.IsNotFound(err) {
		t.Fatal(err)
	}
}

// TestOutsideChangeIsRepaired: an outside change reported by the table's
// watch is counted by kind, named in a Warning Event on the node, makes
// readiness false until a full sync repaired it (here the repair's
// transactions fail for a while: readiness stays false meanwhile), and
// the repair puts the table back.
func TestOutsideChangeIsRepaired(t *testing.T) {
	h := start(t, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", func() bool { return h.ctrl.Ready() && strings.Contains(h.nft.dump(), "ingress-isolated-") })
	h.nft.failNext(1 << 30)
	h.nft.deleteTable(t)
	h.ctrl.OutsideChange(map[string]int{"table": 1, "chain": 3}, "delete table, by nft (pid 42)")
	if h.ctrl.Ready() {
		t.Fatal("ready right after an outside change")
	}
	h.expectEvent(t, "Warning", OutsideChangedReason, "delete table, by nft (pid 42)")
	eventually(t, "failed repairs", func() bool { return h.nft.failures() >= 2 })
	if h.ctrl.Ready() {
		t.Fatal("ready while the repair fails")
	}
	h.nft.failNext(0)
	eventually(t, "the table repaired", func() bool { return h.ctrl.Ready() && strings.Contains(h.nft.dump(), "ingress-isolated-") })
	for kind, want := range map[string]float64{"table": 1, "chain": 3, "element": 0} {
		if got := counterValue(t, h.ctrl.cfg.Metrics.OutsideChanges.WithLabelValues(kind)); got != want {
			t.Errorf("nftpolicy_outside_changes_total{kind=%q} %v, want %v", kind, got, want)
		}
	}
}

// TestOutsideChangeFloodIsRateLimited: a flood of outside changes (a loop
// of `nft flush ruleset`) makes at most RepairBurst repairs at once and
// RepairRate a second after, and the table is back and the agent ready
// when it ends. Lost notifications (RequestFullSync) are repaired the same
// way, uncounted.
func TestOutsideChangeFloodIsRateLimited(t *testing.T) {
	// No recorder: the fake one blocks when its buffer is full, the real
	// one drops.
	h := startWith(t, func(c *Config) { c.Recorder = nil }, testPod("x", "a", "n1", "10.0.1.1", nil), denyAll("x"))
	eventually(t, "first sync", func() bool { return h.ctrl.Ready() && strings.Contains(h.nft.dump(), "ingress-isolated-") })
	runs := func() int {
		h.nft.mu.Lock()
		defer h.nft.mu.Unlock()
		return h.nft.runs
	}
	before := runs()
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		h.nft.deleteTable(t)
		h.ctrl.OutsideChange(map[string]int{"table": 1}, "delete table")
		time.Sleep(time.Millisecond)
	}
	flood := time.Since(start)
	eventually(t, "the table repaired after the flood", func() bool {
		return h.ctrl.Ready() && strings.Contains(h.nft.dump(), "ingress-isolated-")
	})
	// Each repair is one full sync, one transaction with the fake.
	repairs := runs() - before
	limit := RepairBurst + int(RepairRate*time.Since(start).Seconds()) + 2
	if repairs < 1 || repairs > limit {
		t.Errorf("%d repairs for a flood of %v: want between 1 and %d", repairs, flood, limit)
	}
	t.Logf("%d repairs for a flood of %v", repairs, flood.Round(time.Millisecond))

	h.nft.deleteTable(t)
	h.ctrl.RequestFullSync("notifications lost")
	eventually(t, "a full sync after lost notifications", func() bool {
		return h.ctrl.Ready() && strings.Contains(h.nft.dump(), "ingress-isolated-")
	})
	if got := counterValue(t, h.ctrl.cfg.Metrics.OutsideChanges.WithLabelValues("table")); got < 2 {
		t.Errorf("outside changes %v", got)
	}
}
