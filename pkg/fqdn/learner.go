package fqdn

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Element is one learned kernel element: "Pod . Addr" in Set, expiring
// after Timeout.
type Element struct {
	Set       string
	Pod, Addr netip.Addr
	Timeout   time.Duration
}

// Writer commits elements to the kernel, all or none, and returns once
// they are committed (pkg/sets.NetlinkElements in the agent).
type Writer interface {
	WriteElements(ctx context.Context, els []Element) error
}

// Defaults of Config.
const (
	DefaultMinTTL       = 5 * time.Second
	DefaultMaxTTL       = time.Hour
	DefaultWriteTimeout = time.Second
)

// Config configures a Learner.
type Config struct {
	// Program returns the program the kernel holds (the evaluator's, which
	// the controller swaps after each commit); nil before the first.
	Program func() *compile.Program
	// Writer writes the rules' sets; nil when the ruleset has none (queue
	// mode: the evaluator decides from Resolved alone).
	Writer Writer
	// Trusted reports whether replies from a source address may be
	// learned.
	Trusted func(netip.Addr) bool
	// MinTTL and MaxTTL clamp the answers' TTLs.
	MinTTL, MaxTTL time.Duration
	// FailOpen releases a reply whose elements could not be written;
	// without it the reply is dropped and the pod's resolver retries.
	FailOpen bool
	// WriteTimeout bounds one kernel write (the reply waits meanwhile).
	WriteTimeout time.Duration
	Metrics      *Metrics
	Logger       klog.Logger
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
	// OnHold, if set, receives each reply's hold time (benchmarks).
	OnHold func(time.Duration)
	// QueryTimeout is how long a pod's query waits for its reply
	// (HandlePacket); DefaultQueryTimeout when 0.
	QueryTimeout time.Duration
}

// Learner learns DNS replies (see the package documentation). It is safe
// for concurrent use.
type Learner struct {
	cfg Config
	idx atomic.Pointer[podIndex]

	// track follows the pods' queries and DNS-over-TCP streams
	// (HandlePacket).
	track tracker

	mu sync.Mutex
	// store: pod ("namespace/name") -> name -> answer address -> expiry.
	store map[string]map[string]map[netip.Addr]time.Time
}

// podIndex maps local pods' addresses to the pod and the domainNames rules
// that apply to it, for one program.
type podIndex struct {
	prog *compile.Program
	pods map[netip.Addr]*podEntry
}

type podEntry struct {
	key   string
	ips   []netip.Addr
	rules []compile.FQDNRule
}

