package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// quiet discards logs. logr.Discard() has a nil sink, which the product's
// Defaults replace with klog.
var quiet = funcr.New(func(prefix, args string) {}, funcr.Options{})

// agent is what nftpolicy runs on one node: a syncer, and in queue mode the
// evaluator and NFQUEUE runtime.
type agent struct {
	node   string
	nft    *netlab.NodeNFT
	netns  *os.File // the node's namespace, for netlink sockets
	syncer *sets.Syncer
	rcfg   compile.RenderConfig
	qcfg   sets.QueueRuleConfig

	eval    queue.Evaluator
	rt      *queue.Runtime
	stopRT  context.CancelFunc
	rtDone  chan error
	program *compile.Program

	elements *sets.NetlinkElements
}

func newAgent(lab *netlab.Lab, node string, rcfg compile.RenderConfig) (_ *agent, err error) {
	a := &agent{node: node, rcfg: rcfg}
	if a.nft, err = netlab.NewNodeNFT(lab, node); err != nil {
		return nil, err
	}
	path, err := lab.NodeNetnsPath(node)
	if err != nil {
		return nil, err
	}
	if a.netns, err = os.Open(path); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	a.qcfg = sets.QueueRuleConfig{
		QueueNum: rcfg.QueueNum,
		Queues:   rcfg.Queues,
		Bypass:   rcfg.FailOpen,
		Fanout:   rcfg.Queues > 1,
		Counter:  true,
		Comment:  "nftpolicy: new connections to the userspace evaluator",
	}
	// As the agent runs it: element changes over netlink, full syncs with
	// one command per set.
	a.elements = sets.NewNetlinkElements(compile.TableName, int(a.netns.Fd()))
	scfg := sets.Config{NFT: a.nft, Logger: quiet, Netlink: a.elements, OneCommandPerSet: true}
	if rcfg.Mode == compile.ModeQueue && rcfg.QueueVariant == compile.QueueXTCompat {
		scfg.External = a.installQueueRule
	}
	if a.syncer, err = sets.New(scfg); err != nil {
		return nil, err
	}
	if rcfg.Mode == compile.ModeQueue {
		if err := a.startRuntime(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// installQueueRule is the syncer's External installer: the xt-compat
// NFQUEUE rule, written over netlink into the node's table.
func (a *agent) installQueueRule(ctx context.Context, chain string) error {
	conn, err := nftables.New(nftables.WithNetNSFd(int(a.netns.Fd())))
	if err != nil {
		return err
	}
	defer conn.CloseLasting()
	return sets.InstallCompatQueueRule(conn, compile.TableName, chain, a.qcfg)
}

// compatQueueRuleInstalled reports whether the node's queue chain holds the
// xt-compat rule.
func (a *agent) compatQueueRuleInstalled() (bool, error) {
	conn, err := nftables.New(nftables.WithNetNSFd(int(a.netns.Fd())))
	if err != nil {
		return false, err
	}
	defer conn.CloseLasting()
	return sets.CheckCompatQueueRule(conn, compile.TableName, compile.ChainQueue, a.qcfg)
}

func (a *agent) startRuntime() error {
	rt, err := queue.NewRuntime(queue.RuntimeConfig{
		QueueNum:  a.rcfg.QueueNum,
		Queues:    a.rcfg.Queues,
		FailOpen:  a.rcfg.FailOpen,
		AllowMark: a.rcfg.AllowMark,
		NetNS:     int(a.netns.Fd()),
		Logger:    quiet,
	}, &a.eval)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.rt, a.stopRT, a.rtDone = rt, cancel, make(chan error, 1)
	go func() { a.rtDone <- rt.Run(ctx) }()
	select {
	case <-rt.Ready():
		return nil
	case err := <-a.rtDone:
		a.rtDone <- err
		return fmt.Errorf("nfqueue runtime on %s: %w", a.node, err)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("nfqueue runtime on %s: not ready after 10s", a.node)
	}
}

// apply renders prog, syncs it and then (queue mode) publishes prog to the
// evaluator, in the agent's order: the program is published only after the
// transaction rendered from it committed.
func (a *agent) apply(ctx context.Context, prog *compile.Program, mutate func(string, *compile.Ruleset), full bool) (sets.Result, error) {
	rs, err := compile.Render(prog, a.rcfg)
	if err != nil {
		return sets.Result{}, fmt.Errorf("rendering for %s: %w", a.node, err)
	}
	if mutate != nil {
		mutate(a.node, rs)
	}
	if full {
		a.syncer.ForceFull()
	}
	res, err := a.syncer.Sync(ctx, rs)
	if err != nil {
		return res, fmt.Errorf("syncing %s: %w", a.node, err)
	}
	a.eval.Swap(prog)
	a.program = prog
	return res, nil
}

func (a *agent) close() error {
	var errs []error
	if a.stopRT != nil {
		a.stopRT()
		if err := <-a.rtDone; err != nil {
			errs = append(errs, err)
		}
		a.stopRT = nil
	}
	if a.elements != nil {
		errs = append(errs, a.elements.Close())
		a.elements = nil
	}
	if a.netns != nil {
		errs = append(errs, a.netns.Close())
		a.netns = nil
	}
	return errors.Join(errs...)
}
