package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// stateOptions are the flags of the agent's state on the node.
type stateOptions struct {
	dir string
	// afterWrite is called after each snapshot write (the agent's
	// memory releaser).
	afterWrite func()
}

// restore attaches the snapshots to eval and reads the last one in the
// background, while the agent goes on to open its API watches (a snapshot
// of 150,000 pods takes about half a second to read); its program is
// published (Evaluator.Restore) once read, unless the first sync was
// faster. Until a program is published the queues are held (releaseHold),
// so queued packets wait instead of being dropped. read is closed once the
// snapshot was read, used or not (at once without --state-dir). Only an
// unusable state directory is an error; a missing or unusable snapshot
// means starting without a program, as without --state-dir.
func (o *stateOptions) restore(ctx context.Context, eval *evaluate.Evaluator, node string, reg prometheus.Registerer) (read <-chan struct{}, err error) {
	done := make(chan struct{})
	if o.dir == "" {
		close(done)
		return done, nil
	}
	log := klog.FromContext(ctx).WithName("state")
	snaps, err := evaluate.NewSnapshots(o.dir, node, log)
	if err != nil {
		close(done)
		return done, fmt.Errorf("--state-dir %s: %w", o.dir, err)
	}
	// Attached first: the first sync's program is saved even when it is
	// published before the snapshot is read.
	eval.Snapshots = snaps
	snaps.AfterWrite = o.afterWrite
	go snaps.Run(ctx)
	refused := registerSnapshotMetrics(reg, snaps.Stats)
	go func() {
		defer close(done)
		loadSnapshot(log, eval, snaps, refused)
	}()
	return done, nil
}

// loadSnapshot reads the snapshot and publishes its program unless a sync
// published one first (then the snapshot is older and is dropped). A
// snapshot the first sync's publication removes while it is read is
// either read whole or not found: both are safe, a program published
// meanwhile wins.
func loadSnapshot(log klog.Logger, eval *evaluate.Evaluator, snaps *evaluate.Snapshots, refused *prometheus.CounterVec) {
	start := time.Now()
	prog, written, err := snaps.Load()
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.Info("No program snapshot; queued connections wait for the first sync", "path", snaps.Path())
	case errors.Is(err, evaluate.ErrUnknownSnapshotFormat):
		// An upgrade or a rollback across a format change: the kernel's
		// table goes on enforcing; only the queue waits for the first sync.
		refused.WithLabelValues("unknown_format").Inc()
		log.Error(err, "Refusing the program snapshot: another agent version wrote it in a format this one does not read; the kernel's table stays in force and queued connections wait for the first sync")
	case err != nil:
		refused.WithLabelValues("unusable").Inc()
		log.Error(err, "Ignoring the program snapshot; queued connections wait for the first sync")
	case eval.Restore(prog):
		log.Info("Deciding from the program snapshot until the first sync", "path", snaps.Path(), "age", time.Since(written).Round(time.Millisecond),
			"pods", len(prog.Pods), "policies", len(prog.Policies), "clusterPolicies", len(prog.ClusterPolicies), "loadDuration", time.Since(start).Round(time.Microsecond))
	default:
		log.Info("Program snapshot read after the first sync; not used", "path", snaps.Path(), "loadDuration", time.Since(start).Round(time.Microsecond))
	}
}

// registerSnapshotMetrics registers the metrics of the program snapshots
// (stats reads the writer's counts) and returns the counter of snapshots
// refused at start, both reasons present from the start.
func registerSnapshotMetrics(reg prometheus.Registerer, stats func() evaluate.SnapshotStats) *prometheus.CounterVec {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftpolicy_state_snapshot_refused_total",
		Help: "Program snapshots found at start and not used, by reason: unknown_format (written by an agent of another version, whose format this one does not read) or unusable (damaged, another node's); the agent then holds queued connections until its first sync.",
	}, []string{"reason"})
	refused.WithLabelValues("unknown_format")
	refused.WithLabelValues("unusable")
	reg.MustRegister(refused)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "nftpolicy_state_snapshot_writes_total",
		Help: "Snapshots of the policy program written to --state-dir (a restarted agent decides from the last one until its first sync).",
	}, func() float64 { return float64(stats().Saved) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "nftpolicy_state_snapshot_errors_total",
		Help: "Snapshots of the policy program that could not be written or removed; a restarted agent then drops queued connections until its first sync.",
	}, func() float64 { return float64(stats().Failed) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nftpolicy_state_snapshot_bytes",
		Help: "Size of the last program snapshot written to --state-dir, in bytes.",
	}, func() float64 { return float64(stats().LastBytes) }))
	return refused
}
