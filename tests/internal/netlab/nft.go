package netlab

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// NodeNFT is a knftables.Interface for the nftpolicy table whose every call runs on a thread locked
// into a node's network namespace. knftables execs the nft binary, and a
// child process starts in the network namespace of the thread that forks it,
// so nft talks to the node's kernel tables, never to the caller's.
type NodeNFT struct {
	lab  *Lab
	node string
	nft  knftables.Interface
}

var _ knftables.Interface = (*NodeNFT)(nil)

// NewNodeNFT returns the node's knftables interface.
func NewNodeNFT(lab *Lab, node string) (*NodeNFT, error) {
	n := &NodeNFT{lab: lab, node: node}
	err := lab.InNode(node, func() error {
		var err error
		// New runs "nft --check" to learn what the kernel supports: in the
		// node's namespace too.
		n.nft, err = knftables.New(knftables.InetFamily, compile.TableName)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("knftables in node %s: %w", node, err)
	}
	return n, nil
}

func (n *NodeNFT) in(fn func() error) error { return n.lab.InNode(n.node, fn) }

func (n *NodeNFT) NewTransaction() *knftables.Transaction { return n.nft.NewTransaction() }

func (n *NodeNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.in(func() error { return n.nft.Run(ctx, tx) })
}

func (n *NodeNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.in(func() error { return n.nft.Check(ctx, tx) })
}

func (n *NodeNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.in(func() error { out, err = n.nft.ListAll(ctx); return err })
	return out, err
}

func (n *NodeNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.in(func() error { out, err = n.nft.List(ctx, objectType); return err })
	return out, err
}

func (n *NodeNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.in(func() error { out, err = n.nft.ListRules(ctx, chain); return err })
	return out, err
}

func (n *NodeNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.in(func() error { out, err = n.nft.ListElements(ctx, objectType, name); return err })
	return out, err
}

func (n *NodeNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.in(func() error { out, err = n.nft.ListCounters(ctx); return err })
	return out, err
}
