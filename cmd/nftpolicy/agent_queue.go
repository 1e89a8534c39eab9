package main

import (
	"context"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// queuesPerCPU is the --queues value that means one queue per CPU.
const queuesPerCPU = 0

// queueCount resolves --queues: one queue per CPU by default (the rule
// fans out by CPU, and each queue has a reader thread of its own).
func queueCount(flag uint16) uint16 {
	if flag != queuesPerCPU {
		return flag
	}
	return uint16(min(runtime.NumCPU(), 64))
}

// startQueue restores the program snapshot (--state-dir) into eval and, in
// queue mode, binds the queues and starts answering them. It runs before
// the slower start-up steps (the queue variant probe, the nftables and API
// clients, the informers): after a restart the kernel's table is still in
// place and queueing, and every millisecond before the queues are bound is
// a millisecond of dropped (or, with --fail-open, unchecked) connections.
// done is true when the agent must return (ctx ended first).
func (o *agentOptions) startQueue(ctx context.Context, render compile.RenderConfig, node string, eval *queue.Evaluator,
	reg prometheus.Registerer, metrics *controller.Metrics, errs chan error) (done bool, err error) {
	log := klog.FromContext(ctx)
	if err := o.state.restore(ctx, eval, node, reg); err != nil {
		return false, err
	}
	if !render.UsesQueue() {
		return false, nil
	}
	render.Defaults() // the allow mark's default
	rt, err := queue.NewRuntime(queue.RuntimeConfig{
		QueueNum: render.QueueNum, Queues: render.Queues, FailOpen: o.failOpen, MaxQueueLen: o.maxQueueLen,
		AllowMark: render.AllowMark, Logger: log.WithName("queue"), Observer: metrics,
	}.Defaults(), eval)
	if err != nil {
		return false, err
	}
	reg.MustRegister(controller.NewQueueStatsCollector(metrics, log.WithName("metrics")))
	go func() { errs <- wrapErr("queue runtime", rt.Run(ctx)) }()
	select {
	case <-rt.Ready():
		log.Info("Listening on NFQUEUE", "queue", render.QueueNum, "queues", render.Queues, "fromSnapshot", eval.Program() != nil)
		return false, nil
	case err := <-errs:
		return true, err
	case <-ctx.Done():
		return true, nil
	}
}
