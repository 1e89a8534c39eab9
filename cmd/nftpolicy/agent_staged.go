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
	"github.com/nftpolicy/nftpolicy/pkg/staged"
)

// stagedLogOptions are the agent's staged log flags.
type stagedLogOptions struct {
	enabled      bool
	group        uint16
	kernelRate   uint32
	totalRate    uint32
	flowInterval time.Duration
	linesPerSec  int
}

func (o *stagedLogOptions) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.enabled, "staged-log", true, "log one line per new connection whose verdict staged policies (nftpolicy.io/staged) would change; the kernel copies only their subjects' first packets (NFLOG)")
	fs.Uint16Var(&o.group, "staged-log-group", staged.DefaultGroup, "NFLOG group of the staged log (must not be used by anything else on the node)")
	fs.Uint32Var(&o.kernelRate, "staged-log-kernel-rate", compile.DefaultStagedLogRate, "kernel limit on staged log copies per source address, per second (burst twice that); over it a connection is not copied, and still decided")
	fs.Uint32Var(&o.totalRate, "staged-log-kernel-total-rate", compile.DefaultStagedLogTotalRate, "kernel limit on staged log copies of all sources, per second (burst twice that)")
	fs.DurationVar(&o.flowInterval, "staged-log-flow-interval", denylog.DefaultFlowInterval, "at most one staged log line per source, destination, protocol and port in this interval")
	fs.IntVar(&o.linesPerSec, "staged-log-lines-per-second", denylog.DefaultLinesPerSec, "at most this many staged log lines per second overall")
}

// configureStagedLog turns the kernel side on in the render configuration.
func (o *stagedLogOptions) configureStagedLog(render *compile.RenderConfig) {
	if !o.enabled || o.group == 0 {
		return
	}
	render.StagedLogGroup = o.group
	render.StagedLogRate, render.StagedLogBurst = o.kernelRate, 2*o.kernelRate
	render.StagedLogTotalRate, render.StagedLogTotalBurst = o.totalRate, 2*o.totalRate
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
	go func() {
		// The staged log is diagnostics: without it, enforcement goes on.
		if err := wrapErr("staged log", l.Run(ctx)); err != nil {
			klog.FromContext(ctx).Error(err, "Staged log reader stopped; staged policies' verdicts are no longer logged")
		}
	}()
	return nil
}
