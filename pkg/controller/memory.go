package controller

import (
	"runtime/debug"
	"sync"
	"time"
)

// DefaultMemoryReleaseDelay is how long after the last burst of allocation
// (a full build, a program snapshot) its freed memory is returned to the
// OS.
const DefaultMemoryReleaseDelay = 2 * time.Second

// MemoryReleaser returns the memory that bursts of allocation freed to the
// OS, once the bursts pause for its delay: debug.FreeOSMemory, a
// collection and then every free page handed back. A full build allocates
// a program, an index and a ruleset as large as the ones it replaces; the
// garbage collector would keep those pages for reuse (the first list of a
// large cluster's pods, decoded whole before the transform, leaves even
// more), so the agent's resident memory would stay at its peak. The forced
// collection costs about what one of the build's own collections costs.
//
// Every source of such bursts must call Soon: garbage made after the
// release stays resident until the next collection (at twice the live
// heap), which on an idle agent can be long. The program snapshot,
// written in the background after each publication, is one: cmd/nftpolicy
// wires its AfterWrite here.
type MemoryReleaser struct {
	delay time.Duration
	free  func()

	mu    sync.Mutex
	timer *time.Timer
}

// NewMemoryReleaser returns a releaser with the given delay.
func NewMemoryReleaser(delay time.Duration) *MemoryReleaser {
	return &MemoryReleaser{delay: delay, free: debug.FreeOSMemory}
}

// Soon schedules the release delay from now, replacing any scheduled one.
// It does not block.
func (r *MemoryReleaser) Soon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer == nil {
		r.timer = time.AfterFunc(r.delay, r.free)
		return
	}
	r.timer.Reset(r.delay)
}
