package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// CPUConfig configures RunCPU.
type CPUConfig struct {
	// Conns new connections per burst, Bursts bursts per path and
	// enforcer.
	Conns, Bursts int
	// Idle is how long the agents' CPU is read with no load after the
	// bursts: what they spend anyway (informers, health and metrics
	// servers), reported, not subtracted (at 10 ms resolution an idle
	// window as short as a burst says nothing).
	Idle time.Duration
	// Modes are the enforcers measured: ModeKNP, ModeQueue, ModeHybrid.
	Modes []string
	Logf  func(format string, args ...any)
}

func (c *CPUConfig) defaults() {
	if c.Conns <= 0 {
		c.Conns = 2500
	}
	if c.Bursts <= 0 {
		c.Bursts = 5
	}
	if c.Idle <= 0 {
		c.Idle = 3 * time.Second
	}
	if len(c.Modes) == 0 {
		c.Modes = []string{ModeKNP, ModeQueue, ModeHybrid}
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// cpuCluster is the cluster configuration of each enforcer RunCPU
// measures: every one a real agent process per node.
func cpuCluster(mode string) (cluster.Config, error) {
	switch mode {
	case ModeKNP:
		return cluster.Config{Enforcer: cluster.EnforcerKNP}, nil
	case ModeQueue:
		return cluster.Config{Mode: compile.ModeQueue}, nil
	case ModeHybrid:
		return cluster.Config{Mode: compile.ModeHybrid}, nil
	}
	return cluster.Config{}, fmt.Errorf("cpu: unknown mode %q (known: %s, %s, %s)", mode, ModeKNP, ModeQueue, ModeHybrid)
}

// RunCPU (root) measures the agents' CPU time per new connection between
// pods a NetworkPolicy selects (issue 30). For each mode it starts a
// cluster of two nodes whose agents are real processes (the peer, or
// `nftpolicy agent`), a server on node-1 isolated for ingress and allowed
// from app=client on 80/TCP, and a client on each node; then Bursts bursts
// of Conns sequential connections per path (same node, cross node), and
// reads utime+stime of both nodes' agents (/proc/PID/stat) around each
// burst: the agents' whole CPU time during the burst, over the connections
// that succeeded. The client is not selected by any policy, so each
// connection is decided once (on the server's node).
//
//	<mode>_cpu_us_per_conn          mean of both paths' medians over bursts: µs of agent CPU per connection
//	<mode>_cpu_us_per_conn_same     the same-node median; _cross the cross-node one
//	<mode>_cpu_queued_per_conn      packets the kernel queued to userspace per connection (both nodes)
//	<mode>_cpu_idle_ms_per_s        the agents' CPU with no load (Idle, after the bursts), ms per second
//	<mode>_cpu_failed               allowed connections that failed
//
//	queue_vs_knp_cpu_ratio          queue mode's figure over the peer's, when both are measured
//
// In queue mode and for the peer every connection must have been queued
// (else the agent did not decide it and the figure would flatter it).
func RunCPU(ctx context.Context, cfg CPUConfig) (*Result, error) {
	cfg.defaults()
	out := &Result{}
	for _, m := range cfg.Modes {
		ccfg, err := cpuCluster(m)
		if err != nil {
			return nil, err
		}
		res, err := runInProgramTB("cpu-"+m, func(tb *cluster.ProgramTB, res *Result) error {
			return runCPU(ctx, tb, m, ccfg, cfg, res)
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m, err)
		}
		out.Merge(res)
	}
	// Issue 30 wants queue mode at most half of the peer's.
	if k, q := out.Float(ModeKNP+"_cpu_us_per_conn"), out.Float(ModeQueue+"_cpu_us_per_conn"); k > 0 && q > 0 {
		out.Set("queue_vs_knp_cpu_ratio", round(q/k, 3))
	}
	return out, nil
}

const cpuNS = "cpu"

// cpuBurst is what one burst cost.
type cpuBurst struct {
	cpu, wall  time.Duration
	ok, failed int
	queued     uint64
}

func runCPU(ctx context.Context, tb *cluster.ProgramTB, mode string, ccfg cluster.Config, cfg CPUConfig, res *Result) error {
	ccfg.Verbosity, ccfg.Logf = 1, cfg.Logf
	ccfg.Prefix = netlab.RandomPrefix("npcpu")
	c := cluster.Start(tb, ccfg)
	if knp := c.Enforcer() == cluster.EnforcerKNP; knp != (mode == ModeKNP) || !knp && string(c.Mode()) != mode {
		return fmt.Errorf("cpu: the %s figures would come from a cluster running %s in %s mode", mode, c.Enforcer(), c.Mode())
	}
	if err := c.EnsureNamespace(ctx, cpuNS, nil); err != nil {
		return err
	}
	for _, p := range []cluster.Pod{
		{Namespace: cpuNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: cpuNS, Name: "client-same", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		{Namespace: cpuNS, Name: "client-cross", Labels: map[string]string{"app": "client"}, Node: "node-2"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return err
		}
	}
	np := policy("allow-client", "server", true) // ingress to app=server from app=client on 80/TCP
	np.Namespace = cpuNS
	if _, err := c.ApplyPolicy(ctx, np); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	server := c.PodIPs(cpuNS + "/server")[0]
	from := map[string]netlab.Endpoint{}
	for _, path := range ConnPaths {
		ep, err := c.PodEndpoint(cpuNS + "/client-" + path)
		if err != nil {
			return err
		}
		from[path] = ep
	}

	agentCPU := func() (time.Duration, error) {
		var sum time.Duration
		for _, a := range c.Agents() {
			d, err := a.CPUTime()
			if err != nil {
				return 0, err
			}
			sum += d
		}
		return sum, nil
	}
	queued := func() (uint64, error) {
		var sum uint64
		for _, n := range c.Nodes() {
			err := c.Lab.InNode(n, func() error {
				st, err := queue.ReadKernelQueueStats()
				if errors.Is(err, os.ErrNotExist) {
					return nil // nfnetlink_queue not loaded: nothing was queued
				}
				for _, q := range st {
					sum += uint64(q.IDSequence)
				}
				return err
			})
			if err != nil {
				return 0, err
			}
		}
		return sum, nil
	}
	burst := func(ep netlab.Endpoint, n int) (b cpuBurst, err error) {
		q0, err := queued()
		if err != nil {
			return b, err
		}
		c0, err := agentCPU()
		if err != nil {
			return b, err
		}
		start := time.Now()
		for range n {
			r := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: ep, To: server, Port: 80, Proto: netlab.TCP, Timeout: time.Second})
			if r.Err != nil {
				return b, r.Err
			}
			if r.Connected {
				b.ok++
			} else {
				b.failed++
			}
		}
		b.wall = time.Since(start)
		c1, err := agentCPU()
		if err != nil {
			return b, err
		}
		q1, err := queued()
		if err != nil {
			return b, err
		}
		b.cpu, b.queued = c1-c0, q1-q0
		return b, nil
	}

	// Warm up: first connections, lazily built caches.
	for _, path := range ConnPaths {
		if b, err := burst(from[path], 50); err != nil {
			return err
		} else if b.ok == 0 {
			return fmt.Errorf("%s, %s path: no allowed connection succeeded in the warm-up", mode, path)
		}
	}
	failed := 0
	var queuedPerConn []float64
	perPath := map[string][]float64{}
	for i := range cfg.Bursts {
		for _, path := range ConnPaths {
			b, err := burst(from[path], cfg.Conns)
			if err != nil {
				return err
			}
			if b.ok == 0 {
				return fmt.Errorf("%s, %s path: no allowed connection succeeded", mode, path)
			}
			if mode != ModeHybrid && b.queued < uint64(b.ok) {
				return fmt.Errorf("%s, %s path: %d connections but only %d packets queued: the agent did not decide them", mode, path, b.ok, b.queued)
			}
			failed += b.failed
			us := float64(b.cpu) / float64(time.Microsecond) / float64(b.ok)
			perPath[path] = append(perPath[path], us)
			queuedPerConn = append(queuedPerConn, float64(b.queued)/float64(b.ok))
			cfg.Logf("cpu %s burst %d/%d %s: %d connections (%d failed) in %v, agents' CPU %v, %.1f µs/conn, %.2f queued/conn",
				mode, i+1, cfg.Bursts, path, b.ok, b.failed, b.wall.Round(time.Millisecond), b.cpu, us, float64(b.queued)/float64(b.ok))
		}
	}
	// The agents' CPU with no load, after the bursts, to show how much of
	// the figures is background.
	i0, err := agentCPU()
	if err != nil {
		return err
	}
	idleStart := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cfg.Idle):
	}
	i1, err := agentCPU()
	if err != nil {
		return err
	}
	idleRate := float64(i1-i0) / float64(time.Since(idleStart))

	same, cross := Median(perPath[PathSame]), Median(perPath[PathCross])
	res.Set(mode+"_cpu_us_per_conn", round((same+cross)/2, 1))
	res.Set(mode+"_cpu_us_per_conn_same", round(same, 1))
	res.Set(mode+"_cpu_us_per_conn_cross", round(cross, 1))
	res.Set(mode+"_cpu_queued_per_conn", round(Median(queuedPerConn), 1))
	res.Set(mode+"_cpu_idle_ms_per_s", round(idleRate*1000, 1))
	res.Set(mode+"_cpu_failed", failed)
	res.Set(mode+"_cpu_conns", cfg.Conns*cfg.Bursts*len(ConnPaths))
	return nil
}
