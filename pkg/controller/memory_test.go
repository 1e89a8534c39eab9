package controller

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestMemoryReleaser: calls of Soon in a burst release once, after the
// burst; a later call releases again.
func TestMemoryReleaser(t *testing.T) {
	const delay = 300 * time.Millisecond
	var calls atomic.Int32
	r := &MemoryReleaser{delay: delay, free: func() { calls.Add(1) }}
	waitCalls := func(want int32) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); calls.Load() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d releases after 10s, want %d", calls.Load(), want)
			}
		}
		// Nothing more is scheduled: no further release comes.
		time.Sleep(2 * delay)
		if n := calls.Load(); n != want {
			t.Fatalf("%d releases, want %d", n, want)
		}
	}
	for range 5 {
		r.Soon()
	}
	waitCalls(1)
	r.Soon()
	waitCalls(2)
}
