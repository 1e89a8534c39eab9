package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
)

// queuesPerCPU is the --queues value that means one queue per CPU.
const queuesPerCPU = 0

// Bounds of the hand-over of the queues to a successor at shutdown.
const (
	drainQuiet   = 100 * time.Millisecond // no packet for this long: drained
	drainTimeout = 3 * time.Second
	// successorWait bounds the wait for a successor's queues (see
	// waitForSuccessor), counted from the first hand-over of the shutdown
	// (connection and DNS queues share it): without a successor, the
	// agent's exit is delayed by that much. The old agent answers its own
	// queues meanwhile.
	successorWait = 2 * time.Second
	// successorSyncWait bounds, from the same start, the wait for the
	// successor's first sync (waitForQueueRule); with the drain it stays
	// within install.yaml's 10 s grace period.
	successorSyncWait = 5 * time.Second
)

// handOverStart is when the shutdown's first hand-over began.
var handOverStart = sync.OnceValue(time.Now)

// queueCount resolves --queues: one queue per CPU by default (the rule
// fans out by CPU, and each queue has a reader thread of its own).
func queueCount(flag uint16) uint16 {
	if flag != queuesPerCPU {
		return flag
	}
	return uint16(min(runtime.NumCPU(), 64))
}

// startQueue restores the program snapshot (--state-dir) into eval and, in
// queue mode, binds the queues (first: from then on the kernel holds the
// queued packets) and starts answering them once it has a program: the
// snapshot's, or else the first sync's (releaseHold).
// It runs before the slower start-up steps (the API clients, the queue
// variant probe, the nftables clients, the informers): after a restart the
// kernel's table is still in place and queueing, and every millisecond
// before the queues are bound is a millisecond of dropped (or, with
// --fail-open, unchecked) connections.
//
// An agent owns two ranges of queue numbers, --queue-num.. and the one
// after it (queue.AlternateRange). It listens on the first unless another
// agent does (an update with maxSurge: the old agent still runs), or unless
// nobody does and the queue rule points at the second (the previous agent
// used it and was killed). It sets render.QueueNum to the range it took, so
// that its first sync points the queue rule there.
//
// stop, called when the agent exits, hands the queued traffic over to a
// successor listening on the other range (points the queue rule at it and
// drains its own queues) and then closes the queues. done is true when the
// agent must return at once (ctx ended, or err).
func (o *agentOptions) startQueue(ctx context.Context, render *compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer, metrics *controller.Metrics, errs chan error) (stop func(), done bool, err error) {
	log := klog.FromContext(ctx)
	stop = func() {}
	if !render.UsesQueue() {
		_, err := o.state.restore(ctx, eval, node, reg)
		return stop, false, err
	}
	base := render.QueueNum
	first, err := chooseQueueRange(log, base, render.Queues, compile.ChainQueue)
	if err != nil {
		return stop, true, err
	}
	render.QueueNum = first
	withDefaults := *render
	withDefaults.Defaults() // the allow mark's default
	// The queues are bound first and read once the snapshot is loaded:
	// meanwhile the kernel holds the queued packets instead of dropping
	// them, so loading a large snapshot delays connections, fails none.
	hold := make(chan struct{})
	rt, err := queue.NewRuntime(queue.RuntimeConfig{
		QueueNum: first, Queues: render.Queues, FailOpen: o.failOpen, MaxQueueLen: o.maxQueueLen, MaxHeldPerSource: o.newPod.maxHeldPerSource(),
		AllowMark: withDefaults.AllowMark, Logger: log.WithName("queue"), Observer: metrics, Hold: hold,
	}.Defaults(), queue.Evaluating(eval))
	if err != nil {
		return stop, true, err
	}
	reg.MustRegister(controller.NewQueueStatsCollector(metrics, log.WithName("metrics")))
	stop = runUntilHandedOver(ctx, rt, "queue runtime", errs, &o.uninstall.removed, func() {
		other := base // the agent's two ranges: base.. and the alternate one
		if render.QueueNum == base {
			other = queue.AlternateRange(base, render.Queues)
		}
		succ := *render
		succ.QueueNum = other
		handOver(log, rt, render.QueueVariant, compile.ChainQueue, render.QueueNum, queuerule.CompatRuleConfig(succ, compile.ChainQueue))
	})
	select {
	case <-rt.Ready():
		read, err := o.state.restore(ctx, eval, node, reg)
		if err != nil {
			close(hold)
			return stop, true, err
		}
		releaseHold(ctx, eval, hold, o.failOpen, read)
		log.Info("Listening on NFQUEUE", "queues", compile.QueueRange(first, render.Queues))
		return stop, false, nil
	case err := <-errs:
		return stop, true, err
	case <-ctx.Done():
		return stop, true, nil
	}
}

