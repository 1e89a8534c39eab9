package controller

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

var (
	policyPacketsDesc = prometheus.NewDesc("nftpolicy_policy_packets_total",
		"Packets counted by the nft counters of a policy: verdict=allowed by its allow rules, verdict=denied by default-deny rules of isolation chains that name it. Counters restart when a policy's chain is rewritten.",
		[]string{"policy", "direction", "verdict"}, nil)
	nfqueueDroppedDesc = prometheus.NewDesc("nftpolicy_nfqueue_dropped_packets_total",
		"Kernel nfnetlink_queue drops per queue: kind=queue_dropped (queue full), kind=user_dropped (netlink buffer full).",
		[]string{"queue", "kind"}, nil)
	nfqueueWaitingDesc = prometheus.NewDesc("nftpolicy_nfqueue_waiting_packets",
		"Packets waiting in the kernel queue for a verdict.", []string{"queue"}, nil)
)

// CounterCollector reads the rule counters of the nftpolicy table when
// scraped (at most once per interval), over netlink: a rule dump, without
// the sets' elements (nft's listing fetches them all, even with -t: about
// a second of CPU at 150,000 pods). When a read fails, it serves no
// per-policy counters until a read succeeds again, rather than old values
// that look current; each failure is counted in
// nftpolicy_collector_errors_total{collector="nft_counters"} and logged
// (each cause at most once per minute).
type CounterCollector struct {
	read     func(context.Context) ([]nftnl.RuleCounter, error)
	rule     RuleAt
	interval time.Duration
	errs     *errorReporter
	mu       sync.Mutex
	last     time.Time
	cached   []prometheus.Metric
}

// RuleAt returns the typed rule the agent wrote at index i of a chain
// (sets.Syncer.CommittedRule), nil for none.
type RuleAt func(chain string, i int) *compile.TableRule

// NewCounterCollector returns the per-policy packet counter collector,
// reading through conn (best a connection of its own: a scrape then never
// waits for a sync's batch); its failures are counted in m.CollectorErrors.
// It counts for the policies of the rules WithRules names (none without).
func NewCounterCollector(interval time.Duration, conn *nftnl.Conn, m *Metrics, log klog.Logger) *CounterCollector {
	return &CounterCollector{read: conn.RuleCounters, interval: interval, errs: newErrorReporter("nft_counters", m, log)}
}

// WithRules makes the collector read each counted rule's policy in the
// typed rule that rule returns (sets.Syncer.CommittedRule).
func (c *CounterCollector) WithRules(rule RuleAt) *CounterCollector {
	c.rule = rule
	return c
}

// Describe implements prometheus.Collector.
func (c *CounterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- policyPacketsDesc }

// Collect implements prometheus.Collector.
func (c *CounterCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.last) >= c.interval {
		c.last = time.Now()
		c.cached = c.cached[:0]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rules, err := c.read(ctx)
		cancel()
		if err != nil {
			// Before the first sync there is no table, hence no counters
			// (the read returns none); the sync loop, not this collector,
			// reports a table that went away.
			c.errs.report("netlink", fmt.Errorf("reading the rule counters of table inet %s: %w", compile.TableName, err))
		}
		for k, v := range PolicyCounters(rules, c.rule) {
			c.cached = append(c.cached, prometheus.MustNewConstMetric(policyPacketsDesc, prometheus.CounterValue, float64(v), k.Policy, k.Direction, k.Verdict))
		}
	}
	for _, m := range c.cached {
		ch <- m
	}
}

// PolicyCounterKey labels one per-policy counter.
type PolicyCounterKey struct{ Policy, Direction, Verdict string }

