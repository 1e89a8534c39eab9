package main

import (
	"testing"
	"time"

	"k8s.io/klog/v2"
)

type fakeResyncer struct {
	writing  bool
	requests int
}

func (f *fakeResyncer) WroteWithin(time.Duration) bool { return f.writing }
func (f *fakeResyncer) RequestFullSync(string)         { f.requests++ }

// TestLostNotifications: notifications lost while the agent does not
// write make a full sync each time; lost while it writes (its own full
// sync overran the socket), at most one a minute, so that the full sync
// an overrun causes cannot cause the next.
func TestLostNotifications(t *testing.T) {
	f := &fakeResyncer{}
	l := &lostNotifications{ctrl: f, log: klog.Background()}
	l.lost("x")
	l.lost("x")
	if f.requests != 2 {
		t.Fatalf("%d full syncs for 2 overruns outside the agent's writes, want 2", f.requests)
	}
	f.writing = true
	for range 5 {
		l.lost("x")
	}
	if f.requests != 3 {
		t.Fatalf("%d full syncs after 5 overruns during the agent's writes, want 1 more (3)", f.requests)
	}
	l.last = time.Now().Add(-ownOverrunResync)
	l.lost("x")
	if f.requests != 4 {
		t.Fatalf("%d full syncs: none a minute later", f.requests)
	}
}
