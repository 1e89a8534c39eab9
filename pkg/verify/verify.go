package verify

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/nflogread"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// Defaults of Config.
const (
	// DefaultGroup is two above the deny log's default group (100); the
	// one between is left to other NFLOG readers of the agent.
	DefaultGroup = 102
	// DefaultSettle is how long a disagreement waits to be confirmed: well
	// over the default program refresh delay (100 ms), under a second.
	DefaultSettle          = 500 * time.Millisecond
	DefaultChecksPerSecond = 2000
	DefaultLinesPerSecond  = 10
	// maxPending bounds the disagreements waiting to be confirmed; past
	// it one is confirmed at once.
	maxPending = 1024
)

// Evaluator decides connections with the program in force: the agent's
// *evaluate.Evaluator.
type Evaluator interface {
	Evaluate(src, dst netip.Addr, proto compile.Protocol, port uint16) evaluate.Verdict
	Program() *compile.Program
}

// Config configures a Verifier.
type Config struct {
	// Group is the NFLOG group the ruleset samples to.
	Group uint16
	// Node is this node's name, written on every line.
	Node      string
	Evaluator Evaluator
	// Settle is how long a disagreement waits before it is decided again
	// and, if it still disagrees, counted.
	Settle time.Duration
	// ChecksPerSecond bounds the samples decided, overall (burst the
	// same); LinesPerSecond the disagreement lines.
	ChecksPerSecond int
	LinesPerSecond  int
	Logger          klog.Logger
}

// Defaults fills unset fields.
func (c Config) Defaults() Config {
	orDefault(&c.Group, DefaultGroup)
	orDefault(&c.Settle, DefaultSettle)
	orDefault(&c.ChecksPerSecond, DefaultChecksPerSecond)
	orDefault(&c.LinesPerSecond, DefaultLinesPerSecond)
	return c
}

func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Metrics are runtime verification's Prometheus metrics.
type Metrics struct {
	// Verified counts the samples decided again, by the kernel's verdict.
	Verified *prometheus.CounterVec
	// Disagreements counts the confirmed disagreements, by the kernel's
	// verdict.
	Disagreements *prometheus.CounterVec
	// Dropped counts samples not decided, by reason.
	Dropped *prometheus.CounterVec
}

// NewMetrics creates the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Verified: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_verdicts_verified_total",
			Help: "Sampled kernel verdicts of new connections (one direction each) decided again by the userspace evaluator, by the kernel's verdict (kernel=allow|deny)."},
			[]string{"kernel"}),
		Disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_verdict_disagreements_total",
			Help: "Sampled kernel verdicts the userspace evaluator decided otherwise, confirmed after the settling time, by the kernel's verdict (kernel=allow|deny); each is logged."},
			[]string{"kernel"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_verify_samples_dropped_total",
			Help: "Verification samples not decided: reason=rate_limit (checks per second), unknown_id, no_program, unparsable, read_error."},
			[]string{"reason"}),
	}
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.Verified), r.Register(m.Disagreements), r.Register(m.Dropped))
}

// Verifier reads the samples and checks them.
type Verifier struct {
	cfg     Config
	metrics *Metrics
	log     klog.Logger
	checks  *rate.Limiter
	lines   *rate.Limiter
	pending atomic.Int32
	// after runs f after d (time.AfterFunc; tests run it at once).
	after func(d time.Duration, f func())

	mu   sync.Mutex
	prog *compile.Program
	ids  map[string]compile.VerifyInfo
}

// New returns a Verifier; Run reads the group.
func New(cfg Config, m *Metrics) (*Verifier, error) {
	cfg = cfg.Defaults()
	if cfg.Evaluator == nil {
		return nil, errors.New("verify: Config.Evaluator is required")
	}
	if m == nil {
		m = NewMetrics()
	}
	return &Verifier{cfg: cfg, metrics: m, log: cfg.Logger,
		checks: rate.NewLimiter(rate.Limit(cfg.ChecksPerSecond), cfg.ChecksPerSecond),
		lines:  rate.NewLimiter(rate.Limit(cfg.LinesPerSecond), cfg.LinesPerSecond),
		after:  func(d time.Duration, f func()) { time.AfterFunc(d, f) }}, nil
}

