package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
)

// stagedLogOptions are the agent's staged log flags.
type stagedLogOptions struct{ nflogLogOptions }

// configureStagedLog turns the kernel side on in the render configuration.
func (o *stagedLogOptions) configureStagedLog(render *compile.RenderConfig) {
	if !o.enabled || o.group == 0 {
		return
	}
	render.StagedLogGroup = o.group
	render.StagedLogRate, render.StagedLogBurst, render.StagedLogTotalRate, render.StagedLogTotalBurst = o.kernelLimits()
}

// startStagedLog makes the staged log a consumer of its group's reader
// when the ruleset copies staged subjects' packets.
func (o *stagedLogOptions) startStagedLog(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer, readers *nflogReaders) error {
	if render.StagedLogGroup == 0 {
		return nil
	}
	m := staged.NewMetrics()
	if err := m.Register(reg); err != nil {
		return err
	}
	l, err := staged.New(staged.Config{Resolver: eval.Resolved, Config: denylog.Config{Group: render.StagedLogGroup, Node: node, Program: eval.Program,
		FlowInterval: o.flowInterval, LinesPerSecond: o.linesPerSec, Logger: klog.FromContext(ctx).WithName("staged")}}, m)
	if err != nil {
		return err
	}
	readers.add(l.Consumer(), "staged policies' verdicts are no longer logged")
	return nil
}