// addr returns the pod's address of a family.
func (e *podEntry) addr(v4 bool) (netip.Addr, bool) {
	for _, a := range e.ips {
		if a.Is4() == v4 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// New returns a Learner; cfg.Program and cfg.Trusted are required.
func New(cfg Config) (*Learner, error) {
	if cfg.Program == nil || cfg.Trusted == nil {
		return nil, errors.New("fqdn: Config.Program and Config.Trusted are required")
	}
	if cfg.MinTTL <= 0 {
		cfg.MinTTL = DefaultMinTTL
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if cfg.MinTTL > cfg.MaxTTL {
		return nil, fmt.Errorf("fqdn: minimum TTL %v is above the maximum %v", cfg.MinTTL, cfg.MaxTTL)
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background().WithName("fqdn")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Learner{cfg: cfg, store: map[string]map[string]map[netip.Addr]time.Time{}}, nil
}

func (l *Learner) index() *podIndex {
	p := l.cfg.Program()
	if p == nil {
		return nil
	}
	if x := l.idx.Load(); x != nil && x.prog == p {
		return x
	}
	x := &podIndex{prog: p, pods: map[netip.Addr]*podEntry{}}
	for _, fr := range p.FQDNRules() {
		for _, pid := range fr.Subjects {
			pod := &p.Pods[pid]
			if !pod.Local || len(pod.IPs) == 0 {
				continue
			}
			e := x.pods[pod.IPs[0]]
			if e == nil {
				e = &podEntry{key: pod.Key, ips: pod.IPs}
				for _, a := range pod.IPs {
					x.pods[a] = e
				}
			}
			e.rules = append(e.rules, fr)
		}
	}
	l.idx.Store(x)
	l.forget(x)
	return x
}

// forget drops what pods that are no longer local subjects resolved, once
// per program: a reused pod address must not inherit their answers. (The
// kernel's elements of a deleted pod expire with their TTL.)
func (l *Learner) forget(x *podIndex) {
	keep := map[string]bool{}
	for _, e := range x.pods {
		keep[e.key] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.store {
		if !keep[k] {
			delete(l.store, k)
		}
	}
}

// Result is what Learn did with one reply.
type Result struct {
	// Learned is the number of elements written (and answers recorded).
	Learned int
	// Cause is why nothing was learned ("" when something was).
	Cause string
	// Release is the verdict: let the reply through.
	Release bool
}

// Learn handles one DNS message from src to the local pod at dst (the
// reply's destination). It returns once the kernel holds what was learned.
func (l *Learner) Learn(ctx context.Context, src, dst netip.Addr, msg []byte) Result {
	src, dst = src.Unmap(), dst.Unmap()
	if !l.cfg.Trusted(src) {
		return l.skip(CauseUntrusted, src, dst)
	}
	x := l.index()
	if x == nil {
		return l.skip(CauseNoProgram, src, dst)
	}
	pod := x.pods[dst]
	if pod == nil {
		return l.skip(CauseNoMatch, src, dst)
	}
	rules := pod.rules
	answers, err := ParseReply(msg)
	if err != nil {
		return l.skip(Cause(err), src, dst)
	}
	now := l.cfg.Now()
	var els []Element
	type learned struct {
		name  string
		addrs []netip.Addr
		ttl   time.Duration
	}
	var logged []learned
	for _, a := range answers {
		ttl := min(max(a.TTL, l.cfg.MinTTL), l.cfg.MaxTTL)
		matched := false
		for i := range rules {
			fr := &rules[i]
			if !anyNameMatches(fr.Domains, a.Names) {
				continue
			}
			matched = true
			// An A answer pairs with the pod's IPv4 address, an AAAA
			// answer with its IPv6 address, whatever the reply's family.
			for _, addr := range a.Addrs {
				if pa, ok := pod.addr(addr.Is4()); ok {
					els = append(els, Element{Set: fr.Set(addr.Is4()), Pod: pa, Addr: addr, Timeout: ttl})
				}
			}
		}
		if matched {
			logged = append(logged, learned{name: a.Names[0], addrs: a.Addrs, ttl: ttl})
		}
	}
	if len(logged) == 0 {
		if len(answers) == 0 {
			return l.skip(CauseNoAddress, src, dst)
		}
		return l.skip(CauseNoMatch, src, dst)
	}
	if l.cfg.Writer != nil && len(els) > 0 {
		wctx, cancel := context.WithTimeout(ctx, l.cfg.WriteTimeout)
		err := l.cfg.Writer.WriteElements(wctx, els)
		cancel()
		if err != nil {
			l.cfg.Metrics.notLearned.WithLabelValues(CauseWriteError).Inc()
			l.cfg.Logger.Error(err, "Cannot write learned DNS answers; the reply is "+map[bool]string{true: "released", false: "dropped"}[l.cfg.FailOpen],
				"pod", pod.key, "podIP", dst, "elements", len(els))
			return Result{Cause: CauseWriteError, Release: l.cfg.FailOpen}
		}
	}
	l.mu.Lock()
	byName := l.store[pod.key]
	if byName == nil {
		byName = map[string]map[netip.Addr]time.Time{}
		l.store[pod.key] = byName
	}
	n := 0
	for _, lg := range logged {
		for _, a := range answers {
			if a.Names[0] != lg.name {
				continue
			}
			for _, nm := range a.Names {
				m := byName[nm]
				if m == nil {
					m = map[netip.Addr]time.Time{}
					byName[nm] = m
				}
				for _, addr := range lg.addrs {
					m[addr] = now.Add(lg.ttl)
				}
			}
		}
	}
	for nm, m := range byName {
		for a, exp := range m {
			if !now.Before(exp) {
				delete(m, a)
			}
		}
		if len(m) == 0 {
			delete(byName, nm)
		}
		n += len(m)
	}
	l.mu.Unlock()
	l.cfg.Metrics.learned.Inc()
	l.cfg.Metrics.podAddrs.Observe(float64(n))
	if v := l.cfg.Logger.V(2); v.Enabled() {
		for _, lg := range logged {
			v.Info("Learned DNS answer", "pod", pod.key, "podIP", dst, "name", lg.name, "addresses", addrList(lg.addrs), "ttl", lg.ttl, "server", src)
		}
	}
	return Result{Learned: len(els), Release: true}
}

func (l *Learner) skip(cause string, src, dst netip.Addr) Result {
	l.cfg.Metrics.notLearned.WithLabelValues(cause).Inc()
	if v := l.cfg.Logger.V(4); v.Enabled() {
		v.Info("DNS reply released without learning", "cause", cause, "server", src, "podIP", dst)
	}
	return Result{Cause: cause, Release: true}
}

func anyNameMatches(ps []compile.DomainPattern, names []string) bool {
	for _, n := range names {
		if compile.DomainsMatch(ps, n) {
			return true
		}
	}
	return false
}

func addrList(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// Resolved reports whether the pod at pod resolved a name matching one of
// the patterns to peer, and the answer has not expired: the evaluator's
// view of domainNames peers (queue.Resolver).
func (l *Learner) Resolved(pod, peer netip.Addr, domains []compile.DomainPattern) bool {
	x := l.index()
	if x == nil {
		return false
	}
	e := x.pods[pod.Unmap()]
	if e == nil {
		return false
	}
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, m := range l.store[e.key] {
		if exp, ok := m[peer.Unmap()]; ok && now.Before(exp) && compile.DomainsMatch(domains, name) {
			return true
		}
	}
	return false
}
