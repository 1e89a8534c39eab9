package bench

import (
	"context"
	"fmt"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// quiet discards logs (logr.Discard has a nil sink, which the product
// replaces with klog).
var quiet = funcr.New(func(prefix, args string) {}, funcr.Options{})

// nodeNFT is a knftables.Interface whose every call runs on a thread locked
// into a node's network namespace: the nft child process inherits it, so it
// talks to the node's tables (as tests/kernel does).
type nodeNFT struct {
	lab  *netlab.Lab
	node string
	nft  knftables.Interface
}

var _ knftables.Interface = (*nodeNFT)(nil)

func newNodeNFT(lab *netlab.Lab, node string) (*nodeNFT, error) {
	n := &nodeNFT{lab: lab, node: node}
	err := lab.InNode(node, func() error {
		var err error
		n.nft, err = knftables.New(knftables.InetFamily, compile.TableName)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("knftables in node %s: %w", node, err)
	}
	return n, nil
}

func (n *nodeNFT) in(fn func() error) error { return n.lab.InNode(n.node, fn) }

func (n *nodeNFT) NewTransaction() *knftables.Transaction { return n.nft.NewTransaction() }

func (n *nodeNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.in(func() error { return n.nft.Run(ctx, tx) })
}

func (n *nodeNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.in(func() error { return n.nft.Check(ctx, tx) })
}

func (n *nodeNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.in(func() error { out, err = n.nft.ListAll(ctx); return err })
	return out, err
}

func (n *nodeNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.in(func() error { out, err = n.nft.List(ctx, objectType); return err })
	return out, err
}

func (n *nodeNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.in(func() error { out, err = n.nft.ListRules(ctx, chain); return err })
	return out, err
}

func (n *nodeNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.in(func() error { out, err = n.nft.ListElements(ctx, objectType, name); return err })
	return out, err
}

func (n *nodeNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.in(func() error { out, err = n.nft.ListCounters(ctx); return err })
	return out, err
}
