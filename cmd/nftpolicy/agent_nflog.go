package main

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// nflogLogOptions are the flags of a log the agent reads from an NFLOG
// group and writes as lines: the deny log and the staged log.
type nflogLogOptions struct {
	enabled      bool
	group        uint16
	kernelRate   uint32
	totalRate    uint32
	flowInterval time.Duration
	linesPerSec  int
}

// kernelLimits returns the kernel's per-source and overall limits, each
// with a burst of twice its rate.
func (o *nflogLogOptions) kernelLimits() (rate, burst, total, totalBurst uint32) {
	return o.kernelRate, 2 * o.kernelRate, o.totalRate, 2 * o.totalRate
}

// runReader runs one of the agent's NFLOG readers until ctx ends. The
// readers are diagnostics: when one stops, enforcement goes on, and its
// error is logged with msg (which says what is no longer done).
func runReader(ctx context.Context, what, msg string, run func(context.Context) error) {
	go func() {
		if err := wrapErr(what, run(ctx)); err != nil {
			klog.FromContext(ctx).Error(err, msg)
		}
	}()
}
