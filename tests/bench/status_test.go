package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestSumRequests(t *testing.T) {
	metrics := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="nftpolicy.io",resource="nodeenforcements",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 1003
apiserver_request_total{code="404",component="apiserver",dry_run="",group="nftpolicy.io",resource="nodeenforcements",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 40
apiserver_request_total{code="201",component="apiserver",dry_run="",group="nftpolicy.io",resource="nodeenforcements",scope="resource",subresource="",verb="POST",version="v1alpha1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="nftpolicy.io",resource="nodeenforcements",scope="cluster",subresource="",verb="LIST",version="v1alpha1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PUT",version="v1"} 40
`
	got, err := sumRequests(metrics, "nodeenforcements", writeVerbs)
	if err != nil || total(got) != 1083 || got["404"] != 40 || len(got) != 3 {
		t.Errorf("sumRequests = %v, %v; want 1083 in all (the PATCHes and POSTs by code)", got, err)
	}
	if _, err := sumRequests("go_goroutines 12\n", "nodeenforcements", writeVerbs); err == nil {
		t.Error("metrics without apiserver_request_total: no error")
	}
	if _, err := sumRequests("apiserver_request_total{verb=\"PATCH\"}12\n", "nodeenforcements", writeVerbs); err == nil {
		t.Error("a malformed sample: no error")
	}
}

// TestStatusAPI runs the status benchmark's first part small: every
// node enforces every policy when timed, one change costs exactly one
// write per node, and a burst costs at least one and at most one per
// change.
func TestStatusAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	cfg := StatusConfig{Nodes: 40, Policies: 10, Runs: 2, Burst: 5, BurstWindow: 25 * time.Millisecond, Logf: t.Logf}
	cfg.defaults()
	res := &Result{}
	if err := measureStatusAPI(context.Background(), t, cfg, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", res.Lines())
	if v := res.Float("status_gather_ms_40_nodes"); !(v > 0) {
		t.Errorf("status_gather_ms_40_nodes = %v", v)
	}
	if v := res.Float("status_gather_listed_kib_40_nodes"); !(v > 40) {
		t.Errorf("status_gather_listed_kib_40_nodes = %v: less than 1 KiB per node", v)
	}
	if v := res.Float("status_api_writes_per_change_40_nodes"); v != 1 {
		t.Errorf("status_api_writes_per_change_40_nodes = %v, want 1", v)
	}
	if v := res.Float("status_api_writes_per_burst_of_5_40_nodes"); !(v >= 1 && v <= 5) {
		t.Errorf("status_api_writes_per_burst_of_5_40_nodes = %v, want 1 to 5", v)
	}
	if _, ok := res.Get("status_reporter_write_errors"); ok {
		t.Errorf("the reporters' writes failed:\n%s", res.Lines())
	}
}

// TestWaitLatency times a few rounds of create -> status.Wait with two
// real agents; it skips while the agents write no NodeEnforcement.
func TestWaitLatency(t *testing.T) {
	requireLab(t)
	if testing.Short() {
		t.Skip("-short")
	}
	res := &Result{}
	skip, err := measureWaitLatency(context.Background(), t, StatusConfig{WaitRounds: 3, Logf: t.Logf}, res)
	if err != nil {
		t.Fatal(err)
	}
	if skip != "" {
		t.Skip(skip)
	}
	t.Logf("\n%s", res.Lines())
	if p50, p90 := res.Float("wait_latency_ms_p50"), res.Float("wait_latency_ms_p90"); !(p50 > 0 && p90 >= p50) {
		t.Errorf("wait_latency_ms_p50 = %v, p90 = %v", p50, p90)
	}
}

// TestReportWaitMinusDelay: the report derives what wait adds to the
// programming delay, when both sections ran, and checks its target.
func TestReportWaitMinusDelay(t *testing.T) {
	r := ParseLines("wait_latency_ms_p50=31.5\nprogram_delay_p50_ms=8.25\nstatus_gather_ms_1000_nodes=900\n")
	rep := Report(r, false)
	for _, want := range []string{"| 23.25 ms (`wait_latency_minus_program_delay_ms`) | ≤ 20 ms | **no** |",
		"| 900 ms (`status_gather_ms_1000_nodes`) | ≤ 2000 ms | yes |", "\nwait_latency_minus_program_delay_ms=23.25\n"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
	if rep := Report(ParseLines("wait_latency_ms_p50=31.5\n"), false); strings.Contains(rep, "wait_latency_minus_program_delay_ms=") {
		t.Error("derived without program_delay_p50_ms")
	}
}
