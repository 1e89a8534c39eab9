package staged

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
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

// DefaultGroup is Config.Group's default, after the deny log's.
const DefaultGroup = denylog.DefaultGroup + 1

// Would is what enforcing the staged policies would do to a connection.
type Would string

// The values of the metric's would label.
const (
	WouldDeny  Would = "deny"
	WouldAllow Would = "allow"
)

// NoPolicy is the policy label of a changed verdict whose deciding policy
// the staged program does not name (not expected; counted rather than
// dropped).
const NoPolicy = "-"

// Config configures a Logger.
type Config struct {
	// Config is the NFLOG reader's, as the deny log's: Group (DefaultGroup
	// when 0) is the group the ruleset copies staged subjects' first
	// packets to; Program returns the program in force (the evaluator's),
	// whose Source the staged program is built from; FlowInterval is the
	// least time between two lines for one connection (source,
	// destination, protocol, port).
	denylog.Config
	// Resolver, when set, decides domainNames peers as the evaluator in
	// force does.
	Resolver evaluate.Resolver
}

// Defaults fills unset fields.
func (c Config) Defaults() Config {
	if c.Group == 0 {
		c.Group = DefaultGroup
	}
	c.Config = c.Config.Defaults()
	return c
}

// Metrics are the staged log's Prometheus metrics.
type Metrics struct {
	// Verdicts counts the copies whose verdict would change, by the
	// staged verdict's deciding policy and what it would do.
	Verdicts *prometheus.CounterVec
	// Dropped counts copies not written as lines, by reason.
	Dropped *prometheus.CounterVec
}

// NewMetrics creates the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_staged_verdicts_total",
			Help: "New connections of staged policies' subjects whose verdict would change if the staged policies were enforced (after the kernel's per-source limit), by the deciding policy and would=deny|allow."},
			[]string{"policy", "would"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_staged_log_lines_dropped_total",
			Help: "Staged log messages not written as lines: reason=flow_rate_limit (same connection within the interval), rate_limit (lines per second), unparsable, no_program, read_error."},
			[]string{"reason"}),
	}
}

// Register registers the metrics.
func (m *Metrics) Register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.Verdicts), r.Register(m.Dropped))
}

// Decision is a connection decided under both programs.
type Decision struct {
	Src, Dst netip.Addr
	Proto    compile.Protocol
	Port     uint16
	// Enforced is the verdict of the program in force, Staged the verdict
	// with the staged policies enforced too.
	Enforced, Staged evaluate.Verdict
	// Policy is the staged verdict's deciding policy (a NetworkPolicy's
	// key, a ClusterNetworkPolicy's name; NoPolicy when unknown) and
	// Reason its reason, which names the rule.
	Policy, Reason string
}

// Changed reports whether enforcing the staged policies changes the verdict.
func (d *Decision) Changed() bool { return d.Enforced.Allowed != d.Staged.Allowed }

// Would is what the staged policies would do.
func (d *Decision) Would() Would {
	if d.Staged.Allowed {
		return WouldAllow
	}
	return WouldDeny
}

// Programs are the two programs a connection is decided under, and what
// names the staged verdict's deciding policy.
type Programs struct {
	Enforced, Staged *compile.Program
	// policies maps the staged program's reasons to their policy.
	policies map[string]string
}

// NewPrograms builds the staged program of prog (from prog.Source, with
// the staged policies enforced). It returns nil when prog has no staged
// policy: no verdict can change.
func NewPrograms(prog *compile.Program) *Programs {
	if prog == nil || len(prog.StagedPolicies) == 0 {
		return nil
	}
	in := prog.Source
	in.EnforceStaged = true
	st := compile.Build(in)
	return &Programs{Enforced: prog, Staged: st, policies: reasonPolicies(st, prog.StagedPolicies)}
}

// reasonPolicies maps every reason the program's verdicts can give to the
// policy it names: a rule's reason to its policy, a NetworkPolicy default
// deny to the first staged policy among those isolating the pod (else the
// first of them).
func reasonPolicies(p *compile.Program, staged []string) map[string]string {
	out := map[string]string{}
	for i := range p.Policies {
		pol := &p.Policies[i]
		for _, d := range []compile.Direction{compile.Ingress, compile.Egress} {
			for j := range pol.Rules(d) {
				out[pol.Rules(d)[j].AllowReason] = pol.Key
			}
		}
	}
	for i := range p.ClusterPolicies {
		cp := &p.ClusterPolicies[i]
		for _, d := range []compile.Direction{compile.Ingress, compile.Egress} {
			for j := range cp.Rules(d) {
				out[cp.Rules(d)[j].Reason] = cp.Name
			}
		}
	}
	for i := range p.Pods {
		pod := &p.Pods[i]
		for _, d := range []compile.Direction{compile.Ingress, compile.Egress} {
			ids := pod.Policies(d)
			if len(ids) == 0 {
				continue
			}
			reason := pod.IngressDenied
			if d == compile.Egress {
				reason = pod.EgressDenied
			}
			if _, ok := out[reason]; ok {
				continue
			}
			pick := p.Policies[ids[0]].Key
			for _, id := range ids {
				if _, ok := slices.BinarySearch(staged, p.Policies[id].Key); ok {
					pick = p.Policies[id].Key
					break
				}
			}
			out[reason] = pick
		}
	}
	return out
}

