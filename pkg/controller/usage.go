package controller

import (
	"runtime/metrics"
	"syscall"
	"time"
)

// processUsage is what the agent's process has consumed so far: CPU time
// (every thread, user and system; the nft processes it ran apart), minor
// page faults (a fresh heap page costs one: the kernel zeroes it) and
// completed GC cycles. The first
// sync's log line reports the difference over the sync, so a slow first
// sync tells whether the agent computed (CPU close to the duration), waited
// for a CPU (CPU well below it: other processes on the node), or grew its
// heap (page faults, GC cycles).
type processUsage struct {
	cpu         time.Duration
	childCPU    time.Duration // the nft processes the agent started and reaped
	minorFaults int64
	gcCycles    uint64
}

var gcCyclesSample = []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}

// readProcessUsage returns the zero value for what it cannot read.
func readProcessUsage() processUsage {
	var u processUsage
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		u.minorFaults = ru.Minflt
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		u.childCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s := gcCyclesSample[:1:1]
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		u.gcCycles = s[0].Value.Uint64()
	}
	return u
}

// since is the usage between then and u.
func (u processUsage) since(then processUsage) processUsage {
	return processUsage{cpu: u.cpu - then.cpu, childCPU: u.childCPU - then.childCPU, minorFaults: u.minorFaults - then.minorFaults, gcCycles: u.gcCycles - then.gcCycles}
}
