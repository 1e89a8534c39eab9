package bench

import (
	"context"
	"slices"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// RestartConfig configures RunRestart.
type RestartConfig struct {
	// Restarts of the agent, each with its own load.
	Restarts int
	// Interval between connection launches from each client.
	Interval time.Duration
	// Load is how long each load runs; the kill comes after KillAfter.
	Load, KillAfter time.Duration
	// ConnTimeout bounds one connection (below the 1 s SYN retransmit).
	ConnTimeout time.Duration
	// Enforcer is the agent killed: nftpolicy (empty or
	// cluster.EnforcerNftpolicy) in Mode, or kube-network-policies
	// (cluster.EnforcerKNP, issue 30).
	Enforcer cluster.Enforcer
	// Mode is nftpolicy's mode; empty means queue (the mode whose every
	// new connection waits for the agent).
	Mode compile.Mode
	// FailOpen runs the agents with --fail-open (both enforcers spell it
	// so): their queue rules' bypass lets packets through while nobody
	// reads the queue. Both default to fail-closed.
	FailOpen bool
	Logf     func(format string, args ...any)
}

func (c *RestartConfig) defaults() {
	if c.Restarts <= 0 {
		c.Restarts = 5
	}
	if c.Interval <= 0 {
		c.Interval = 5 * time.Millisecond
	}
	if c.Load <= 0 {
		c.Load = 2 * time.Second
	}
	if c.KillAfter <= 0 {
		c.KillAfter = 500 * time.Millisecond
	}
	if c.ConnTimeout <= 0 {
		c.ConnTimeout = 900 * time.Millisecond
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.Mode == "" {
		c.Mode = compile.ModeQueue
	}
}

// restartPrefix names RunRestart's figures after what the cluster runs:
// knp_ for kube-network-policies, else nftpolicy's mode (queue_,
// hybrid_), then failopen_ with --fail-open, then restart_.
func restartPrefix(e cluster.Enforcer, mode compile.Mode, failOpen bool) string {
	p := string(mode) + "_"
	if e == cluster.EnforcerKNP {
		p = "knp_"
	}
	if failOpen {
		p += "failopen_"
	}
	return p + "restart_"
}

// RunRestart (root) measures what a SIGKILL of the agent costs in queue mode
// (or another mode, or the peer: RestartConfig.Enforcer, Mode, FailOpen): a
// real kube-apiserver, two nodes with real agent processes (--state-dir as
// the DaemonSet has it), an allowed and a denied client on node-2 opening a
// connection every Interval to a server on node-1, whose agent is killed
// and started again, Restarts times.
//
//	queue_restart_gap_ms           worst over the restarts of the longest time allowed connections failed
//	queue_restart_gap_ms_median    its median
//	queue_restart_listen_ms        worst time from SIGKILL to the new agent listening on the queue
//	queue_restart_ready_ms         worst time from SIGKILL to its /readyz (first sync committed)
//	queue_restart_failed_allowed   allowed connections that failed, all restarts
//	queue_restart_admitted_denied  denied connections that succeeded, all restarts (0 when fail-closed)
//
// The prefix is restartPrefix's: queue_restart_, queue_failopen_restart_,
// hybrid_restart_, knp_restart_, knp_failopen_restart_ and so on.
func RunRestart(ctx context.Context, cfg RestartConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("restart", func(tb *cluster.ProgramTB, res *Result) error { return runRestart(ctx, tb, cfg, res) })
}

const restartNS = "restart"

func runRestart(ctx context.Context, tb *cluster.ProgramTB, cfg RestartConfig, res *Result) error {
	var args []string
	if cfg.FailOpen {
		args = []string{"--fail-open"}
	}
	c := cluster.Start(tb, cluster.Config{Enforcer: cfg.Enforcer, Mode: cfg.Mode, AgentArgs: args, Verbosity: 1, Logf: cfg.Logf})
	// The figures are named after what the cluster runs, not what was asked.
	prefix, queueNum := restartPrefix(c.Enforcer(), c.Mode(), cfg.FailOpen), uint16(100) // the agent's default --queue-num
	if c.Enforcer() == cluster.EnforcerKNP {
		queueNum = cluster.KNPQueueNum
	}
	if err := c.EnsureNamespace(ctx, restartNS, nil); err != nil {
		return err
	}
	for _, p := range []cluster.Pod{
		{Namespace: restartNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: restartNS, Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-2"},
		{Namespace: restartNS, Name: "other", Labels: map[string]string{"app": "other"}, Node: "node-2"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return err
		}
	}
	np := policy("allow-client", "server", true) // ingress to app=server from app=client on 80/TCP
	np.Namespace = restartNS
	if _, err := c.ApplyPolicy(ctx, np); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	good, err := c.PodEndpoint(restartNS + "/client")
	if err != nil {
		return err
	}
	bad, err := c.PodEndpoint(restartNS + "/other")
	if err != nil {
		return err
	}
	var gaps []float64
	var listen, ready time.Duration
	failed, admitted := 0, 0
	for i := 1; i <= cfg.Restarts; i++ {
		r, err := c.RunRestartLoad(ctx, cluster.RestartLoad{
			Node: "node-1", Good: good, Bad: bad, Server: c.PodIPs(restartNS + "/server")[0], Port: 80,
			Interval: cfg.Interval, Duration: cfg.Load, KillAfter: cfg.KillAfter, ConnTimeout: cfg.ConnTimeout,
			QueueNum: queueNum,
		})
		if err != nil {
			return err
		}
		g := r.LongestGap(cfg.Load)
		gaps = append(gaps, float64(g.Gap().Milliseconds()))
		listen, ready = max(listen, r.BoundAt-r.KillAt), max(ready, r.ReadyAt-r.KillAt)
		failed += r.FailedAllowed()
		admitted += r.AdmittedDenied()
		cfg.Logf("restart %d/%d: gap %d ms (%d failed, first %s), listening after %d ms, ready after %d ms, %d denied admitted",
			i, cfg.Restarts, g.Gap().Milliseconds(), g.N, g.Detail, (r.BoundAt - r.KillAt).Milliseconds(), (r.ReadyAt - r.KillAt).Milliseconds(), r.AdmittedDenied())
	}
	res.Set(prefix+"restarts", cfg.Restarts)
	res.Set(prefix+"gap_ms", slices.Max(gaps))
	res.Set(prefix+"gap_ms_median", Median(gaps))
	res.Set(prefix+"listen_ms", listen.Milliseconds())
	res.Set(prefix+"ready_ms", ready.Milliseconds())
	res.Set(prefix+"failed_allowed", failed)
	res.Set(prefix+"admitted_denied", admitted)
	return nil
}
