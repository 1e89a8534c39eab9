package lab

import (
	"context"
	"io"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
)

// RunVerify starts a verifier in node's namespace, deciding the samples
// with that node's evaluator and writing its lines (klog's text format, as
// the agent writes them) to out. cfg's Group, Settle and rates are used;
// Node, Evaluator and Logger are set here. stop ends the reader and
// returns its error.
func (l *Lab) RunVerify(ctx context.Context, node string, cfg verify.Config, m *verify.Metrics, out io.Writer) (stop func() error, err error) {
	return l.runNFLOGReader(ctx, node, out, func(a *inproc.Agent, log klog.Logger) (nflogread.Consumer, error) {
		cfg.Node, cfg.Evaluator, cfg.Logger = node, a.Evaluator(), log
		v, err := verify.New(cfg, m)
		if err != nil {
			return nflogread.Consumer{}, err
		}
		return v.Consumer(), nil
	})
}