// Consumer is the Verifier as its group's reader (pkg/nflogread) takes
// it: the samples' ids are its.
func (v *Verifier) Consumer() nflogread.Consumer {
	return nflogread.Consumer{Group: v.cfg.Group, Name: "Verifying sampled kernel verdicts", Claims: compile.IsVerifyID, Handle: v.Handle,
		Dropped: v.metrics.Dropped, Logger: v.log}
}

// sample is one sampled connection and the kernel's decision of it.
type sample struct {
	pkt  queue.Packet
	id   string
	info compile.VerifyInfo
}

// Handle checks one message of the group: its prefix (the decision's id)
// and the start of the packet.
func (v *Verifier) Handle(prefix string, p queue.Packet, _ time.Time) {
	if !v.checks.Allow() {
		v.metrics.Dropped.WithLabelValues("rate_limit").Inc()
		return
	}
	v.check(p, prefix, true, false)
}

// check resolves the sample's id and decides it. A sample that cannot be
// resolved or disagrees is checked again after the settling time (once:
// first is false then), when the program that the kernel was ahead of has
// been published; counted says it was counted as verified.
func (v *Verifier) check(p queue.Packet, id string, first, counted bool) {
	prog := v.cfg.Evaluator.Program()
	if prog == nil {
		v.metrics.Dropped.WithLabelValues("no_program").Inc()
		return
	}
	info, ok := v.resolveID(prog, id)
	if !ok && first && v.later(func() { v.check(p, id, false, false) }) {
		return
	}
	if !ok {
		v.metrics.Dropped.WithLabelValues("unknown_id").Inc()
		v.log.V(2).Info("Verification sample with an unknown id", "verifyId", id, "src", p.Src, "dst", p.Dst)
		return
	}
	s := sample{pkt: p, id: id, info: info}
	if !counted {
		v.metrics.Verified.WithLabelValues(info.Verdict()).Inc()
	}
	agree, reason := v.decide(s)
	switch {
	case agree && !first:
		v.log.V(2).Info("Verification disagreement resolved by a newer program", "src", p.Src, "dst", p.Dst, "verifyId", id)
	case agree:
	case first && v.later(func() { v.check(p, id, false, true) }):
	default:
		v.disagreement(s, reason)
	}
}

// later runs f after the settling time, unless too many are waiting.
func (v *Verifier) later(f func()) bool {
	if v.pending.Add(1) > maxPending {
		v.pending.Add(-1)
		return false
	}
	v.after(v.cfg.Settle, func() {
		defer v.pending.Add(-1)
		f()
	})
	return true
}

// decide decides the sample's direction with the program in force: whether
// it agrees with the kernel, and the model's reason.
func (v *Verifier) decide(s sample) (bool, string) {
	vd := v.cfg.Evaluator.Evaluate(s.pkt.Src, s.pkt.Dst, compile.Protocol(s.pkt.Proto), s.pkt.DstPort)
	allowed, reason := vd.Ingress, vd.IngressReason
	if s.info.Direction == compile.Egress {
		allowed, reason = vd.Egress, vd.EgressReason
	}
	return allowed == s.info.Allow, reason
}

// disagreement counts and logs a confirmed disagreement.
func (v *Verifier) disagreement(s sample, reason string) {
	v.metrics.Disagreements.WithLabelValues(s.info.Verdict()).Inc()
	if !v.lines.Allow() {
		return
	}
	model := "deny"
	if !s.info.Allow {
		model = "allow"
	}
	prog := v.cfg.Evaluator.Program()
	v.log.Info("Kernel verdict differs from the policy model",
		"src", denylog.Endpoint(prog, s.pkt.Src), "srcIP", s.pkt.Src.String(),
		"dst", denylog.Endpoint(prog, s.pkt.Dst), "dstIP", s.pkt.Dst.String(),
		"protocol", compile.Protocol(s.pkt.Proto).String(), "port", s.pkt.DstPort,
		"direction", s.info.Direction.String(),
		"kernel", s.info.Verdict(), "kernelDecision", s.info.String(), "verifyId", s.id,
		"model", model, "modelReason", reason, "node", v.cfg.Node)
}

// resolveID maps a decision id through the program's table, computed
// once per program.
func (v *Verifier) resolveID(prog *compile.Program, id string) (compile.VerifyInfo, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if prog != v.prog {
		v.prog, v.ids = prog, compile.VerifyIDs(prog)
	}
	info, ok := v.ids[id]
	return info, ok
}
