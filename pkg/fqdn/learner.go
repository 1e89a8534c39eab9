package fqdn

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
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
// they are committed (pkg/nftnl.Conn in the agent).
type Writer interface {
	WriteElements(ctx context.Context, els []Element) error
	// DeleteElements deletes the elements (their Timeout is ignored);
	// one that is not in its set is no error. The sets must exist.
	DeleteElements(ctx context.Context, els []Element) error
}

// Lister is a Writer that also reads a set's elements (their Timeout
// unset). With it, the learner's first OnProgram deletes the elements a
// previous agent process wrote for pods that are no longer subjects of the
// set's rule.
type Lister interface {
	ListElements(ctx context.Context, set string) ([]Element, error)
}

// Defaults of Config.
const (
	DefaultMinTTL       = 5 * time.Second
	DefaultMaxTTL       = time.Hour
	DefaultWriteTimeout = time.Second
	// DefaultMaxNamesPerPod and DefaultMaxAddrsPerPod bound what one pod's
	// lookups may store (Config.MaxNamesPerPod, MaxAddrsPerPod). A
	// workload resolves a few to a few tens of distinct names that its
	// domainNames rules admit within the longest TTL (an hour); 512 names
	// leave room for a crawler under a wildcard, and 2048 name-address
	// pairs for names with several addresses each. At about 200 bytes of
	// store and kernel element per pair, a pod that floods its resolver
	// holds at most ~400 KiB of agent memory and its rules' kernel
	// elements stay proportional, whatever it resolves.
	DefaultMaxNamesPerPod = 512
	DefaultMaxAddrsPerPod = 2048
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
	// MaxNamesPerPod bounds the names one pod's learned answers are kept
	// for, MaxAddrsPerPod its name-address pairs; past either, the names
	// learned least recently are evicted (their kernel elements deleted)
	// and counted. Defaults DefaultMaxNamesPerPod, DefaultMaxAddrsPerPod.
	MaxNamesPerPod, MaxAddrsPerPod int
	// QueryTimeout is how long a pod's query waits for its reply
	// (HandlePacket); DefaultQueryTimeout when 0.
	QueryTimeout time.Duration
}

// Learner learns DNS replies (see the package documentation). It is safe
// for concurrent use. What each pod learned is kept in a store of its own
// (podStore) behind a lock of its own: a reply and the evaluator's
// Resolved take only the receiving pod's lock, after an atomic load of the
// pod index.
type Learner struct {
	cfg Config
	idx atomic.Pointer[podIndex]

	// idxMu serializes building pod indexes (once per program) and the
	// work a program change leaves for OnProgram.
	idxMu sync.Mutex
	// dropped are the entries of pods that stopped being local subjects
	// of domainNames rules or changed addresses (their stores marked gone),
	// retired collects the entries superseded by a new program's (pods
	// whose rules changed): OnProgram deletes the former's kernel elements
	// and re-writes the latter's answers into their new sets.
	dropped, retired []*podEntry
	// hooked is set once OnProgram is called: without the hook, nothing
	// is collected for it.
	hooked atomic.Bool

	// track follows the pods' queries and DNS-over-TCP streams
	// (HandlePacket).
	track tracker
}

// podIndex maps local pods' addresses to the pod and the domainNames rules
// that apply to it, for one program.
type podIndex struct {
	prog  *compile.Program
	pods  map[netip.Addr]*podEntry
	byKey map[string]*podEntry
}

