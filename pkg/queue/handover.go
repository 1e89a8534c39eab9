package queue

import (
	"context"
	"time"
)

// Handing the queues from one agent to the next (an update with both
// running side by side): the new agent listens on the other range of queue
// numbers (AlternateRange), its first sync points the queue rule at its
// range, and the old agent, told to stop, points the rule there too in case
// a sync of its own pointed it back, then drains its queues before closing
// them: closing a queue socket drops what is still queued. See
// cmd/nftpolicy's agent_queue.go.

// AlternateRange returns the first queue of the range an agent uses while
// another agent listens on first..first+n-1: the n queues right after.
func AlternateRange(first, n uint16) uint16 { return first + n }

// BoundQueues counts the queues of first..first+n-1 that have a listener in
// stats (ReadKernelQueueStats).
func BoundQueues(stats []QueueStats, first, n uint16) int {
	c := 0
	for _, s := range stats {
		if s.QueueNum >= first && uint32(s.QueueNum) < uint32(first)+uint32(n) {
			c++
		}
	}
	return c
}

// Drain returns once the Runtime has read no packet for quiet and owes no
// deferred verdict, or when ctx ends (it returns ctx's error then). Call it
// after the queue rule stopped sending packets here, before stopping Run.
func (r *Runtime) Drain(ctx context.Context, quiet time.Duration) error {
	tick := time.NewTicker(quiet / 4)
	defer tick.Stop()
	last, since := r.c.received.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			if n := r.c.received.Load(); n != last {
				last, since = n, now
				continue
			}
			if now.Sub(since) >= quiet && r.c.deferredPending.Load() == 0 {
				return nil
			}
		}
	}
}
