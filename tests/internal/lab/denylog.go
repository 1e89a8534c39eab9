package lab

import (
	"context"
	"fmt"
	"io"
	"os"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
)

// RunDenyLog starts a deny log reader in node's namespace, resolving with
// that node's last program and writing its lines (klog's text format, as
// the agent writes them) to out. cfg's Group, FlowInterval and
// LinesPerSecond are used; Node, Program and Logger are set here.
// stop ends the reader and returns its error.
func (l *Lab) RunDenyLog(ctx context.Context, node string, cfg denylog.Config, m *denylog.Metrics, out io.Writer) (stop func() error, err error) {
	return l.runNFLOGReader(ctx, node, out, func(a *inproc.Agent, log klog.Logger) (nflogread.Consumer, error) {
		cfg.Node, cfg.Logger = node, log
		cfg.Program = func() *compile.Program { return a.Program }
		r, err := denylog.New(cfg, m)
		if err != nil {
			return nflogread.Consumer{}, err
		}
		return r.Consumer(), nil
	})
}

// RunStagedLog is RunDenyLog for the staged log (pkg/staged).
func (l *Lab) RunStagedLog(ctx context.Context, node string, cfg staged.Config, m *staged.Metrics, out io.Writer) (stop func() error, err error) {
	return l.runNFLOGReader(ctx, node, out, func(a *inproc.Agent, log klog.Logger) (nflogread.Consumer, error) {
		cfg.Node, cfg.Logger = node, log
		cfg.Program = func() *compile.Program { return a.Program }
		r, err := staged.New(cfg, m)
		if err != nil {
			return nflogread.Consumer{}, err
		}
		return r.Consumer(), nil
	})
}

// runNFLOGReader starts the reader (pkg/nflogread, as the agent's) of an
// NFLOG group of node's namespace for the consumer newConsumer makes with
// the node's agent and a logger writing klog's text format to out, until
// stop.
func (l *Lab) runNFLOGReader(ctx context.Context, node string, out io.Writer,
	newConsumer func(a *inproc.Agent, log klog.Logger) (nflogread.Consumer, error)) (stop func() error, err error) {
	a := l.agents[node]
	if a == nil {
		return nil, fmt.Errorf("no node %s", node)
	}
	path, err := l.net.NodeNetnsPath(node)
	if err != nil {
		return nil, err
	}
	ns, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(out)))
	c, err := newConsumer(a, log)
	if err != nil {
		ns.Close()
		return nil, err
	}
	readers := nflogread.New(log, int(ns.Fd()))
	readers.Add(c)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- readers.Run(rctx, c.Group) }()
	return func() error {
		cancel()
		err := <-done
		ns.Close()
		return err
	}, nil
}
