package denylog

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Defaults of Config.
const (
	DefaultGroup        = 100
	DefaultFlowInterval = 30 * time.Second
	DefaultLinesPerSec  = 50
	// copyRange is how much of each packet the kernel copies: enough for
	// an IPv6 header, a few extension headers and the ports.
	copyRange = 256
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
	// NetNS, when not 0, is a network namespace file descriptor to read
	// the group in (tests); 0 is the caller's.
	NetNS int
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

// New returns a Logger; Run reads the group.
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

// Run reads the NFLOG group until ctx ends.
func (l *Logger) Run(ctx context.Context) error {
	return ReadGroup(ctx, l.cfg.Group, l.cfg.NetNS, l.log, "Reading the deny log", func(prefix string, payload []byte) {
		l.Handle(prefix, payload, time.Now())
	}, l.metrics.Dropped.WithLabelValues("read_error"))
}

// ReadGroup reads an NFLOG group (in network namespace netns, 0: the
// caller's) until ctx ends, handing each message's prefix and the start of
// its packet to handle; read errors (a full socket buffer loses messages,
// not the reader) are counted in readErrors. what names the reader in its
// log lines.
func ReadGroup(ctx context.Context, group uint16, netns int, log klog.Logger, what string, handle func(prefix string, payload []byte),
	readErrors prometheus.Counter) error {
	// QThresh 1: the kernel sends each message at once. Its default
	// batches up to 100 messages or one second, which would delay a
	// lone message's line by a second; the kernel's limits keep the
	// message rate low.
	nf, err := nflog.Open(&nflog.Config{Group: group, Copymode: nflog.CopyPacket, Bufsize: copyRange, NetNS: netns, QThresh: 1,
		Logger: nflogLogger{log}})
	if err != nil {
		return fmt.Errorf("opening NFLOG group %d: %w", group, err)
	}
	defer nf.Close()
	err = nf.RegisterWithErrorFunc(ctx, func(a nflog.Attribute) int {
		if a.Prefix != nil && a.Payload != nil {
			handle(*a.Prefix, *a.Payload)
		}
		return 0
	}, func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		log.V(2).Info(what, "err", err)
		readErrors.Inc()
		return 0
	})
	if err != nil {
		return fmt.Errorf("binding NFLOG group %d: %w", group, err)
	}
	log.Info(what, "group", group)
	<-ctx.Done()
	return nil
}

// Handle logs one message of the group: its prefix (the deny id) and the
// start of the packet.
func (l *Logger) Handle(prefix string, payload []byte, now time.Time) {
	p, err := queue.ParsePacket(payload)
	if err != nil {
		l.metrics.Dropped.WithLabelValues("unparsable").Inc()
		return
	}
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

// nflogLogger adapts klog to go-nflog's logger; it reports its shutdown
// through Errorf, so everything goes to verbose levels.
type nflogLogger struct{ l klog.Logger }

func (n nflogLogger) Debugf(format string, args ...any) {
	if v := n.l.V(5); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...))
	}
}

func (n nflogLogger) Errorf(format string, args ...any) {
	if v := n.l.V(3); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...))
	}
}
