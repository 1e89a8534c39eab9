package main

import (
	"context"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
)

// verifyOptions are the agent's runtime verification flags.
type verifyOptions struct {
	rate       float64
	group      uint16
	kernelRate uint32
}

// configureVerify turns sampling on in the render configuration (kernel
// and hybrid modes: in queue mode the evaluator decides every connection);
// config.Validate bounded the rate and the group.
func (o *verifyOptions) configureVerify(render *compile.RenderConfig) {
	if o.rate == 0 {
		return
	}
	render.Verify = compile.VerifyConfig{Group: o.group, PerMillion: uint32(math.Round(o.rate * compile.VerifyPerMillion)),
		SourceRate: o.kernelRate, SourceBurst: 2 * o.kernelRate}
	if render.Verify.PerMillion == 0 {
		render.Verify.PerMillion = 1
	}
}

// startNFLOGReaders starts the readers of the ruleset's NFLOG groups, one
// per group, for their consumers: the deny log, the staged log and
// runtime verification; after DNS learning set the evaluator's resolver,
// which the staged log reads.
func (o *agentOptions) startNFLOGReaders(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer) error {
	readers := newNFLOGReaders(ctx)
	if err := o.denyLog.startDenyLog(ctx, render, node, eval, reg, readers); err != nil {
		return err
	}
	if err := o.stagedLog.startStagedLog(ctx, render, node, eval, reg, readers); err != nil {
		return err
	}
	if err := o.verify.startVerify(ctx, render, node, eval, o.refreshDelay, reg, readers); err != nil {
		return err
	}
	readers.run(ctx)
	return nil
}

// startVerify makes the verifier a consumer of its group's reader when the
// ruleset samples verdicts.
func (o *verifyOptions) startVerify(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	refreshDelay time.Duration, reg prometheus.Registerer, readers *nflogReaders) error {
	if !render.Verify.Enabled() {
		return nil
	}
	m := verify.NewMetrics()
	if err := m.Register(reg); err != nil {
		return err
	}
	// The program may lag the kernel by the refresh delay (or more, after
	// a slow build): a disagreement waits well over it to be confirmed.
	cfg := verify.Config{Group: render.Verify.Group, Node: node, Evaluator: eval, Settle: max(verify.DefaultSettle, 3*refreshDelay),
		Logger: klog.FromContext(ctx).WithName("verify")}
	v, err := verify.New(cfg, m)
	if err != nil {
		return err
	}
	readers.add(v.Consumer(), "kernel verdicts are no longer checked")
	return nil
}
