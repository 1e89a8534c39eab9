package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
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
		Modes: []string{ModeConntrack, ModeHybrid, ModeQueue, ModeQueueWide, ModeKNP}}
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
	// Failed allowed connections are figures, not failures: queue mode's
	// per-source share of the queue (30,000 new connections a second)
	// would drop a SYN of a client thread that opens more (the connect
	// then times out after a second); queue_wide raises the share out of
	// reach.
	for _, m := range append([]string{ModeControl}, cfg.Modes...) {
		fmt.Printf("compare_figure: %s_failed=%v\n", m, res.Float(m+"_failed"))
	}
	fmt.Printf("compare_figure: conn_rounds=%d\n", cfg.Rounds)
	// Per mode and path, for the chart (nftbench comparechart).
	var perPath []string
	for _, m := range append([]string{ModeControl}, cfg.Modes...) {
		for _, p := range ConnPaths {
			perPath = append(perPath, m+"_rate_"+p, m+"_p50_us_"+p, m+"_p99_us_"+p)
		}
	}
	printFigures(t, "RunConn", res, append(perPath, "knp_conn_ratio", "hybrid_vs_knp_conn_ratio", "queue_vs_knp_conn_ratio", "queue_wide_vs_knp_conn_ratio",
		"knp_conn_ratio_same", "knp_conn_ratio_cross", "hybrid_conn_ratio", "queue_conn_ratio", "conntrack_conn_ratio",
		"control_p50_us", "control_p99_us", "conntrack_p50_us", "conntrack_p99_us", "hybrid_p50_us", "hybrid_p99_us",
		"queue_p50_us", "queue_p99_us", "knp_p50_us", "knp_p99_us")...)
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

// TestCompareRestart kills each enforcer's agent with SIGKILL under a
// connection loop (RunRestart's, the one nftpolicy's queue-mode restart
// figures come from): kube-network-policies and nftpolicy in queue and in
// hybrid mode (its default), each in its default fail mode (fail-closed,
// for both) and with --fail-open, and prints the denied connections
// admitted, the allowed ones that failed and the gap for hack/compare.sh
// (restartPrefix names them: knp_restart_*, knp_failopen_restart_*,
// queue_restart_*, ...). It fails when an agent does not come back (the
// loop's restart errors), when a fail-closed enforcer admitted a denied
// connection, or when a figure is missing.
func TestCompareRestart(t *testing.T) {
	ctx := startCompare(t)
	for _, rc := range compareRestarts {
		rc.Logf = t.Logf
		p := restartPrefix(rc.Enforcer, rc.Mode, rc.FailOpen)
		res, err := RunRestart(ctx, rc)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !rc.FailOpen && res.Float(p+"admitted_denied") != 0 {
			t.Errorf("%s: fail-closed, yet %v denied connections were admitted", p, res.Float(p+"admitted_denied"))
		}
		printFigures(t, "RunRestart", res, p+"restarts", p+"admitted_denied", p+"failed_allowed",
			p+"gap_ms", p+"gap_ms_median", p+"listen_ms", p+"ready_ms")
	}
}

// compareRestarts are TestCompareRestart's runs.
var compareRestarts = []RestartConfig{
	{Enforcer: cluster.EnforcerKNP},
	{Enforcer: cluster.EnforcerKNP, FailOpen: true},
	{Mode: compile.ModeQueue},
	{Mode: compile.ModeQueue, FailOpen: true},
	{Mode: compile.ModeHybrid},
	{Mode: compile.ModeHybrid, FailOpen: true},
}

// TestCompareRSS measures the resident memory of one node's agent with
// 1k and 10k pods in the API (RunRSS), kube-network-policies and nftpolicy
// in hybrid mode, and prints issue 30's knp_rss_mb_* and rss_mb_* for
// hack/compare.sh. It fails when a figure is missing or not positive.
func TestCompareRSS(t *testing.T) {
	ctx := startCompare(t)
	res, err := RunRSS(ctx, RSSConfig{Scale: ScaleConfig{Logf: t.Logf}})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range []string{"knp_rss_", "rss_"} {
		for _, sz := range []string{"1k", "10k"} {
			want = append(want, p+"mb_"+sz, p+"peak_mb_"+sz)
			if !(res.Float(p+"mb_"+sz) > 0) {
				t.Errorf("%smb_%s is %v\n%s", p, sz, res.Float(p+"mb_"+sz), res.Lines())
			}
		}
	}
	printFigures(t, "RunRSS", res, want...)
}

// TestCompareNewPod runs the new-pod window (RunNewPodWindow: new pods
// that connect before their API object exists, half of them denied) with
// kube-network-policies and with nftpolicy in hybrid mode as the agents,
// and prints issue 30's knp_new_pod_leaked_packets and
// new_pod_leaked_packets for hack/compare.sh. It fails when nftpolicy
// admitted a denied pod's packet (its unknown-pod path holds them) or an
// allowed pod's connection failed, or when a figure is missing; the
// peer's leaks are a figure, not a failure.
func TestCompareNewPod(t *testing.T) {
	ctx := startCompare(t)
	for _, e := range []cluster.Enforcer{cluster.EnforcerKNP, cluster.EnforcerNftpolicy} {
		res, err := RunNewPodWindow(ctx, NewPodWindowConfig{Enforcer: e, Logf: t.Logf})
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		p := ""
		if e == cluster.EnforcerKNP {
			p = "knp_"
		} else if res.Float("new_pod_leaked_packets") != 0 || res.Float("new_pod_allowed_failed") != 0 {
			t.Errorf("nftpolicy: %v denied packets admitted, %v allowed connections failed\n%s",
				res.Float("new_pod_leaked_packets"), res.Float("new_pod_allowed_failed"), res.Lines())
		}
		printFigures(t, "RunNewPodWindow", res, p+"new_pod_leaked_packets", p+"new_pod_allowed_failed",
			p+"new_pod_first_packet_delay_ms_p50", p+"new_pod_first_packet_delay_ms_p99", p+"new_pod_pods")
	}
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
