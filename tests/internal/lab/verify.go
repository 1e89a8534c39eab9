package lab

import (
	"context"
	"io"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/verify"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
)

// RunVerify starts a verifier in node's namespace, deciding the samples
// with that node's evaluator and writing its lines (klog's text format, as
// the agent writes them) to out. cfg's Group, Settle and rates are used;
// Node, Evaluator, NetNS and Logger are set here. stop ends the reader and
// returns its error.
func (l *Lab) RunVerify(ctx context.Context, node string, cfg verify.Config, m *verify.Metrics, out io.Writer) (stop func() error, err error) {
	return l.runNFLOGReader(ctx, node, out, func(a *inproc.Agent, netns int, log klog.Logger) (func(context.Context) error, error) {
		cfg.Node, cfg.NetNS, cfg.Evaluator, cfg.Logger = node, netns, a.Evaluator(), log
		v, err := verify.New(cfg, m)
		if err != nil {
			return nil, err
		}
		return v.Run, nil
	})
}
