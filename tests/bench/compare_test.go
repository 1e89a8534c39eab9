package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// TestCompareConn measures connection rate and connect latency with
// kube-network-policies as the agent (ModeKNP) interleaved round by round
// with no policy, conntrack only, nftpolicy hybrid and queue mode, and
// prints issue 30's figures for hack/compare.sh. It fails when a mode
// makes no connection on a path or a figure is missing. It skips without
// the peer's binary, which make test does not build.
func TestCompareConn(t *testing.T) {
	ctx := startCompare(t)
	cfg := ConnConfig{Rounds: 20, ClientExec: os.Args[0], Logf: t.Logf,
		Modes: []string{ModeConntrack, ModeHybrid, ModeQueue, ModeKNP}}
	res, err := RunConn(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range append([]string{ModeControl}, cfg.Modes...) {
		for _, p := range ConnPaths {
			if res.Float(m+"_rate_"+p) <= 0 {
				t.Errorf("%s mode, %s path: no connection\n%s", m, p, res.Lines())
			}
		}
	}
	// Failed allowed connections are figures, not failures: queue mode
	// loses about one connection per same-node round here with or without
	// the peer in the run (a connect that times out after a second).
	for _, m := range append([]string{ModeControl}, cfg.Modes...) {
		fmt.Printf("compare_figure: %s_failed=%v\n", m, res.Float(m+"_failed"))
	}
	fmt.Printf("compare_figure: conn_rounds=%d\n", cfg.Rounds)
	printFigures(t, "RunConn", res, "knp_conn_ratio", "hybrid_vs_knp_conn_ratio", "queue_vs_knp_conn_ratio",
		"knp_conn_ratio_same", "knp_conn_ratio_cross", "hybrid_conn_ratio", "queue_conn_ratio", "conntrack_conn_ratio",
		"control_p50_us", "control_p99_us", "conntrack_p50_us", "conntrack_p99_us", "hybrid_p50_us", "hybrid_p99_us",
		"queue_p50_us", "queue_p99_us", "knp_p50_us", "knp_p99_us")
}

// TestCompareCPU measures the agents' CPU per decided connection (RunCPU)
// for kube-network-policies and nftpolicy's queue and hybrid modes, each
// agent a process of its own, and prints issue 30's *_cpu_us_per_conn
// figures for hack/compare.sh. RunCPU fails when an agent's PID is not the
// enforcer's binary, when no allowed connection succeeds, or when the peer
// or queue mode did not queue every connection; this test fails when a
// figure is missing or not positive where the agent decides connections.
func TestCompareCPU(t *testing.T) {
	ctx := startCompare(t)
	cfg := CPUConfig{Logf: t.Logf}
	res, err := RunCPU(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.defaults()
	var want []string
	for _, m := range cfg.Modes {
		want = append(want, m+"_cpu_us_per_conn", m+"_cpu_us_per_conn_same", m+"_cpu_us_per_conn_cross")
		// Both decide every connection in userspace: an agent that spends
		// nothing on them is not the one being measured.
		if m != ModeHybrid && !(res.Float(m+"_cpu_us_per_conn") > 0) {
			t.Errorf("%s: %v µs of agent CPU per connection\n%s", m, res.Float(m+"_cpu_us_per_conn"), res.Lines())
		}
	}
	printFigures(t, "RunCPU", res, append(want, res.Names()...)...)
}

// TestCompareRestart kills kube-network-policies with SIGKILL under a
// connection loop (RunRestart's, the one nftpolicy's queue-mode restart
// figures come from) in its default fail mode, and prints issue 30's
// knp_restart_admitted_denied and the allowed connections that failed
// for hack/compare.sh. It fails when the peer does not come back (the
// loop's restart errors) or a figure is missing.
func TestCompareRestart(t *testing.T) {
	ctx := startCompare(t)
	res, err := RunRestart(ctx, RestartConfig{Enforcer: cluster.EnforcerKNP, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	printFigures(t, "RunRestart", res, "knp_restart_restarts", "knp_restart_admitted_denied", "knp_restart_failed_allowed",
		"knp_restart_gap_ms", "knp_restart_gap_ms_median", "knp_restart_listen_ms", "knp_restart_ready_ms")
}

// startCompare skips t unless hack/compare.sh runs it (root, the lab's
// tools, the peer's binary, NFTPOLICY_COMPARE_RUN, not -short) and returns
// the context that bounds the measurement.
func startCompare(t *testing.T) context.Context {
	t.Helper()
	requireLab(t)
	testenv.Require(t, "the comparison", kubeenv.Tools())
	cluster.RequireCompareRun(t)
	if testing.Short() {
		t.Skip("-short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// printFigures prints each named figure of res as the compare_figure line
// hack/compare.sh collects, once each, and fails t for every one missing
// (run names the measurement that should have given it).
func printFigures(t *testing.T, run string, res *Result, names ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			continue
		}
		seen[name] = true
		v, ok := res.Get(name)
		if !ok {
			t.Errorf("%s gave no %s\n%s", run, name, res.Lines())
			continue
		}
		fmt.Printf("compare_figure: %s=%s\n", name, v)
	}
}
