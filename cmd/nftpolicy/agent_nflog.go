package main

import (
	"context"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/denylog"
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

// nflogLogFlags names one log's flags (name-group, name-kernel-rate, ...)
// and their defaults and help.
type nflogLogFlags struct {
	name        string // the flag prefix: "deny-log"
	enabledHelp string
	group       uint16
	rate        uint32
	rateHelp    string // the per-source kernel limit's help
	totalRate   uint32
	flowKey     string // what one line per interval is counted by
}

func (o *nflogLogOptions) addFlags(fs *pflag.FlagSet, f nflogLogFlags) {
	label := map[string]string{"deny-log": "deny log", "staged-log": "staged log"}[f.name]
	fs.BoolVar(&o.enabled, f.name, true, f.enabledHelp)
	fs.Uint16Var(&o.group, f.name+"-group", f.group, "NFLOG group of the "+label+" (must not be used by anything else on the node)")
	fs.Uint32Var(&o.kernelRate, f.name+"-kernel-rate", f.rate, f.rateHelp)
	fs.Uint32Var(&o.totalRate, f.name+"-kernel-total-rate", f.totalRate, "kernel limit on "+label+" messages of all sources, per second (burst twice that)")
	fs.DurationVar(&o.flowInterval, f.name+"-flow-interval", denylog.DefaultFlowInterval, "at most one "+label+" line per "+f.flowKey+" in this interval")
	fs.IntVar(&o.linesPerSec, f.name+"-lines-per-second", denylog.DefaultLinesPerSec, "at most this many "+label+" lines per second overall")
}

// kernelLimits returns the kernel's per-source and overall limits, each
// with a burst of twice its rate.
func (o *nflogLogOptions) kernelLimits() (rate, burst, total, totalBurst uint32) {
	return o.kernelRate, 2 * o.kernelRate, o.totalRate, 2 * o.totalRate
}

// runReader runs one of the agent's NFLOG readers until ctx ends. The
// readers are diagnostics: when one stops, enforcement goes on, and its
// error is logged with msg (which says what is no longer done).
func runReader(ctx context.Context, what, msg string, run func(context.Context) error) {
	go func() {
		if err := wrapErr(what, run(ctx)); err != nil {
			klog.FromContext(ctx).Error(err, msg)
		}
	}()
}
