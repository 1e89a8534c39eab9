package netlab

import (
	"context"
	"os/exec"
)

// Command returns an *exec.Cmd that runs argv inside ep's namespace via
// `ip netns exec`; set Stdin/Stdout etc. as needed.
func (l *Lab) Command(ctx context.Context, ep Endpoint, argv ...string) (*exec.Cmd, error) {
	h, err := l.handle(ep)
	if err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.name}, argv...)...), nil
}

// Exec runs argv inside ep's namespace and returns its combined output. The
// error includes the output.
func (l *Lab) Exec(ep Endpoint, argv ...string) ([]byte, error) {
	return l.ExecInput(ep, nil, argv...)
}

// ExecInput is Exec with stdin, e.g. ExecInput(ep, ruleset, "nft", "-f", "-").
func (l *Lab) ExecInput(ep Endpoint, stdin []byte, argv ...string) ([]byte, error) {
	h, err := l.handle(ep)
	if err != nil {
		return nil, err
	}
	return runCmd(stdin, "ip", append([]string{"netns", "exec", h.name}, argv...)...)
}

// NodeExec runs argv in the node's namespace (see Exec).
func (l *Lab) NodeExec(node string, argv ...string) ([]byte, error) {
	return l.ExecInput(Node(node), nil, argv...)
}

// NodeExecInput runs argv in the node's namespace with stdin, e.g.
// NodeExecInput("n1", []byte(ruleset), "nft", "-f", "-").
func (l *Lab) NodeExecInput(node string, stdin []byte, argv ...string) ([]byte, error) {
	return l.ExecInput(Node(node), stdin, argv...)
}

// InNetns runs fn on an OS thread switched into ep's network namespace and
// returns its error. Sockets created by fn (including netlink sockets, e.g.
// a github.com/google/nftables connection) stay bound to that namespace after
// fn returns, but goroutines started by fn run in the caller's namespace. fn must not call runtime.UnlockOSThread.
func (l *Lab) InNetns(ep Endpoint, fn func() error) error {
	h, err := l.handle(ep)
	if err != nil {
		return err
	}
	return h.run(fn)
}

// InNode is InNetns for a node.
func (l *Lab) InNode(node string, fn func() error) error {
	return l.InNetns(Node(node), fn)
}
