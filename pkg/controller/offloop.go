package controller

import (
	"context"
	"runtime/debug"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The program refresh after policy changes, built off the sync loop. A
// policy change reaches the kernel through the tracker at once and leaves
// the program behind it (compile.Tracker.Stale); the refresh brings the
// program up. Built on the loop, it is a full build, which every change
// of every namespace arriving meanwhile would wait for. Instead the loop,
// when no change is pending (every change noted was applied), takes the
// inputs snapshot (the informers' objects are immutable) and the tracker's
// generation (compile.Tracker.Generation: applied pod changes, policy
// changes that change the program, rebuilds), and a goroutine builds the
// program (compile.BuildBase: nothing is rendered, nothing of the tracker
// read). When the result comes back, the changes noted meanwhile applied
// first, and the generation did not move, nothing was applied since the
// snapshot: the program is the one a rebuild would make of the kernel's
// state, and the tracker adopts it (compile.Tracker.Adopt) and the loop
// publishes it. Otherwise it is another state's program: it is discarded
// and built again; after maxOffloopDiscards in a row (steady churn) the
// refresh is the full build on the loop again, so that the program's lag
// stays bounded. One off-loop build runs at a time. The consistency check
// after pod changes (unchecked) stays a full build on the loop: it
// compares the tracked ruleset, which only a render does.
//
// What it assumes: an object in the informer's store when the snapshot
// is taken has been noted (its handler ran) by the time the build comes
// back, tens of milliseconds later; a change noted late would otherwise
// be in the published program before its commit, until it is applied.

// maxOffloopDiscards is how many off-loop refresh builds in a row may be
// overtaken by changes before the refresh builds on the loop.
const maxOffloopDiscards = 3

// offloopResult is what an off-loop refresh build hands back to the loop.
type offloopResult struct {
	// gen is the change generation of its snapshot.
	gen  uint64
	base *compile.ProgramBase
	took time.Duration
}

// refreshFired starts the program refresh. Incremental changes pending
// when it fires go first, once (a full build takes as long as the cluster
// is large, and they would wait for all of it), or as long as the refresh
// can be built off the loop, which needs a snapshot of the state the
// tracker applied: each time counts as a discard. It reports whether the
// loop syncs now (the pending changes, or the full build).
func (c *Controller) refreshFired() bool {
	c.refreshDue = time.Time{}
	c.mu.Lock()
	pending := len(c.policyKeys) > 0 || len(c.podKeys) > 0
	offloop := c.tracker.Stale() && !c.rebuild && c.offloopDiscards < maxOffloopDiscards
	if !c.rebuild && pending && (!c.refreshYielded || offloop) {
		if c.refreshYielded {
			c.offloopDiscards++
			c.cfg.Metrics.RefreshDiscards.Inc()
		}
		c.refreshYielded = true
		c.refreshDue = time.Now()
		c.refresh.Reset(0)
		c.mu.Unlock()
		return true
	}
	c.refreshYielded = false
	if !c.tracker.Stale() && !c.unchecked {
		// Armed for a program that an off-loop build brought up since.
		c.mu.Unlock()
		return false
	}
	if !offloop {
		c.rebuild = true
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	if c.offloopBusy {
		// The build under way reports; changes since it started discard
		// it and start the next.
		return false
	}
	in, err := c.snapshot()
	if err != nil {
		c.cfg.Logger.WithName("sync").Error(err, "Taking the inputs for the program refresh; rebuilding on the loop")
		c.mu.Lock()
		c.rebuild = true
		c.mu.Unlock()
		return true
	}
	c.offloopBusy = true
	go c.buildOffloop(in, c.tracker.Generation())
	return false
}

// buildOffloop builds the program of in and hands it to the loop. A full
// build's allocations are mostly kept (the program): it runs at the full
// build's GOGC, as syncAll does.
func (c *Controller) buildOffloop(in compile.Input, gen uint64) {
	if c.offloopBuilding != nil {
		c.offloopBuilding()
	}
	start := time.Now()
	debug.SetGCPercent(fullBuildGCPercent)
	base := compile.BuildBase(in)
	debug.SetGCPercent(c.gcPercent)
	c.offloopDone <- offloopResult{gen: gen, base: base, took: time.Since(start)}
}

// offloopFinished receives an off-loop refresh build: adopted and
// published when no change was applied since its snapshot, discarded and
// started again otherwise (or, after maxOffloopDiscards, left to a full
// build on the loop); judged after the changes pending now. It reports
// whether the loop syncs now.
func (c *Controller) offloopFinished(ctx context.Context, r offloopResult) bool {
	c.offloopBusy = false
	log := c.cfg.Logger.WithName("sync")
	if !c.tracker.Stale() {
		// A full build published the current program meanwhile.
		c.offloopDiscards = 0
		return false
	}
	c.mu.Lock()
	rebuild, pending := c.rebuild, len(c.policyKeys) > 0 || len(c.podKeys) > 0
	c.mu.Unlock()
	if pending && !rebuild {
		// Changes noted may be in the snapshot and not applied yet: they
		// go first, and the result is judged after them.
		c.offloopBusy = true
		c.offloopDone <- r // never blocks: the build that used it is over
		return true
	}
	if rebuild || r.gen != c.tracker.Generation() {
		c.offloopDiscards++
		c.cfg.Metrics.RefreshDiscards.Inc()
		log.V(2).Info("Program refresh built off the loop is out of date; discarded", "discards", c.offloopDiscards, "build", r.took)
		if c.offloopDiscards >= maxOffloopDiscards {
			c.mu.Lock()
			c.rebuild = true
			c.mu.Unlock()
			return true
		}
		c.refreshDue = time.Now()
		c.refresh.Reset(0)
		return false
	}
	c.offloopDiscards = 0
	c.tracker.Adopt(r.base)
	prog := r.base.Program()
	// Policy changes were applied without the full build that checks
	// the tracked ruleset: the consistency check follows.
	c.unchecked = true
	// A refresh armed by a change made during the build that did not
	// move the program (an edit that compiles to what it was) is not
	// needed any more: disarmed, and armed again for the check.
	c.refreshDone()
	c.publish(prog)
	c.recordProgrammedPods(prog)
	c.reportProblems(ctx, prog)
	c.publishStatus(statusTake{}, false, time.Now())
	c.scheduleRefresh()
	c.cfg.MemoryReleaser.Soon()
	log.V(2).Info("Published the program refresh built off the loop", "build", r.took)
	return false
}
