package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
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
// scraped (at most once per interval, without set elements: `nft -t`).
type CounterCollector struct {
	nftPath  string
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	cached   []prometheus.Metric
}

// NewCounterCollector returns the per-policy packet counter collector.
func NewCounterCollector(interval time.Duration) *CounterCollector {
	return &CounterCollector{nftPath: "nft", interval: interval}
}

// Describe implements prometheus.Collector.
func (c *CounterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- policyPacketsDesc }

// Collect implements prometheus.Collector.
func (c *CounterCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.last) >= c.interval {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := exec.CommandContext(ctx, c.nftPath, "-t", "-j", "list", "table", "inet", compile.TableName).Output()
		cancel()
		if err == nil {
			if counts, err := ParsePolicyCounters(out); err == nil {
				c.cached = c.cached[:0]
				for k, v := range counts {
					c.cached = append(c.cached, prometheus.MustNewConstMetric(policyPacketsDesc, prometheus.CounterValue, float64(v), k.Policy, k.Direction, k.Verdict))
				}
			}
		}
		c.last = time.Now()
	}
	for _, m := range c.cached {
		ch <- m
	}
}

// PolicyCounterKey labels one per-policy counter.
type PolicyCounterKey struct{ Policy, Direction, Verdict string }

// ParsePolicyCounters sums the counters of `nft -j list table` output by
// policy: allow rules carry the comment "ns/name direction[i]", default-deny
// rules "default deny direction: ns/a, ns/b".
func ParsePolicyCounters(data []byte) (map[PolicyCounterKey]uint64, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing nft json: %w", err)
	}
	out := map[PolicyCounterKey]uint64{}
	for _, obj := range doc.Nftables {
		raw, ok := obj["rule"]
		if !ok {
			continue
		}
		var r struct {
			Comment string            `json:"comment"`
			Expr    []json.RawMessage `json:"expr"`
		}
		if err := json.Unmarshal(raw, &r); err != nil || r.Comment == "" {
			continue
		}
		var packets uint64
		found := false
		for _, e := range r.Expr {
			if !bytes.Contains(e, []byte(`"counter"`)) {
				continue
			}
			var ce struct {
				Counter struct {
					Packets uint64 `json:"packets"`
				} `json:"counter"`
			}
			if json.Unmarshal(e, &ce) == nil {
				packets, found = ce.Counter.Packets, true
			}
		}
		if !found {
			continue
		}
		if rest, ok := strings.CutPrefix(r.Comment, "default deny "); ok {
			dir, pols, ok := strings.Cut(rest, ": ")
			if !ok {
				continue
			}
			for _, p := range strings.Split(pols, ", ") {
				if p = strings.TrimSuffix(p, "..."); strings.Contains(p, "/") {
					out[PolicyCounterKey{p, dir, "denied"}] += packets
				}
			}
			continue
		}
		pol, rest, ok := strings.Cut(r.Comment, " ")
		if !ok || !strings.Contains(pol, "/") {
			continue
		}
		dir, _, _ := strings.Cut(rest, "[")
		if dir == "ingress" || dir == "egress" {
			out[PolicyCounterKey{pol, dir, "allowed"}] += packets
		}
	}
	return out, nil
}

// QueueStatsCollector exposes the kernel's nfnetlink_queue counters.
type QueueStatsCollector struct{}

// Describe implements prometheus.Collector.
func (QueueStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nfqueueDroppedDesc
	ch <- nfqueueWaitingDesc
}

// Collect implements prometheus.Collector.
func (QueueStatsCollector) Collect(ch chan<- prometheus.Metric) {
	stats, err := queue.ReadKernelQueueStats()
	if err != nil {
		return
	}
	for _, s := range stats {
		q := strconv.Itoa(int(s.QueueNum))
		ch <- prometheus.MustNewConstMetric(nfqueueDroppedDesc, prometheus.CounterValue, float64(s.QueueDropped), q, "queue_dropped")
		ch <- prometheus.MustNewConstMetric(nfqueueDroppedDesc, prometheus.CounterValue, float64(s.UserDropped), q, "user_dropped")
		ch <- prometheus.MustNewConstMetric(nfqueueWaitingDesc, prometheus.GaugeValue, float64(s.QueueTotal), q)
	}
}
