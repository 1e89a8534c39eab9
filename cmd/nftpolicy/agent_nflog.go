package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
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

// nflogReaders are the agent's NFLOG readers (pkg/nflogread: one per
// group) and, by group, what stops when a group's reader stops.
type nflogReaders struct {
	*nflogread.Readers
	stopped map[uint16][]string
}

func newNFLOGReaders(ctx context.Context) *nflogReaders {
	return &nflogReaders{Readers: nflogread.New(klog.FromContext(ctx).WithName("nflog"), 0), stopped: map[uint16][]string{}}
}

// add makes c a consumer of its group; stopped says what is no longer
// done when the group's reader stops.
func (r *nflogReaders) add(c nflogread.Consumer, stopped string) {
	r.Add(c)
	r.stopped[c.Group] = append(r.stopped[c.Group], stopped)
}

// run runs the reader of each group until ctx ends. The readers are
// diagnostics: when one stops, enforcement goes on, and its error is
// logged with what is no longer done.
func (r *nflogReaders) run(ctx context.Context) {
	for _, g := range r.Groups() {
		go func() {
			if err := wrapErr(fmt.Sprintf("NFLOG group %d", g), r.Run(ctx, g)); err != nil {
				klog.FromContext(ctx).Error(err, "NFLOG reader stopped", "group", g, "noLongerDone", strings.Join(r.stopped[g], "; "))
			}
		}()
	}
}
