package bench

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// MetricsAuthConfig configures RunMetricsAuth.
type MetricsAuthConfig struct {
	// Sources is how many addresses send a made-up token each.
	Sources int
	Logf    func(format string, args ...any)
}

// RunMetricsAuth plays cluster.MetricsLockout (issue 43, item 7) against
// one real agent serving metrics with --metrics-auth=delegated on the
// node's address, a real API server answering its reviews:
// metrics_scrape_ok_under_lockout is 1 when the valid scrape from a new
// pod got the metrics after Sources addresses sent made-up tokens;
// metrics_lockout_crowd_throttled is how many of those got 429.
func RunMetricsAuth(ctx context.Context, cfg MetricsAuthConfig) (*Result, error) {
	if cfg.Sources <= 0 {
		cfg.Sources = 300
	}
	return runInProgramTB("metricsauth", func(tb *cluster.ProgramTB, res *Result) error {
		return runMetricsAuth(ctx, tb, cfg, res)
	})
}

func runMetricsAuth(ctx context.Context, tb *cluster.ProgramTB, cfg MetricsAuthConfig, res *Result) error {
	const node = "node-1"
	c := cluster.Start(tb, cluster.Config{Nodes: []string{node}, NoAgents: true, Verbosity: 1, Logf: cfg.Logf,
		AgentArgs: []string{"--metrics-auth=delegated"}})
	a := c.Agent(node)
	a.MetricsAddr, a.HealthAddr = ":9402", ":9403"
	if err := a.Start(); err != nil {
		return err
	}
	if err := a.WaitReady(ctx); err != nil {
		return err
	}
	token, err := c.MetricsReaderToken(ctx, "monitoring", "prometheus")
	if err != nil {
		return err
	}
	if _, err := c.CreatePod(ctx, cluster.Pod{Namespace: "monitoring", Name: "prometheus", Node: node}); err != nil {
		return err
	}
	scraper, err := c.PodEndpoint("monitoring/prometheus")
	if err != nil {
		return err
	}
	ip := c.NodeIPs(node)[0]
	r, err := c.RunMetricsLockout(ctx, cluster.MetricsLockout{Node: node, Sources: cfg.Sources, Scraper: scraper, Token: token,
		Addr: netip.AddrPortFrom(ip, 9402).String(), HealthAddr: netip.AddrPortFrom(ip, 9403).String()})
	if err != nil {
		return err
	}
	cfg.Logf("metricsauth: the crowd's %d addresses got (status: count) %v; the scrape: %d %s", cfg.Sources, r.Crowd, r.ScrapeCode, r.ScrapeError)
	if r.Crowd[401] == 0 {
		return fmt.Errorf("metricsauth: no made-up token was refused with 401 (%v): the attack did not reach the agent", r.Crowd)
	}
	ok := 0
	if r.ScrapeOK() {
		ok = 1
	}
	res.Set("metrics_scrape_ok_under_lockout", ok)
	res.Set("metrics_lockout_crowd_throttled", r.Crowd[429])
	return nil
}
