package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
)

// stagedLogOptions are the agent's staged log flags.
type stagedLogOptions struct{ nflogLogOptions }

func (o *stagedLogOptions) addFlags(fs *pflag.FlagSet) {
	o.nflogLogOptions.addFlags(fs, nflogLogFlags{name: "staged-log",
		enabledHelp: "log one line per new connection whose verdict staged policies (nftpolicy.io/staged) would change; the kernel copies only their subjects' first packets (NFLOG)",
		group:       staged.DefaultGroup,
		rate:        compile.DefaultStagedLogRate,
		rateHelp:    "kernel limit on staged log copies per source address, per second (burst twice that); over it a connection is not copied, and still decided",
		totalRate:   compile.DefaultStagedLogTotalRate,
		flowKey:     "source, destination, protocol and port"})
}

// configureStagedLog turns the kernel side on in the render configuration.
func (o *stagedLogOptions) configureStagedLog(render *compile.RenderConfig) {
	if !o.enabled || o.group == 0 {
		return
	}
	render.StagedLogGroup = o.group
	render.StagedLogRate, render.StagedLogBurst, render.StagedLogTotalRate, render.StagedLogTotalBurst = o.kernelLimits()
}

// startStagedLog starts the staged log reader when the ruleset copies
// staged subjects' packets.
func (o *stagedLogOptions) startStagedLog(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer) error {
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
	runReader(ctx, "staged log", "Staged log reader stopped; staged policies' verdicts are no longer logged", l.Run)
	return nil
}
