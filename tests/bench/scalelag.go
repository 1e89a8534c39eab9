package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// programLagBuckets is the agent's nftpolicy_program_lag_seconds
// histogram: from a kernel commit to the publication of its program to
// the evaluator.
const programLagBuckets = "nftpolicy_program_lag_seconds_bucket"

// histogramQuantile is the q quantile of what a histogram observed between
// two scrapes, interpolated within its bucket as Prometheus'
// histogram_quantile does (the +Inf bucket: its lower bound); false when
// nothing was observed (or the agent has no such histogram).
func histogramQuantile(before, after map[string]float64, buckets string, q float64) (float64, bool) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := buckets + `{le="`
	for k, v := range after {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		s := strings.TrimSuffix(k[len(prefix):], `"}`)
		le, err := strconv.ParseFloat(s, 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmpFloat(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].n <= 0 {
		return 0, false
	}
	rank := q * bs[len(bs)-1].n
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return lo, true
			}
			if b.n == below {
				return b.le, true
			}
			return lo + (b.le-lo)*(rank-below)/(b.n-below), true
		}
		lo, below = b.le, b.n
	}
	return lo, true
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// setLag records, as name (milliseconds), the 99th percentile of the
// evaluator's lag behind the kernel between two scrapes, and keeps
// evaluator_lag_ms_p99 the largest of those recorded.
func setLag(res *Result, name string, before, after map[string]float64) {
	p99, ok := histogramQuantile(before, after, programLagBuckets, 0.99)
	if !ok {
		return
	}
	ms := round(p99*1000, 3)
	res.Set(name, ms)
	if prev := res.Float("evaluator_lag_ms_p99"); math.IsNaN(prev) || ms > prev {
		res.Set("evaluator_lag_ms_p99", ms)
	}
}

// measureQueueMode restarts the agent in queue mode over the last size's
// cluster and times one-pod changes there as in hybrid mode: the sync that
// carries each change, whichever kind it is (the tracker's "pods", or a
// rebuild), and the evaluator's lag behind the kernel. The agent is left
// stopped; its arguments are restored.
func measureQueueMode(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, agent *cluster.Agent, n int, cfg ScaleConfig, res *Result) error {
	sz := sizeName(n)
	if err := agent.Stop(10 * time.Second); err != nil {
		return err
	}
	saved := agent.ExtraArgs
	agent.ExtraArgs = append(slices.Clone(saved), "--mode", "queue")
	defer func() { agent.ExtraArgs = saved }()
	if err := bootNode(c); err != nil {
		return err
	}
	if _, _, err := startAgentTimed(ctx, c, agent, sz, "queue-mode first sync", "queue_full_sync", cfg, res); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	_, prog, rs, err := scaleProgram(ctx, c)
	if err != nil {
		return err
	}
	ns, name, err := pickScalePod(prog, rs)
	if err != nil {
		return err
	}
	before, err := scrape(ctx, agent)
	if err != nil {
		return err
	}
	incr, err := timePodChangesAs(ctx, cs, agent, ns, name, cfg.Incremental, "pods", "incremental", "full")
	if err != nil {
		return err
	}
	after, err := scrape(ctx, agent)
	if err != nil {
		return err
	}
	count := func(kind string) float64 {
		k := `nftpolicy_sync_duration_seconds_count{kind="` + kind + `"}`
		return after[k] - before[k]
	}
	res.Set("queue_incr_sync_ms_"+sz, millis(Percentile(incr, 50)))
	res.Set("queue_incr_sync_ms_max_"+sz, millis(Percentile(incr, 100)))
	res.Set("queue_incr_full_builds_"+sz, count("incremental")+count("full"))
	setLag(res, "queue_evaluator_lag_ms_p99_"+sz, before, after)
	cfg.Logf("scale: queue mode, %d pods: one-pod change p50 %v max %v, %v of %d by a full build", n,
		Percentile(incr, 50).Round(10*time.Microsecond), Percentile(incr, 100).Round(10*time.Microsecond),
		count("incremental")+count("full"), len(incr))
	return agent.Stop(10 * time.Second)
}

// waitSyncOf is waitSync for the first sync of any of kinds.
func waitSyncOf(ctx context.Context, agent *cluster.Agent, kinds []string, before map[string]float64) (time.Duration, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		m, err := agent.Metrics(ctx)
		for _, kind := range kinds {
			cnt, sum := `nftpolicy_sync_duration_seconds_count{kind="`+kind+`"}`, `nftpolicy_sync_duration_seconds_sum{kind="`+kind+`"}`
			if err == nil && m[cnt] > before[cnt] {
				return time.Duration((m[sum] - before[sum]) / (m[cnt] - before[cnt]) * float64(time.Second)), nil
			}
		}
		if !agent.Running() {
			return 0, fmt.Errorf("the agent exited; log tail:\n%s", agent.LogTail(30))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, fmt.Errorf("no %v sync within 3 minutes; log tail:\n%s", kinds, agent.LogTail(30))
}
