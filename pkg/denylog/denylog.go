package denylog

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Defaults of Config.
const (
	DefaultGroup        = 100
	DefaultFlowInterval = 30 * time.Second
	DefaultLinesPerSec  = 50
	// maxFlows bounds the per-flow rate limiter's memory.
	maxFlows = 16384
)

// Config configures a Logger.
type Config struct {
	// Group is the NFLOG group the ruleset logs to.
	Group uint16
	// Node is this node's name, written on every line.
	Node string
	// Program returns the program in force (the evaluator's): ids and
	// addresses are resolved against it.
	Program func() *compile.Program
	// FlowInterval is the least time between two lines for one (source,
	// destination, policy); LinesPerSecond bounds all lines (burst the same).
	FlowInterval   time.Duration
	LinesPerSecond int
	Logger         klog.Logger
}

// Defaults fills unset fields.
func (c Config) Defaults() Config {
	if c.Group == 0 {
		c.Group = DefaultGroup
	}
	if c.FlowInterval == 0 {
		c.FlowInterval = DefaultFlowInterval
	}
	if c.LinesPerSecond == 0 {
		c.LinesPerSecond = DefaultLinesPerSec
	}
	return c
}

// Metrics are the deny log's Prometheus metrics.
type Metrics struct {
	// Denied counts denied connections the kernel logged, per policy (the
	// kernel's own limit applies first; nftpolicy_policy_packets_total
	// counts every dropped packet).
	Denied *prometheus.CounterVec
	// Dropped counts log lines not written, by reason: the per-flow or the
	// overall rate limit, an unknown id, or an unparsable packet.
	Dropped *prometheus.CounterVec
}

// NewMetrics creates the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Denied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_denied_connections_total",
			Help: "Denied connections logged by the kernel path (after the kernel's log rate limit), by deciding policy: kind=NetworkPolicy (policy: the isolating policies) or ClusterNetworkPolicy."},
			[]string{"kind", "policy"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_deny_log_lines_dropped_total",
			Help: "Deny log messages not written as log lines: reason=flow_rate_limit (same source, destination and policy within the interval), rate_limit (lines per second), unknown_id, unparsable."},
			[]string{"reason"}),
	}
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.Denied, m.Dropped} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

type flowKey struct {
	src, dst netip.Addr
	id       string
}

// Logger writes the deny log.
type Logger struct {
	cfg     Config
	metrics *Metrics
	log     klog.Logger
	lines   *rate.Limiter

	mu    sync.Mutex
	flows map[flowKey]time.Time
	prog  *compile.Program
	ids   map[string]compile.DenyInfo
}

// New returns a Logger; its group's reader (pkg/nflogread) hands it the
// group's messages (Consumer).
func New(cfg Config, m *Metrics) (*Logger, error) {
	cfg = cfg.Defaults()
	if cfg.Program == nil {
		return nil, errors.New("denylog: Config.Program is required")
	}
	if m == nil {
		m = NewMetrics()
	}
	return &Logger{cfg: cfg, metrics: m, log: cfg.Logger, lines: rate.NewLimiter(rate.Limit(cfg.LinesPerSecond), cfg.LinesPerSecond),
		flows: map[flowKey]time.Time{}}, nil
}

// Consumer is the Logger as its group's reader (pkg/nflogread) takes it:
// the deny ids are its.
func (l *Logger) Consumer() nflogread.Consumer {
	return nflogread.Consumer{Group: l.cfg.Group, Name: "Reading the deny log", Claims: compile.IsDenyID, Handle: l.Handle,
		Dropped: l.metrics.Dropped, Logger: l.log}
}

// Handle logs one message of the group: its prefix (the deny id) and the
// start of the packet.
func (l *Logger) Handle(prefix string, p queue.Packet, now time.Time) {
	prog := l.cfg.Program()
	info, ok := l.resolveID(prog, prefix)
	if !ok {
		l.metrics.Dropped.WithLabelValues("unknown_id").Inc()
		l.log.V(2).Info("Deny log message with an unknown id", "denyId", prefix, "src", p.Src, "dst", p.Dst)
		return
	}
	l.metrics.Denied.WithLabelValues(info.Kind, info.Policy).Inc()
	if !l.allowFlow(flowKey{p.Src, p.Dst, prefix}, now) {
		l.metrics.Dropped.WithLabelValues("flow_rate_limit").Inc()
		return
	}
	if !l.lines.AllowN(now, 1) {
		l.metrics.Dropped.WithLabelValues("rate_limit").Inc()
		return
	}
	kv := []any{
		"src", Endpoint(prog, p.Src), "srcIP", p.Src.String(),
		"dst", Endpoint(prog, p.Dst), "dstIP", p.Dst.String(),
		"protocol", compile.Protocol(p.Proto).String(), "port", p.DstPort,
		"direction", info.Direction.String(), "policyKind", info.Kind, "policy", info.Policy,
	}
	if info.Kind == compile.DenyKindClusterNetworkPolicy {
		kv = append(kv, "tier", info.Tier.String())
	}
	kv = append(kv, "rule", info.Rule, "node", l.cfg.Node, "denyId", prefix)
	l.log.Info("Denied connection", kv...)
}

// resolveID maps a deny id through the program's deny table, computed
// once per program.
func (l *Logger) resolveID(prog *compile.Program, id string) (compile.DenyInfo, bool) {
	if prog == nil {
		return compile.DenyInfo{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if prog != l.prog {
		l.prog, l.ids = prog, compile.DenyIDs(prog)
	}
	info, ok := l.ids[id]
	return info, ok
}

// allowFlow lets one line per flow through per FlowInterval.
func (l *Logger) allowFlow(k flowKey, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return AllowFlow(l.flows, k, now, l.cfg.FlowInterval)
}

// AllowFlow lets one line per flow key through per interval, remembering
// when in flows (at most maxFlows keys: under a flood of distinct flows
// it forgets them rather than grow; an overall line limit still bounds
// the output). The caller holds flows' lock.
func AllowFlow[K comparable](flows map[K]time.Time, k K, now time.Time, interval time.Duration) bool {
	if last, ok := flows[k]; ok && now.Sub(last) < interval {
		return false
	}
	if len(flows) >= maxFlows {
		for f, t := range flows {
			if now.Sub(t) >= interval {
				delete(flows, f)
			}
		}
		if len(flows) >= maxFlows {
			clear(flows)
		}
	}
	flows[k] = now
	return true
}

// Endpoint names an address: "ns/pod", "node:name", or the address.
func Endpoint(p *compile.Program, a netip.Addr) string {
	if p == nil {
		return a.String()
	}
	if id, ok := p.PodByIP(a); ok {
		return p.Pods[id].Key
	}
	for name, addrs := range p.NodeAddrs {
		for _, x := range addrs {
			if x == a {
				return "node:" + name
			}
		}
	}
	return a.String()
}
