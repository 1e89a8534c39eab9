package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// TestMain lets this test binary be the connection benchmark's client
// process (ConnConfig.ClientExec), as nftbench is.
func TestMain(m *testing.M) {
	if os.Getenv(ConnClientEnv) != "" {
		os.Exit(ConnClientMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestParseGoBenchAndReport(t *testing.T) {
	out := `goos: linux
BenchmarkEvaluate/policies=10000-2     	 1000000	      250.0 ns/op	        50.00 allowed-%	       0 B/op
BenchmarkEvaluate/policies=10000-2     	 1000000	      350.0 ns/op	        50.00 allowed-%	       0 B/op
BenchmarkEvaluate/policies=10000-2     	 1000000	      300.0 ns/op	        50.00 allowed-%	       0 B/op
BenchmarkSync/kernel/pods=100000/incremental-remote-2 	 3	 783262797 ns/op	 560.8 build-ms	 213.3 render-ms	 63918 set-elements	 783.0 total-ms	 8.911 tx-ms	 2.000 tx-ops
BenchmarkCompileCommand/excepts=16000-2         	       5	  87230650 ns/op
PASS
`
	r := ParseGoBench(out).Results()
	for name, want := range map[string]string{
		"eval_ns": "300", "eval_ns_min": "250", "sync_kernel_incr_ms_100k": "783", "sync_kernel_incr_build_ms_100k": "560.8",
		"sync_kernel_incr_ops_100k": "2", "sync_set_elements_100k": "63918", "compile_cmd_ms_16000_except": "87.2",
	} {
		if got, _ := r.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	r.Set("hybrid_conn_ratio", 0.97)
	r.Set("program_delay_p99_ms", 80.0)
	r.Set("other", "x")
	rep := Report(r, false)
	if !strings.HasPrefix(rep, "| area | measurement |") {
		t.Errorf("report does not start with the table:\n%s", rep)
	}
	for _, want := range []string{"| 0.97 (`hybrid_conn_ratio`) | ≥ 0.95 | yes |", "| 80 ms (`program_delay_p99_ms`) | ≤ 30 ms | **no** |", "| ≤ 200 ns | **no** |"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	lines := strings.Split(strings.TrimSpace(rep), "\n")
	if last := lines[len(lines)-1]; last != "eval_ns=300" {
		t.Errorf("last line %q, want the last headline value eval_ns=300", last)
	}
	if back := ParseLines(rep); back.Float("hybrid_conn_ratio") != 0.97 || back.Float("other") == back.Float("other") {
		t.Errorf("the report's lines do not parse back: %v", back.Lines())
	}
}

// TestWakeupRoundTrip checks the wake-up figure is a time and that the
// machine rows of the report carry it.
func TestWakeupRoundTrip(t *testing.T) {
	us, err := WakeupRoundTrip(200)
	if err != nil || us <= 0 || us > 1e6 {
		t.Fatalf("WakeupRoundTrip(200) = %v µs, %v; want a positive time under a second", us, err)
	}
	if _, err := WakeupRoundTrip(0); err == nil {
		t.Error("WakeupRoundTrip(0): no error")
	}
	r := &Result{}
	r.Set("machine_cpus", 2)
	r.Set("wakeup_rtt_us_start", us)
	r.Set("wakeup_rtt_us_delay", 30.5)
	want := fmt.Sprintf("| start %s, delay 30.5 |", FormatFloat(us))
	if rep := Report(r, false); !strings.Contains(rep, want) {
		t.Errorf("report lacks %q:\n%s", want, rep)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	if p := Percentile(ds, 50); p != 3 {
		t.Errorf("p50 = %v", p)
	}
	if p := Percentile(ds, 99); p != 5 {
		t.Errorf("p99 = %v", p)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v", m)
	}
}

// TestConnSmoke runs the connection benchmark very briefly: every mode must
// connect, and queue mode must queue exactly one packet per connection on
// each node it crosses.
func TestConnSmoke(t *testing.T) {
	requireLab(t)
	if testing.Short() {
		t.Skip("-short")
	}
	// The clients run in a process of their own (this binary again), as
	// nftbench runs them.
	res, err := RunConn(context.Background(), ConnConfig{Rounds: 2, Duration: 50 * time.Millisecond, ClientExec: os.Args[0], Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ConnModes {
		for _, p := range ConnPaths {
			if res.Float(m+"_rate_"+p) <= 0 {
				t.Errorf("%s mode, %s path: no connection\n%s", m, p, res.Lines())
			}
		}
		if f := res.Float(m + "_failed"); f != 0 {
			t.Errorf("%s mode: %v failed connections", m, f)
		}
	}
	for _, p := range ConnPaths {
		if q := res.Float("queued_packets_per_conn_" + p); q != 1 {
			t.Errorf("queue mode, %s path: %v packets queued per connection, want 1", p, q)
		}
	}
}

// BenchmarkConnect makes b.N connections (connect, FIN; the drain server) from the
// client pod to a server on the same node or across nodes, in each mode;
// ns/op is one connection, p50-µs its connect latency. hack/bench.sh's
// interleaved rounds (nftbench conn) are the numbers to compare modes with
// on a shared machine.
func BenchmarkConnect(b *testing.B) {
	requireLab(b)
	for _, m := range ConnModes {
		b.Run(m, func(b *testing.B) {
			l, err := newConnLab(context.Background(), m, queueVariant(b), 1, false)
			if err != nil {
				b.Fatal(err)
			}
			defer l.close()
			for _, p := range ConnPaths {
				b.Run(p, func(b *testing.B) {
					cfg := ConnConfig{Duration: time.Hour, MaxConns: b.N}
					cfg.defaults()
					b.ResetTimer()
					s := l.measure(p, 1, cfg)
					b.StopTimer()
					if s.err != nil || s.failed > 0 {
						b.Fatalf("%v, %d failed: %v", s.err, s.failed, s.reasons)
					}
					b.ReportMetric(micros(Percentile(s.lat, 50)), "p50-µs")
					if m == ModeQueue {
						var q uint64
						for _, n := range s.queued {
							q = max(q, n)
						}
						b.ReportMetric(float64(q)/float64(s.ok), "queued/conn")
					}
				})
			}
		})
	}
}

// queueVariant probes the kernel's queue rule variant for a benchmark.
func queueVariant(b testing.TB) compile.QueueVariant {
	v, err := queuerule.ProbeQueueVariant(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return compile.QueueVariant(v.String())
}

// requireLab stops a test or benchmark that builds network namespaces and
// runs agents when root, ip or nft is missing (skip, or fail with
// NFTPOLICY_REQUIRE_TOOLS set).
func requireLab(tb testing.TB) {
	tb.Helper()
	testenv.Require(tb, "bench", testenv.Root("create network namespaces and program nftables and NFQUEUE in them"), testenv.Binaries("ip", "nft"))
}

// TestScaleTargets: issue 31's figures are checked against its targets,
// and the policy-scale measurement gets rows of its own.
func TestScaleTargets(t *testing.T) {
	r := ParseLines(`rss_mb_10k=65
rss_mb_100k=200
rss_mb_150k=205
rss_peak_mb_150k=290
startup_s_150k=21.5
startup_agent_cpu_s_150k=1.5
full_sync_ms_100k=1350
full_resync_ms_100k=900
incr_sync_ms_150k=0.3
rss_marginal_kib_per_pod=1.024
policy_scale_cluster_policies=100
full_sync_ms_150k_10k_policies=2500
policy_sync_ms_150k_10k_policies=4.2
rss_mb_150k_10k_policies=230
`)
	rep := Report(r, false)
	for _, want := range []string{
		"| 205 MiB (`rss_mb_150k`) | ≤ 210 MiB | yes |",
		"| 290 MiB (`rss_peak_mb_150k`) | ≤ 300 MiB | yes |",
		"| 21.5 s (`startup_s_150k`) | ≤ 5 s | **no** |",
		"| 1.5 s (`startup_agent_cpu_s_150k`) | ≤ 2 s | yes |",
		"| 1350 ms (`full_sync_ms_100k`) | ≤ 1000 ms | **no** |",
		"| 900 ms (`full_resync_ms_100k`) | ≤ 1000 ms | yes |",
		"| 0.3 ms (`incr_sync_ms_150k`) | ≤ 1 ms | yes |",
		"| 1.024 KiB (`rss_marginal_kib_per_pod`) | ≤ 1 KiB | **no** |",
		"| agent, 150k pods, 10k NetworkPolicies | one NetworkPolicy change (kind=policies), p50 | 4.2 ms (`policy_sync_ms_150k_10k_policies`) | ≤ 5 ms | yes |",
		"| agent, 150k pods, 10k NetworkPolicies | first full sync, node without the table (nftpolicy_sync_duration_seconds, kind=full) | 2500 ms (`full_sync_ms_150k_10k_policies`) |",
	} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	// The policy scale's figures are not a cluster size of their own.
	if strings.Contains(rep, "agent, 150k_10k_policies pods") {
		t.Errorf("the policy scale's figures read as a cluster size:\n%s", rep)
	}
}

// TestScaleChart draws one line per series with a point per measured size.
func TestScaleChart(t *testing.T) {
	r := ParseLines("rss_mb_1k=60\nincr_sync_ms_1k=0.5\nfull_sync_ms_1k=20\nrss_mb_100k=240\nincr_sync_ms_100k=0.9\nfull_sync_ms_100k=1800\n")
	svg, err := ScaleChart(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "one-pod change, p50: 0.9 at 100k pods", "full sync: 1800 at 100k pods", "RSS after settling: 240 at 100k pods"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if strings.Count(svg, "<path ") != 3 {
		t.Errorf("%d lines drawn, want 3 (no data for max and heap)", strings.Count(svg, "<path "))
	}
	if _, err := ScaleChart(ParseLines("rss_mb_1k=60\n")); err == nil {
		t.Error("a chart of one size drawn without complaint")
	}
	// The full run's five sizes, and the policy scale's figures, which
	// are not a size: one tick and one point per size.
	var lines strings.Builder
	for _, sz := range []string{"1k", "10k", "50k", "100k", "150k", "150k_10k_policies"} {
		fmt.Fprintf(&lines, "rss_mb_%s=100\nincr_sync_ms_%s=0.3\nfull_sync_ms_%s=900\n", sz, sz, sz)
	}
	svg, err = ScaleChart(ParseLines(lines.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">150k</text>", "full sync: 900 at 150k pods", "RSS after settling: 100 at 1k pods"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<circle "); n != 3*5 {
		t.Errorf("%d points drawn, want 15 (3 series at 5 sizes)", n)
	}
	for sz, want := range map[string]int{"1k": 1000, "150k": 150000, "2000": 2000, "150k_10k_policies": 0, "0k": 0, "k": 0, "+5k": 0, "010k": 0} {
		if got := sizePods(sz); got != want {
			t.Errorf("sizePods(%q) = %d, want %d", sz, got, want)
		}
	}
}

// TestCompareChart draws a bar per mode and path in each of the three
// panels from hack/compare.sh's lines, each bar titled with its figure,
// and leaves out a figure the run did not give.
func TestCompareChart(t *testing.T) {
	var lines strings.Builder
	for i, m := range []string{ModeControl, ModeConntrack, ModeHybrid, ModeQueue, ModeKNP} {
		for j, p := range ConnPaths {
			if m == ModeKNP && p == PathCross {
				continue // missing: no bar
			}
			fmt.Fprintf(&lines, "%s_rate_%s=%d\n%s_p50_us_%s=%d\n%s_p99_us_%s=%d\n", m, p, 10000-1000*i-100*j, m, p, 20+10*i+j, m, p, 300+100*i+j)
		}
	}
	lines.WriteString("knp_version=v0.8.0\n")
	svg, err := CompareChart(ParseLines(lines.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "<title>nftpolicy hybrid, same node: 8000</title>", "<title>kube-network-policies, same node: 6000</title>",
		"<title>nftpolicy queue, cross node: 51</title>", "<title>no policy, cross node: 301</title>", "kube-network-policies</text>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<title>"); n != 3*9 {
		t.Errorf("%d bars drawn, want %d (3 panels of 5 modes on 2 paths, one figure missing)", n, 3*9)
	}
	if _, err := CompareChart(ParseLines("knp_conn_ratio=0.2\n")); err == nil {
		t.Error("a chart without connection figures drawn without complaint")
	}
}
