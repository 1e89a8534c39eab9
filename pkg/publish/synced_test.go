package publish

import (
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftpolicy/nftpolicy/pkg/podstore"
)

// TestTermCurrent: the slices are current only once the first reconcile
// is written, and then while no change or write has waited longer than
// MaxBacklog.
func TestTermCurrent(t *testing.T) {
	cfg := Config{MaxBacklog: 10 * time.Second}
	tm := &term{p: &Publisher{cfg: cfg}, pods: podstore.New(podstore.Source{}, nil, logr.Discard()), owed: map[string]time.Time{}}
	now := time.Now()
	if tm.current(now) {
		t.Error("current before the first reconcile is written")
	}
	tm.reconciled = true
	if !tm.current(now) {
		t.Error("not current with nothing owed")
	}
	tm.owed["a/s"] = now.Add(-time.Second)
	if !tm.current(now) {
		t.Error("not current with a write owed for 1s (max backlog 10s)")
	}
	tm.owed["a/t"] = now.Add(-11 * time.Second)
	if tm.current(now) {
		t.Error("current with a write owed for 11s (max backlog 10s)")
	}
	delete(tm.owed, "a/t")
	tm.first = now.Add(-11 * time.Second)
	if tm.current(now) {
		t.Error("current with a pod change not flushed for 11s")
	}
}