// PolicyCounters sums rule counters by policy, as the typed rule the
// agent wrote at each counted place (rule) says: an allow rule's packets
// are its NetworkPolicy's "allowed", a default deny's are "denied" for
// every NetworkPolicy of its isolation chain. A counted rule whose comment
// differs from the typed rule's (the table changed since: a sync or a
// repair under way) counts for no policy.
func PolicyCounters(rules []nftnl.RuleCounter, rule RuleAt) map[PolicyCounterKey]uint64 {
	out := map[PolicyCounterKey]uint64{}
	if rule == nil {
		return out
	}
	for _, rc := range rules {
		r := rule(rc.Chain, rc.Index)
		if r == nil || (r.Comment == nil) != (rc.Comment == "") || r.Comment != nil && *r.Comment != rc.Comment {
			continue
		}
		dir := r.Owner.Direction.String()
		switch r.Owner.Kind {
		case compile.OwnerAllow:
			for _, p := range r.Owner.Policies {
				out[PolicyCounterKey{p, dir, "allowed"}] += rc.Packets
			}
		case compile.OwnerDeny:
			for _, p := range r.Owner.Policies {
				out[PolicyCounterKey{p, dir, "denied"}] += rc.Packets
			}
		}
	}
	return out
}

// QueueStatsCollector exposes the kernel's nfnetlink_queue counters. When
// they cannot be read it serves none; each failure is counted in
// nftpolicy_collector_errors_total{collector="nfqueue_stats"} and logged
// (each cause at most once per minute).
type QueueStatsCollector struct {
	read func() ([]queue.QueueStats, error)
	errs *errorReporter
}

// NewQueueStatsCollector returns the collector of the kernel's queue
// counters; its failures are counted in m.CollectorErrors.
func NewQueueStatsCollector(m *Metrics, log klog.Logger) *QueueStatsCollector {
	return &QueueStatsCollector{read: queue.ReadKernelQueueStats, errs: newErrorReporter("nfqueue_stats", m, log)}
}

// Describe implements prometheus.Collector.
func (*QueueStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nfqueueDroppedDesc
	ch <- nfqueueWaitingDesc
}

// Collect implements prometheus.Collector.
func (c *QueueStatsCollector) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.read()
	if err != nil {
		c.errs.report("read", fmt.Errorf("reading %s: %w", queue.KernelQueueStatsPath, err))
		return
	}
	for _, s := range stats {
		q := strconv.Itoa(int(s.QueueNum))
		ch <- prometheus.MustNewConstMetric(nfqueueDroppedDesc, prometheus.CounterValue, float64(s.QueueDropped), q, "queue_dropped")
		ch <- prometheus.MustNewConstMetric(nfqueueDroppedDesc, prometheus.CounterValue, float64(s.UserDropped), q, "user_dropped")
		ch <- prometheus.MustNewConstMetric(nfqueueWaitingDesc, prometheus.GaugeValue, float64(s.QueueTotal), q)
	}
}

// collectorLogEvery is how often one collector logs one cause of failure;
// a scrape every few seconds must not flood the log.
const collectorLogEvery = time.Minute

// errorReporter counts a collector's failures and logs them, each cause
// at most once per collectorLogEvery, with how many were not logged since.
type errorReporter struct {
	collector string
	counter   prometheus.Counter
	log       klog.Logger
	now       func() time.Time

	mu         sync.Mutex
	logged     map[string]time.Time
	suppressed map[string]int
}

func newErrorReporter(collector string, m *Metrics, log klog.Logger) *errorReporter {
	return &errorReporter{
		collector: collector, counter: m.CollectorErrors.WithLabelValues(collector), log: log, now: time.Now,
		logged: map[string]time.Time{}, suppressed: map[string]int{},
	}
}

func (r *errorReporter) report(cause string, err error) {
	r.counter.Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if last, ok := r.logged[cause]; ok && now.Sub(last) < collectorLogEvery {
		r.suppressed[cause]++
		return
	}
	r.log.Error(err, "Metrics collector failed; its metrics are left out until a read succeeds", "collector", r.collector, "cause", cause,
		"suppressedSinceLastLog", r.suppressed[cause])
	r.logged[cause] = now
	r.suppressed[cause] = 0
}
