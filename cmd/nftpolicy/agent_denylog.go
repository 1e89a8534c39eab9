package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// denyLogOptions are the agent's deny log flags.
type denyLogOptions struct {
	enabled      bool
	group        uint16
	kernelRate   uint32
	totalRate    uint32
	flowInterval time.Duration
	linesPerSec  int
}

func (o *denyLogOptions) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.enabled, "deny-log", true, "log one line per connection the kernel path denies (NFLOG), naming the policy and rule")
	fs.Uint16Var(&o.group, "deny-log-group", denylog.DefaultGroup, "NFLOG group of the deny log (must not be used by anything else on the node)")
	fs.Uint32Var(&o.kernelRate, "deny-log-kernel-rate", compile.DefaultDenyLogRate, "kernel limit on deny log messages per source address, per second (burst twice that): one pod's denials cannot crowd out another's")
	fs.Uint32Var(&o.totalRate, "deny-log-kernel-total-rate", compile.DefaultDenyLogTotalRate, "kernel limit on deny log messages of all sources, per second (burst twice that)")
	fs.DurationVar(&o.flowInterval, "deny-log-flow-interval", denylog.DefaultFlowInterval, "at most one deny log line per source, destination and policy in this interval")
	fs.IntVar(&o.linesPerSec, "deny-log-lines-per-second", denylog.DefaultLinesPerSec, "at most this many deny log lines per second overall")
}

// configureDenyLog turns the kernel side on in the render configuration
// (kernel and hybrid modes: in queue mode the evaluator denies in userspace
// and the queue runtime logs its denials).
func (o *denyLogOptions) configureDenyLog(render *compile.RenderConfig) {
	if !o.enabled || render.Mode == compile.ModeQueue || o.group == 0 {
		return
	}
	render.DenyLogGroup = o.group
	render.DenyLogRate, render.DenyLogBurst = o.kernelRate, 2*o.kernelRate
	render.DenyLogTotalRate, render.DenyLogTotalBurst = o.totalRate, 2*o.totalRate
}

// startDenyLog starts the deny log reader when the ruleset logs denials.
func (o *denyLogOptions) startDenyLog(ctx context.Context, render compile.RenderConfig, node string, eval *evaluate.Evaluator,
	reg prometheus.Registerer) error {
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
	go func() {
		// The deny log is diagnostics: without it, enforcement goes on.
		if err := wrapErr("deny log", l.Run(ctx)); err != nil {
			klog.FromContext(ctx).Error(err, "Deny log reader stopped; denied connections are no longer logged")
		}
	}()
	return nil
}
