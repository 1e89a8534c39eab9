package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// denyLogOptions are the agent's deny log flags.
type denyLogOptions struct{ nflogLogOptions }

// configureDenyLog turns the kernel side on in the render configuration
// (kernel and hybrid modes: in queue mode the evaluator denies in userspace
// and the queue runtime logs its denials).
func (o *denyLogOptions) configureDenyLog(render *compile.RenderConfig) {
	if !o.enabled || render.Mode == compile.ModeQueue || o.group == 0 {
		return
	}
	render.DenyLogGroup = o.group
	render.DenyLogRate, render.DenyLogBurst, render.DenyLogTotalRate, render.DenyLogTotalBurst = o.kernelLimits()
}

// startDenyLog makes the deny log a consumer of its group's reader when
// the ruleset logs denials.
func (o *denyLogOptions) startDenyLog(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer, readers *nflogReaders) error {
	if render.DenyLogGroup == 0 {
		return nil
	}
	m := denylog.NewMetrics()
	if err := m.Register(reg); err != nil {
		return err
	}
	l, err := denylog.New(denylog.Config{Group: render.DenyLogGroup, Node: node, Program: eval.Program,
		FlowInterval: o.flowInterval, LinesPerSecond: o.linesPerSec, Logger: klog.FromContext(ctx).WithName("denylog")}, m)
	if err != nil {
		return err
	}
	readers.add(l.Consumer(), "denied connections are no longer logged")
	return nil
}
