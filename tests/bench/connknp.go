package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// ModeKNP is kube-network-policies (issue 30, hack/compare.sh) as both
// nodes' agent: the same pods and policies as the other modes (connInput),
// written to a real API server, the peer run by tests/internal/cluster.
// It is measured only when ConnConfig.Modes asks for it: it needs the
// peer's binary (cluster.KNPBinary) and hack/tools.sh's API server.
const ModeKNP = "knp"

// newKNPConnLab starts a cluster whose agents are the peer, creates the
// bench's pods and policies through its API, waits until the peer has
// programmed them and starts the servers. The cluster lives in a goroutine
// of its own (its ProgramTB runs the cleanups when fn returns); the lab's
// stops end it.
func newKNPConnLab(ctx context.Context, workers int, reply bool) (*connLab, error) {
	l := &connLab{mode: ModeKNP, servers: map[string]*server{}, dst: map[string]netip.AddrPort{
		PathSame:  netip.AddrPortFrom(sameSrvIP, connPort),
		PathCross: netip.AddrPortFrom(crossSrvIP, connPort),
	}}
	ready := make(chan error, 1)
	stop, done := make(chan struct{}), make(chan struct{})
	tb := cluster.NewProgramTB("conn-" + ModeKNP)
	tb.Out = io.Discard
	tb.Err = os.Stderr
	go func() {
		defer close(done)
		err := tb.Run(func(tb *cluster.ProgramTB) {
			c := cluster.Start(tb, cluster.Config{Enforcer: cluster.EnforcerKNP, Nodes: benchNodes,
				Prefix: netlab.RandomPrefix("npbk")})
			if err := l.setupKNP(ctx, c, workers, reply); err != nil {
				ready <- err
				return
			}
			ready <- nil
			<-stop
		})
		if err != nil {
			select {
			case ready <- err:
			default:
			}
		}
	}()
	l.stops = append(l.stops, func() { close(stop); <-done })
	if err := <-ready; err != nil {
		l.close()
		return nil, fmt.Errorf("%s lab: %w", ModeKNP, err)
	}
	return l, nil
}

// setupKNP creates connInput's namespace, pods and policies in c, waits
// for the peer and starts the bench's servers in the pods.
func (l *connLab) setupKNP(ctx context.Context, c *cluster.Cluster, workers int, reply bool) error {
	in := connInput("", nil)
	if err := c.EnsureNamespace(ctx, benchNSName, nil); err != nil {
		return err
	}
	for _, p := range in.Pods {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			return err
		}
		if _, err := c.CreatePod(ctx, cluster.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels,
			Node: p.Spec.NodeName, IPs: []netip.Addr{ip}}); err != nil {
			return err
		}
	}
	for _, np := range in.Policies {
		if _, err := c.ApplyPolicy(ctx, np); err != nil {
			return err
		}
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	ep := func(name string) (netlab.Endpoint, error) { return c.PodEndpoint(benchNSName + "/" + name) }
	client, err := ep("client")
	if err != nil {
		return err
	}
	if l.client, err = c.Lab.NetnsPath(client); err != nil {
		return err
	}
	if !reply {
		if out, err := c.Lab.Exec(client, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"); err != nil {
			return fmt.Errorf("client tcp_tw_reuse: %v: %s", err, out)
		}
	}
	for path, name := range map[string]string{PathSame: "server-a", PathCross: "server-b"} {
		e, err := ep(name)
		if err != nil {
			return err
		}
		s, err := startServer(c.Lab, e, connPort, workers, reply)
		if err != nil {
			return err
		}
		l.servers[path] = s
	}
	if len(l.servers) != len(ConnPaths) {
		return errors.New("not every path has a server")
	}
	return nil
}
