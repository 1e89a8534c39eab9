package bench

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// RSSConfig configures RunRSS.
type RSSConfig struct {
	// Pods are the pod counts to measure at, increasing (default 1k, 10k);
	// Policies, LocalPods, Parallel, FakeNodes and Settle are RunScale's.
	Scale ScaleConfig
	// Enforcers measured, each on a cluster of its own (default
	// kube-network-policies, then nftpolicy in hybrid mode).
	Enforcers []cluster.Enforcer
}

func (c *RSSConfig) defaults() {
	if len(c.Scale.Pods) == 0 {
		c.Scale.Pods = []int{1000, 10000}
	}
	if c.Scale.Settle <= 0 {
		c.Scale.Settle = 5 * time.Second
	}
	c.Scale.defaults()
	if len(c.Enforcers) == 0 {
		c.Enforcers = []cluster.Enforcer{cluster.EnforcerKNP, cluster.EnforcerNftpolicy}
	}
}

// rssPrefix names an enforcer's RSS figures: knp_rss_mb_<size> for the
// peer, rss_mb_<size> for nftpolicy (hybrid mode), as RunScale names its own.
func rssPrefix(e cluster.Enforcer) string {
	if e == cluster.EnforcerKNP {
		return "knp_rss_"
	}
	return "rss_"
}

// RunRSS (root, issue 30) measures the resident memory of one node's agent
// with the API holding cfg.Scale.Pods pods: RunScale's objects (pods on
// fake nodes, its policies, a few real pods on the agent's node), the agent
// started after the pods were created, programmed (Cluster.WaitProgrammed),
// left idle for Settle, then VmRSS and VmHWM read from /proc/PID/status of
// the enforcer's own PID (Agent.EnforcerPid). Figures per size:
// knp_rss_mb_<size> and knp_rss_peak_mb_<size> for kube-network-policies,
// rss_mb_<size> and rss_peak_mb_<size> for nftpolicy in hybrid mode.
func RunRSS(ctx context.Context, cfg RSSConfig) (*Result, error) {
	cfg.defaults()
	if !slices.IsSorted(cfg.Scale.Pods) {
		return nil, errors.New("rss: pod counts must increase")
	}
	res := &Result{}
	for _, e := range cfg.Enforcers {
		r, err := runInProgramTB("rss-"+e.String(), func(tb *cluster.ProgramTB, res *Result) error { return runRSS(ctx, tb, cfg.Scale, e, res) })
		if err != nil {
			return nil, err
		}
		res.Merge(r)
	}
	return res, nil
}

func runRSS(ctx context.Context, tb *cluster.ProgramTB, cfg ScaleConfig, e cluster.Enforcer, res *Result) error {
	c, cs, _, err := startScaleCluster(ctx, tb, cfg, e, compile.ModeHybrid)
	if err != nil {
		return err
	}
	agent := c.Agent("node-1")
	return eachScaleSize(ctx, cs, agent, cfg, func(n int) error {
		start := time.Now()
		if err := agent.Start(); err != nil {
			return err
		}
		if err := agent.WaitReady(ctx); err != nil {
			return err
		}
		if _, err := c.WaitProgrammed(ctx); err != nil {
			return err
		}
		programmed := time.Since(start)
		time.Sleep(cfg.Settle)
		pid, err := agent.EnforcerPid()
		if err != nil {
			return err
		}
		st, err := procStatus(pid)
		if err != nil {
			return err
		}
		sz, p := sizeName(n), rssPrefix(e)
		res.Set(p+"mb_"+sz, round(st["VmRSS"]/1024, 1))
		res.Set(p+"peak_mb_"+sz, round(st["VmHWM"]/1024, 1))
		cfg.Logf("rss: %s, %d pods: programmed %v after start; after %v idle RSS %.1f MiB (anon %.1f, file %.1f), peak %.1f MiB",
			e, n, programmed.Round(time.Millisecond), cfg.Settle, st["VmRSS"]/1024, st["RssAnon"]/1024, st["RssFile"]/1024, st["VmHWM"]/1024)
		return nil
	})
}