type podEntry struct {
	key   string
	ips   []netip.Addr
	rules []compile.FQDNRule
	// store is the pod's learned answers, shared by the entries of every
	// program in which the pod keeps its addresses.
	store *podStore
	// next is the entry of the same pod in the program that superseded
	// this one (retired entries).
	next *podEntry
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
	if cfg.MaxNamesPerPod <= 0 {
		cfg.MaxNamesPerPod = DefaultMaxNamesPerPod
	}
	if cfg.MaxAddrsPerPod <= 0 {
		cfg.MaxAddrsPerPod = DefaultMaxAddrsPerPod
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
	return &Learner{cfg: cfg}, nil
}

// index returns the pod index of the program the kernel holds, building it
// once per program.
func (l *Learner) index() *podIndex {
	p := l.cfg.Program()
	if p == nil {
		return nil
	}
	if x := l.idx.Load(); x != nil && x.prog == p {
		return x
	}
	return l.indexFor(p)
}

// indexFor builds (or returns) the index of p. A pod that keeps its key
// and addresses keeps its store; the entries of the others are dropped:
// their stores are marked gone at once, so that no reply adds to them, and
// OnProgram deletes their kernel elements.
func (l *Learner) indexFor(p *compile.Program) *podIndex {
	l.idxMu.Lock()
	defer l.idxMu.Unlock()
	prev := l.idx.Load()
	if prev != nil && prev.prog == p {
		return prev
	}
	x := &podIndex{prog: p, pods: map[netip.Addr]*podEntry{}, byKey: map[string]*podEntry{}}
	for _, fr := range p.FQDNRules() {
		for _, pid := range fr.Subjects {
			pod := &p.Pods[pid]
			if !pod.Local || len(pod.IPs) == 0 {
				continue
			}
			e := x.byKey[pod.Key]
			if e == nil {
				e = &podEntry{key: pod.Key, ips: pod.IPs}
				x.byKey[pod.Key] = e
				for _, a := range pod.IPs {
					x.pods[a] = e
				}
			}
			e.rules = append(e.rules, fr)
		}
	}
	for k, e := range x.byKey {
		var old *podEntry
		if prev != nil {
			old = prev.byKey[k]
		}
		if old != nil && slices.Equal(old.ips, e.ips) {
			e.store = old.store
			if l.hooked.Load() {
				old.next = e
				l.retired = append(l.retired, old)
			}
		} else {
			e.store = newPodStore()
		}
	}
	if prev != nil {
		for k, old := range prev.byKey {
			if e := x.byKey[k]; e == nil || e.store != old.store {
				old.store.retire()
				if l.hooked.Load() {
					l.dropped = append(l.dropped, old)
				}
			}
		}
	}
	l.idx.Store(x)
	return x
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
// Its work is proportional to the reply's records and the pod's rules,
// whatever the pod learned before; it takes the pod's lock only.
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
	reply, err := ParseMessage(msg)
	if err != nil {
		return l.skip(Cause(err), src, dst)
	}
	for cause, n := range reply.Skipped {
		l.cfg.Metrics.answersSkipped.WithLabelValues(cause).Add(float64(n))
	}
	now := l.cfg.Now()
	els, learned := l.selectAnswers(pod, reply.Answers, now)
	if len(learned) == 0 {
		if len(reply.Answers) == 0 {
			return l.skip(CauseNoAddress, src, dst)
		}
		return l.skip(CauseNoMatch, src, dst)
	}
	st := pod.store
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gone {
		// The pod left the program while the reply was parsed: what it
		// learns would outlive its removal.
		return l.skip(CauseNoMatch, src, dst)
	}
	plan := st.plan(learned, l.cfg.MaxNamesPerPod, l.cfg.MaxAddrsPerPod)
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
	freed := st.apply(now, plan, learned)
	if len(plan.victims) > 0 {
		l.cfg.Metrics.evictions.Add(float64(len(plan.victims)))
		if v := l.cfg.Logger.V(4); v.Enabled() {
			v.Info("Evicted learned names past the pod's bounds", "pod", pod.key, "names", len(plan.victims))
		}
	}
	if len(freed) > 0 && l.cfg.Writer != nil {
		// The evicted names' addresses that no stored name resolves to
		// leave the kernel too: the pod's elements stay bounded.
		l.deleteElements(ctx, pod, pod.rules, freed, "evicted")
	}
	l.cfg.Metrics.learned.Inc()
	l.cfg.Metrics.podAddrs.Observe(float64(st.links))
	if v := l.cfg.Logger.V(2); v.Enabled() {
		for _, lg := range learned {
			v.Info("Learned DNS answer", "pod", pod.key, "podIP", dst, "name", lg.name, "addresses", addrList(lg.addrs), "ttl", lg.ttl, "server", src)
		}
	}
	return Result{Learned: len(els), Release: true}
}

// selectAnswers picks, from a reply's answers, the kernel elements to write
// for the rules of pod whose names they match, and the names to store. One
// reply may fill at most the pod's bounds; past them its answers are
// counted and left out.
func (l *Learner) selectAnswers(pod *podEntry, answers []Answer, now time.Time) (els []Element, learned []learnedName) {
	// The store then evicts every other name rather than exceed them.
	names, links := 0, 0
	for _, a := range answers {
		ttl := min(max(a.TTL, l.cfg.MinTTL), l.cfg.MaxTTL)
		// Only the question is matched against the rules: the names the
		// chain reaches through CNAMEs are the answering zone's word,
		// which may be any other zone's (see Answer.Question).
		q := a.Question()
		var rules []*compile.FQDNRule
		for i := range pod.rules {
			if compile.DomainsMatch(pod.rules[i].Domains, q) {
				rules = append(rules, &pod.rules[i])
			}
		}
		if len(rules) == 0 {
			continue
		}
		// The store keeps the question, which a rule of the pod matches:
		// what Resolved and a later program's rules can ask about.
		if names+1 > l.cfg.MaxNamesPerPod || links+len(a.Addrs) > l.cfg.MaxAddrsPerPod {
			l.cfg.Metrics.answersSkipped.WithLabelValues(AnswerOverBound).Add(float64(len(a.Addrs)))
			continue
		}
		names, links = names+1, links+len(a.Addrs)
		learned = append(learned, learnedName{name: q, addrs: a.Addrs, expiry: now.Add(ttl), ttl: ttl})
		for _, fr := range rules {
			// An A answer pairs with the pod's IPv4 address, an AAAA
			// answer with its IPv6 address, whatever the reply's family.
			for _, addr := range a.Addrs {
				if pa, ok := pod.addr(addr.Is4()); ok {
					els = append(els, Element{Set: fr.Set(addr.Is4()), Pod: pa, Addr: addr, Timeout: ttl})
				}
			}
		}
	}
	return els, learned
}

func (l *Learner) skip(cause string, src, dst netip.Addr) Result {
	l.cfg.Metrics.notLearned.WithLabelValues(cause).Inc()
	if v := l.cfg.Logger.V(4); v.Enabled() {
		v.Info("DNS reply released without learning", "cause", cause, "server", src, "podIP", dst)
	}
	return Result{Cause: cause, Release: true}
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
// view of domainNames peers (evaluate.Resolver). It looks up the pod, then
// the few names that resolved to peer, under the pod's lock only.
func (l *Learner) Resolved(pod, peer netip.Addr, domains []compile.DomainPattern) bool {
	x := l.index()
	if x == nil {
		return false
	}
	e := x.pods[pod.Unmap()]
	if e == nil {
		return false
	}
	return e.store.resolved(l.cfg.Now(), peer.Unmap(), domains)
}