// Decide decides a connection under both programs.
func (ps *Programs) Decide(res evaluate.Resolver, src, dst netip.Addr, proto compile.Protocol, port uint16) Decision {
	d := Decision{Src: src, Dst: dst, Proto: proto, Port: port,
		Enforced: evaluate.EvaluateResolved(ps.Enforced, res, src, dst, proto, port),
		Staged:   evaluate.EvaluateResolved(ps.Staged, res, src, dst, proto, port)}
	// The side that changed decides: the one the staged program denies,
	// or, when it allows, the one the program in force denied.
	egress := !d.Staged.Egress
	if d.Staged.Allowed {
		egress = !d.Enforced.Egress
	}
	d.Reason = d.Staged.IngressReason
	if egress {
		d.Reason = d.Staged.EgressReason
	}
	d.Policy = NoPolicy
	if p, ok := ps.policies[d.Reason]; ok {
		d.Policy = p
	}
	return d
}

type flowKey struct {
	src, dst netip.Addr
	proto    compile.Protocol
	port     uint16
}

// Logger writes the staged log.
type Logger struct {
	cfg     Config
	metrics *Metrics
	log     klog.Logger
	lines   *rate.Limiter

	mu    sync.Mutex
	flows map[flowKey]time.Time
	prog  *compile.Program
	progs *Programs
}

// New returns a Logger; Run reads the group.
func New(cfg Config, m *Metrics) (*Logger, error) {
	cfg = cfg.Defaults()
	if cfg.Program == nil {
		return nil, errors.New("staged: Config.Program is required")
	}
	if m == nil {
		m = NewMetrics()
	}
	return &Logger{cfg: cfg, metrics: m, log: cfg.Logger, lines: rate.NewLimiter(rate.Limit(cfg.LinesPerSecond), cfg.LinesPerSecond),
		flows: map[flowKey]time.Time{}}, nil
}

// Consumer is the Logger as its group's reader (pkg/nflogread) takes it:
// the staged log's prefix is its.
func (l *Logger) Consumer() nflogread.Consumer {
	return nflogread.Consumer{Group: l.cfg.Group, Name: "Reading the staged log", Claims: isStagedPrefix, Handle: l.Handle,
		Dropped: l.metrics.Dropped, Logger: l.log}
}

func isStagedPrefix(prefix string) bool { return prefix == compile.StagedLogPrefix }

// programs returns the programs of the program in force, building the
// staged one once per program.
func (l *Logger) programs() *Programs {
	prog := l.cfg.Program()
	l.mu.Lock()
	defer l.mu.Unlock()
	if prog != l.prog {
		l.prog, l.progs = prog, NewPrograms(prog)
	}
	return l.progs
}

// Handle decides one message of the group (its packet) and logs it when
// the verdict would change.
func (l *Logger) Handle(_ string, p queue.Packet, now time.Time) {
	ps := l.programs()
	if ps == nil {
		// The kernel copies before the program with the staged policies
		// is published, or after they were removed.
		l.metrics.Dropped.WithLabelValues("no_program").Inc()
		return
	}
	d := ps.Decide(l.cfg.Resolver, p.Src, p.Dst, compile.Protocol(p.Proto), p.DstPort)
	if !d.Changed() {
		return
	}
	l.metrics.Verdicts.WithLabelValues(d.Policy, string(d.Would())).Inc()
	if !l.allowFlow(flowKey{d.Src, d.Dst, d.Proto, d.Port}, now) {
		l.metrics.Dropped.WithLabelValues("flow_rate_limit").Inc()
		return
	}
	if !l.lines.AllowN(now, 1) {
		l.metrics.Dropped.WithLabelValues("rate_limit").Inc()
		return
	}
	l.log.Info("Staged verdict",
		"src", denylog.Endpoint(ps.Enforced, d.Src), "srcIP", d.Src.String(),
		"dst", denylog.Endpoint(ps.Enforced, d.Dst), "dstIP", d.Dst.String(),
		"protocol", d.Proto.String(), "port", d.Port,
		"would", string(d.Would()), "enforced", verdictWord(d.Enforced.Allowed), "staged", verdictWord(d.Staged.Allowed),
		"policy", d.Policy, "reason", d.Reason, "enforcedReason", d.Enforced.Reason(), "node", l.cfg.Node)
}

func (l *Logger) allowFlow(k flowKey, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return denylog.AllowFlow(l.flows, k, now, l.cfg.FlowInterval)
}

func verdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}