// releaseHold lets the queues be read (closes hold) once eval has a
// program: at once when the snapshot gave one, else when the first sync
// publishes it, so that until then the kernel keeps the queued packets (up
// to --max-queue-len) instead of this agent dropping them for want of a
// program. That matters in an update: a successor that found no snapshot
// is sent packets as soon as its first sync's transaction points the queue
// rule here, before that sync publishes its program. With --fail-open no
// program means accept: the queues are read once the snapshot was read
// (snapshotRead), so that a restarted agent decides from it instead of
// accepting unchecked while it is read. Polled: it only runs until the
// first sync, and a few milliseconds more of holding cost nothing.
func releaseHold(ctx context.Context, eval *evaluate.Evaluator, hold chan struct{}, failOpen bool, snapshotRead <-chan struct{}) {
	if failOpen {
		go func() {
			defer close(hold)
			select {
			case <-snapshotRead:
			case <-ctx.Done():
			}
		}()
		return
	}
	if eval.Program() != nil {
		close(hold)
		return
	}
	go func() {
		defer close(hold)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for eval.Program() == nil {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// chooseQueueRange picks the range to listen on (see startQueue): of
// first..first+n-1 and the alternate range, the one without a listener, or
// when neither has one, the one the queue rule in chain points at.
func chooseQueueRange(log klog.Logger, first, n uint16, chain string) (uint16, error) {
	alt := queue.AlternateRange(first, n)
	if err := compile.ValidateQueueRange(alt, n); err != nil {
		return 0, fmt.Errorf("--queue-num %d, --queues %d: the alternate range for agent updates: %w", first, n, err)
	}
	stats, err := queue.ReadKernelQueueStats()
	if err != nil && !errors.Is(err, os.ErrNotExist) { // missing: nfnetlink_queue not loaded yet, no listener
		return 0, fmt.Errorf("reading the kernel's queue statistics: %w", err)
	}
	a, b := queue.BoundQueues(stats, first, n) > 0, queue.BoundQueues(stats, alt, n) > 0
	switch {
	case a && b:
		return 0, fmt.Errorf("queues %s and %s both have listeners: two nftpolicy agents already run on this node", compile.QueueRange(first, n), compile.QueueRange(alt, n))
	case a:
		log.Info("Another agent listens on the queues; taking the alternate range, the queue rule moves there with the first sync",
			"busy", compile.QueueRange(first, n), "taking", compile.QueueRange(alt, n))
		return alt, nil
	case b:
		return first, nil
	}
	conn, err := nftables.New()
	if err != nil {
		return first, nil // no rule to follow: the first sync points it
	}
	defer conn.CloseLasting()
	if target, ok, err := queuerule.QueueRuleTarget(conn, compile.TableName, chain); err == nil && ok && target == alt {
		log.Info("The queue rule points at the alternate range (the previous agent's); listening there", "queues", compile.QueueRange(alt, n))
		return alt, nil
	}
	return first, nil
}

// runUntilHandedOver runs rt; the queues outlive ctx (a SIGTERM) until
// stop, called when the agent exits, has run handOver (only when ctx
// ended: on a start-up error there is no successor to wait for; and not
// once removed is set: the agent removed its table at uninstall, nothing
// queues any more).
func runUntilHandedOver(ctx context.Context, rt *queue.Runtime, name string, errs chan<- error, removed *atomic.Bool, handOver func()) (stop func()) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		err := wrapErr(name, rt.Run(rctx))
		select {
		case errs <- err:
		default:
			// Full: the agent has returned (it reads one result) and
			// stop waits for this goroutine; never block it.
		}
	}()
	return func() {
		if ctx.Err() != nil && (removed == nil || !removed.Load()) {
			handOver()
		}
		cancel()
		<-exited
	}
}

// handOver runs at shutdown: when another agent listens on the queues of
// succ (the other range of queue numbers), it waits for the successor's
// first sync to point the queue rule of chain at them (answering its own
// queues meanwhile), points it there itself (the successor may not have
// synced in time, or a sync of this agent may have pointed it back) and
// waits until rt's queues (from ours) are drained, so that closing them
// drops nothing. Without a successor
// there is nothing to hand over to: the queues close, and the rule's
// bypass flag decides until an agent listens.
func handOver(log klog.Logger, rt *queue.Runtime, variant compile.QueueVariant, chain string, ours uint16, succ queuerule.QueueRuleConfig) {
	n := rt.Config().Queues
	start := time.Now()
	if !waitForSuccessor(succ.QueueNum, n, handOverStart().Add(successorWait)) {
		return
	}
	conn, err := nftables.New()
	synced := false
	if err == nil {
		defer conn.CloseLasting()
		// Until its first sync the successor may have no program (no
		// snapshot: this agent removes it before each publication, and
		// pods churn during an update) and would drop what it is sent.
		synced = waitForQueueRule(conn, chain, succ.QueueNum, handOverStart().Add(successorSyncWait))
		err = queuerule.PointQueueRule(context.Background(), conn, compile.TableName, chain, variant, succ)
	}
	if err != nil {
		log.Error(err, "Cannot point the queue rule at the successor's queues; closing ours drops the packets still sent here until its next full sync",
			"chain", chain, "successor", compile.QueueRange(succ.QueueNum, n))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	derr := rt.Drain(ctx, drainQuiet)
	log.Info("Handed the queues over to the successor", "chain", chain, "successor", compile.QueueRange(succ.QueueNum, n),
		"ours", compile.QueueRange(ours, n), "successorSynced", synced, "drained", derr == nil, "duration", time.Since(start).Round(time.Millisecond))
}

// waitForSuccessor reports whether the queues first..first+n-1 have a
// listener, waiting until deadline for all of them. The DaemonSet controller
// stops the old agent once the new pod is ready, and the new pod's
// readiness probe (host network: the same port) is answered by the old
// agent until it exits: the old agent may be told to stop before its
// successor has bound its queues, and closing its own then would drop
// every queued connection until the successor's first sync.
func waitForSuccessor(first, n uint16, deadline time.Time) bool {
	for {
		stats, err := queue.ReadKernelQueueStats()
		bound := 0
		if err == nil {
			bound = queue.BoundQueues(stats, first, n)
		}
		if bound == int(n) || time.Now().After(deadline) {
			return bound > 0
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForQueueRule returns true once the queue rule of chain sends packets
// to the queues from first (the successor's first sync moved it there) or
// chain has no queue rule (nothing is queued there: a DNS chain without
// domainNames rules), false at deadline.
func waitForQueueRule(conn *nftables.Conn, chain string, first uint16, deadline time.Time) bool {
	for {
		if t, ok, err := queuerule.QueueRuleTarget(conn, compile.TableName, chain); err == nil && (!ok || t == first) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listenRetry listens on addr, waiting while the address is in use: during
// an update with maxSurge the old agent (host network) still holds the
// metrics and health ports; they free up when it exits.
func listenRetry(ctx context.Context, addr string) (net.Listener, error) {
	logged := false
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return ln, err
		}
		if !logged {
			klog.FromContext(ctx).Info("Address in use (the previous agent still runs?); waiting for it", "address", addr)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
