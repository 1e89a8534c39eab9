package queue

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Decider decides whether a new connection is allowed. It is called once per
// queued packet, concurrently from several goroutines when more than one queue
// is used, so it must be safe for concurrent use, and it must be fast and
// never block: the queue's reader waits for it, and the kernel holds the
// packet (and every packet queued after it) until the verdict. A decision
// that has to wait for something is deferred instead (DeferringDecider).
// reason is logged for denials.
type Decider interface {
	Decide(p Packet) (allow bool, reason string)
}

// DeciderFunc adapts a function to the Decider interface.
type DeciderFunc func(p Packet) (bool, string)

// Decide calls f(p).
func (f DeciderFunc) Decide(p Packet) (bool, string) { return f(p) }

// Observer receives one call per verdict given for a parsed packet, with the
// time the Decider took. It is called on the packet path: keep it cheap (a
// Prometheus histogram Observe is fine).
type Observer interface {
	ObserveVerdict(allow bool, proto uint8, family uint8, d time.Duration)
}

// Defaults of RuntimeConfig.
const (
	DefaultQueues      = 1
	DefaultMaxQueueLen = 4096
	// DefaultMaxHeldPerSource is 1/16 of DefaultMaxQueueLen: the share of
	// the queue the ruleset gives one source address for held connections
	// (pkg/compile's DefaultHeldSourceBurst + 2 s * DefaultHeldSourceRate).
	DefaultMaxHeldPerSource = 256
	DefaultCopyRange        = 128
	DefaultDenyLogPerSecond = 10
	DefaultDenyLogBurst     = 20
	DefaultWriteTimeout     = time.Second
	// ReadBufferPerPacket is what the default receive buffer sets aside
	// per queued packet. The kernel charges each queued packet's netlink
	// message to the socket (some 830 bytes for a small packet copied up
	// to DefaultCopyRange) and drops a packet it cannot charge
	// (user_dropped) however short the queue is: the usual system default
	// (net.core.rmem_default, 208 KiB) holds 256 queued packets, so a
	// reader that stalls for 9 ms at 30,000 new connections a second loses
	// packets while --max-queue-len (4,096) is far off. The kernel doubles
	// the value set, so 1 KiB gives each packet 2 KiB: the whole queue
	// fits (8 MiB at the default length, charged only while packets wait).
	ReadBufferPerPacket = 1024
)

// RuntimeConfig configures a Runtime. Call Defaults to fill in zero fields.
type RuntimeConfig struct {
	// QueueNum is the first queue number.
	QueueNum uint16
	// Queues is the number of queues, QueueNum..QueueNum+Queues-1, one socket
	// and one goroutine each (the rule fans out over them by CPU).
	Queues uint16
	// FailOpen accepts, without remembering them, the packets whose
	// Decider panicked. It never admits what does not fit: the kernel's
	// NFQA_CFG_F_FAIL_OPEN flag (accept what overflows a queue) is never
	// set, so a pod that floods the queue cannot make the kernel accept its
	// own denied connections; and unparsable packets are always dropped.
	// Fail-open for an agent that is down is the queue rule's bypass flag.
	FailOpen bool
	// MaxQueueLen is the kernel queue length per queue, and the bound on
	// packets a Holder holds at once.
	MaxQueueLen uint32
	// MaxHeldPerSource bounds the packets a Holder holds at once from one
	// source address; past it they are dropped (hold.go).
	MaxHeldPerSource int
	// CopyRange is how many bytes of each packet the kernel copies to us. It
	// must cover the IP header, the IPv6 extension headers and 4 bytes of the
	// transport header; a packet whose ports lie beyond it is unparsable.
	CopyRange uint32
	// AllowMark is the packet mark bit (or bits) owned by nftpolicy: allowed
	// packets are re-injected with it set. Required.
	AllowMark uint32
	// NetNS, if not 0, is an fd of the network namespace in which the queue
	// sockets are opened. With 0, they are opened in the network namespace of
	// the thread that calls Run (lock the goroutine with runtime.LockOSThread
	// and setns(2) before calling Run to use another one).
	NetNS int
	// ReadBuffer is the socket receive buffer size in bytes, as given to
	// SO_RCVBUFFORCE (the kernel doubles it); 0 means MaxQueueLen *
	// ReadBufferPerPacket, which holds the whole queue.
	ReadBuffer int
	// WriteTimeout bounds sending one verdict.
	WriteTimeout time.Duration
	// DenyLogPerSecond and DenyLogBurst rate-limit the log lines of denials.
	DenyLogPerSecond float64
	DenyLogBurst     int
	// Logger logs denials at V(2) and errors. Zero means klog.Background().
	Logger klog.Logger
	// Observer, if not nil, is called for every verdict on a parsed packet.
	Observer Observer
	// AcceptOnAllow answers an allowed packet NF_ACCEPT with its mark
	// unchanged instead of NF_REPEAT with AllowMark: for queues that only
	// hold packets (DNS replies while their answers are learned), whose
	// connection nothing remembers.
	AcceptOnAllow bool
	// Hold, if not nil, delays reading until it is closed: the queues are
	// bound (Ready) and the kernel keeps the packets queued to them, up to
	// MaxQueueLen, instead of dropping them for want of a listener. The
	// agent binds first and reads once the program snapshot is loaded.
	Hold <-chan struct{}
}

// Defaults returns c with its zero fields set to their defaults.
func (c RuntimeConfig) Defaults() RuntimeConfig {
	if c.Queues == 0 {
		c.Queues = DefaultQueues
	}
	if c.MaxQueueLen == 0 {
		c.MaxQueueLen = DefaultMaxQueueLen
	}
	if c.MaxHeldPerSource == 0 {
		c.MaxHeldPerSource = DefaultMaxHeldPerSource
	}
	if c.CopyRange == 0 {
		c.CopyRange = DefaultCopyRange
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ReadBuffer == 0 {
		c.ReadBuffer = int(c.MaxQueueLen) * ReadBufferPerPacket
	}
	if c.DenyLogPerSecond == 0 {
		c.DenyLogPerSecond = DefaultDenyLogPerSecond
	}
	if c.DenyLogBurst == 0 {
		c.DenyLogBurst = DefaultDenyLogBurst
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background().WithName("nfqueue")
	}
	return c
}

// Validate checks c (after Defaults).
func (c RuntimeConfig) Validate() error {
	var errs []error
	if err := compile.ValidateQueueRange(c.QueueNum, c.Queues); err != nil {
		errs = append(errs, err)
	}
	if c.AllowMark == 0 {
		errs = append(errs, errors.New("allowMark must not be 0"))
	}
	if c.CopyRange < 48 || c.CopyRange > 0xffff {
		errs = append(errs, fmt.Errorf("copyRange %d out of range [48, 65535]", c.CopyRange))
	}
	if c.MaxQueueLen == 0 {
		errs = append(errs, errors.New("maxQueueLen must not be 0"))
	}
	if c.MaxHeldPerSource <= 0 {
		errs = append(errs, errors.New("maxHeldPerSource must be positive"))
	}
	if c.DenyLogPerSecond < 0 || c.DenyLogBurst < 0 {
		errs = append(errs, errors.New("deny log rate and burst must not be negative"))
	}
	if c.ReadBuffer < 0 || c.WriteTimeout < 0 {
		errs = append(errs, errors.New("readBuffer and writeTimeout must not be negative"))
	}
	return errors.Join(errs...)
}

// Runtime is the NFQUEUE loop. Create it with NewRuntime and start it once with
// Run.
//
// For each queued packet it answers the kernel with exactly one verdict:
//
//   - allow: NF_REPEAT with packet mark = (original mark | AllowMark), or
//     with AcceptOnAllow NF_ACCEPT with the mark unchanged;
//   - deny: NF_DROP;
//   - unparsable packet: NF_DROP, counted in Stats, whatever FailOpen: its
//     bytes are the sender's to choose, and an agent that is up decides;
//   - a panicking Decider: NF_ACCEPT when FailOpen, else NF_DROP, counted
//     in Stats. NF_ACCEPT, not NF_REPEAT, so that such a connection is not
//     remembered as allowed.
//
// With NF_REPEAT the packet re-enters the base chain that queued it from its
// first rule, and the ruleset (pkg/compile, in queue mode) starts that chain
// with (M = AllowMark, ^M its complement):
//
//	meta mark & M == M ct mark set ct mark | M meta mark set meta mark & ^M accept
//	ct state established,related accept
//	ct mark & M == M accept
//
// before any rule that can lead to the queue (the native queue statement, or
// with --queue-variant xt-compat the chain pkg/queuerule.InstallCompatQueueRule
// writes). The first rule copies the decision into the conntrack mark,
// removes the bit from the packet mark again and accepts. The other mark
// bits (e.g. kube-proxy's 0x4000) survive: a verdict mark replaces the whole
// skb mark, so the Runtime sends the original mark back with M or-ed in.
// Later packets of the connection, even while conntrack still calls it "new"
// (UDP before any reply, TCP SYN retransmits), match "ct mark & M == M
// accept" and are never queued again: one queued packet per connection.
// runtime_linux_test.go checks on the running kernel that nf_reinject()
// calls the queueing base chain's hook again for NF_REPEAT, with the
// verdict's mark already on the skb.
//
// If that first rule is missing (or uses another mark), the repeated packet
// would be queued again, forever. The Runtime therefore answers NF_ACCEPT,
// without asking the Decider, to a packet that arrives already carrying
// AllowMark, logs the misconfiguration once and counts it (Stats.MarkLoops).
//
// The conntrack mark cannot be set directly with the verdict: that needs
// CONFIG_NETFILTER_NETLINK_GLUE_CT, which some kernels lack and which then
// silently ignores the attribute. The packet mark always works.
//
// Copy mode is "packet" with a small copy range (the headers only) and the
// GSO flag, so that big GSO packets are neither segmented nor copied. The
// kernel's NFQA_CFG_F_FAIL_OPEN flag is cleared, whatever FailOpen: packets
// that do not fit in a full queue (or a full socket buffer) are dropped,
// counted by the overflow watcher. Accepting them would let a pod that
// fills the queue (with connections held for pods not yet known) get its
// own denied connections accepted. Fail-open is for an agent that is down:
// the rule's "bypass" flag accepts packets while no process is bound to
// the queue at all (see pkg/queuerule.QueueRuleConfig); the ruleset bounds each
// source's share of the queue (pkg/compile render_share.go).
type Runtime struct {
	cfg     RuntimeConfig
	decider Decider
	log     klog.Logger
	denyLog *rate.Limiter

	// deferring is decider as a DeferringDecider, if it is one, or the
	// adapter that defers a Holder's held packets (hold.go).
	deferring DeferringDecider
	// payload is decider as a PayloadDecider, if it is one.
	payload PayloadDecider
	// runCtx is Run's context: held decisions end with it.
	runCtx context.Context

	started atomic.Bool
	ready   chan struct{}
	c       counters
}

// NewRuntime returns a Runtime for cfg (Defaults applied) and decider.
func NewRuntime(cfg RuntimeConfig, decider Decider) (*Runtime, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid nfqueue runtime config: %w", err)
	}
	if decider == nil {
		return nil, errors.New("nil decider")
	}
	r := &Runtime{
		cfg:     cfg,
		decider: decider,
		log:     cfg.Logger,
		denyLog: rate.NewLimiter(rate.Limit(cfg.DenyLogPerSecond), cfg.DenyLogBurst),
		ready:   make(chan struct{}),
		runCtx:  context.Background(),
	}
	r.payload, _ = decider.(PayloadDecider)
	if dd, ok := decider.(DeferringDecider); ok {
		r.deferring = dd
	} else if h, ok := decider.(Holder); ok {
		r.deferring = newHolding(r, h, int(cfg.MaxQueueLen), cfg.MaxHeldPerSource)
	}
	return r, nil
}

// Config returns the effective configuration.
func (r *Runtime) Config() RuntimeConfig { return r.cfg }

// Ready is closed once every queue is bound and packets are being read.
func (r *Runtime) Ready() <-chan struct{} { return r.ready }

// Run opens and binds the queues, then answers packets until ctx is done (it
// returns nil then) or a socket fails (it returns the error). The sockets are
// opened before Run blocks, on the calling goroutine (see RuntimeConfig.NetNS).
// Closing the sockets unbinds the queues: the kernel drops the packets still
// waiting for a verdict, and the rule's bypass flag then decides whether
// queued traffic passes. Run may be called once.
func (r *Runtime) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("nfqueue runtime already started")
	}
	r.runCtx = ctx // before any reader starts: they read it
	// NFQA_CFG_F_FAIL_OPEN stays cleared (it is in the config's mask): an
	// overflowing queue drops.
	flags := uint32(nfqaCfgFGSO)
	var socks []*qsock
	defer func() {
		for _, q := range socks {
			q.close()
		}
	}()
	for i := uint16(0); i < r.cfg.Queues; i++ {
		num := r.cfg.QueueNum + i
		q, err := openQueueSocket(r.cfg.NetNS, num, r.cfg.CopyRange, r.cfg.MaxQueueLen, flags, r.cfg.ReadBuffer, r.cfg.WriteTimeout)
		if err != nil {
			return fmt.Errorf("opening nfqueue %d: %w", num, err)
		}
		socks = append(socks, q)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	if w, err := r.newOverflowWatcher(); err != nil {
		r.log.Info("Cannot watch the kernel's queue statistics; queue overflows are only in the metrics", "err", err)
	} else {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(stop) }()
	}

	errc := make(chan error, len(socks))
	for _, q := range socks {
		rd := newReader(r, q)
		wg.Add(1)
		go func() { defer wg.Done(); errc <- rd.run(stop) }()
	}
	r.log.Info("Listening on nfqueue", "first", r.cfg.QueueNum, "queues", r.cfg.Queues,
		"failOpen", r.cfg.FailOpen, "allowMark", fmt.Sprintf("%#x", r.cfg.AllowMark))
	close(r.ready)

	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// DeferringDecider is a Decider that may take its time: DecideOrDefer either
// decides at once (deferred false), like Decide, or keeps later and returns
// deferred true, promising to call later.Verdict exactly once, from any
// goroutine, without blocking the reader. Until then the kernel holds the
// packet (and counts it against the queue length), and the reader answers
// the packets after it individually instead of in batches. A packet still
// waiting when the Runtime stops is dropped by the kernel.
type DeferringDecider interface {
	Decider
	DecideOrDefer(p Packet, later Later) (allow bool, reason string, deferred bool)
}

// Later answers one deferred packet. It is a small value: copy it freely,
// but call Verdict once.
type Later struct {
	r     *Runtime
	q     *qsock
	id    uint32
	mark  uint32
	p     Packet
	start time.Time
}

// Packet returns the deferred packet's headers.
func (l Later) Packet() Packet { return l.p }

// Verdict answers the deferred packet like an immediate decision would:
// allow repeats it with the allow mark, deny drops it. It returns an error
// when the verdict could not be sent (the Runtime stopped: the kernel
// dropped the packet then).
func (l Later) Verdict(allow bool, reason string) error {
	r := l.r
	if r == nil {
		return errors.New("zero Later")
	}
	v, setMark, mark := r.verdictOf(allow, l.mark)
	err := l.q.sendOne(l.id, v, setMark, mark)
	l.q.pending.Add(-1)
	r.c.deferredPending.Add(-1)
	if err != nil {
		r.c.verdictErrors.Add(1)
		return fmt.Errorf("deferred verdict for packet %d of queue %d: %w", l.id, l.q.queue, err)
	}
	r.finishVerdict(l.p, allow, reason, time.Since(l.start))
	return nil
}

// verdictOf maps a decision to the netfilter verdict and the mark to set.
func (r *Runtime) verdictOf(allow bool, mark uint32) (verdict uint32, setMark bool, newMark uint32) {
	switch {
	case allow && r.cfg.AcceptOnAllow:
		return nfAccept, false, 0
	case allow:
		return nfRepeat, true, mark | r.cfg.AllowMark
	}
	return nfDrop, false, 0
}

// handlePacket answers (or defers) one queued packet; the verdict is
// collected by rd and sent at the end of the read round.
func (r *Runtime) handlePacket(rd *reader, m *queueMsg) {
	r.c.received.Add(1)
	id, mark := m.ID, m.Mark
	if mark&r.cfg.AllowMark == r.cfg.AllowMark {
		// The packet already carries the allow bit: the ruleset did not
		// consume it after NF_REPEAT (missing or different first rule, or
		// another owner of the bit). Answering NF_REPEAT again would loop;
		// the bit means a previous verdict allowed the packet, so accept.
		rd.verdict(id, nfAccept, false, 0)
		if r.c.markLoops.Add(1) == 1 {
			r.log.Error(nil, "Queued packet already carries the allow mark: the ruleset's first rule does not handle it; accepting such packets without a decision",
				"queue", rd.q.queue, "mark", fmt.Sprintf("%#x", mark), "allowMark", fmt.Sprintf("%#x", r.cfg.AllowMark))
		}
		return
	}

	p, l4, err := parsePacket(m.Payload)
	if err != nil {
		rd.verdict(id, nfDrop, false, 0)
		r.c.unparsableDropped.Add(1)
		if r.log.V(4).Enabled() {
			r.log.V(4).Info("Unparsable queued packet", "queue", rd.q.queue, "len", len(m.Payload), "err", err)
		}
		return
	}

	start := time.Now()
	allow, reason, deferred, ok := r.decide(p, m.Payload, l4, Later{r: r, q: rd.q, id: id, mark: mark, p: p, start: start})
	if !ok {
		r.failVerdict(rd, id, &r.c.panicsAccepted, &r.c.panicsDropped)
		return
	}
	if deferred {
		return
	}
	v, setMark, newMark := r.verdictOf(allow, mark)
	rd.verdict(id, v, setMark, newMark)
	// The verdict is counted when collected; a failed write is counted
	// in VerdictErrors.
	r.finishVerdict(p, allow, reason, time.Since(start))
}

func (r *Runtime) finishVerdict(p Packet, allow bool, reason string, d time.Duration) {
	r.c.count(allow, p.Family, p.Proto)
	if o := r.cfg.Observer; o != nil {
		o.ObserveVerdict(allow, p.Proto, p.Family, d)
	}
	if !allow {
		r.logDenial(p, reason)
	}
}

// failVerdict answers a packet that got no decision: accept without
// remembering (NF_ACCEPT) when failing open, else drop.
func (r *Runtime) failVerdict(rd *reader, id uint32, accepted, dropped *atomic.Uint64) {
	if r.cfg.FailOpen {
		rd.verdict(id, nfAccept, false, 0)
		accepted.Add(1)
		return
	}
	rd.verdict(id, nfDrop, false, 0)
	dropped.Add(1)
}

// PayloadDecider is a Decider that reads the queued packet itself: the
// Runtime calls DecidePayload instead of Decide, with the packet from its
// IP header on (cut at the copy range; valid only during the call) and the
// offset of its transport header (0: none). A DeferringDecider is asked
// DecideOrDefer instead, never DecidePayload.
type PayloadDecider interface {
	Decider
	DecidePayload(p Packet, packet []byte, l4 int) (allow bool, reason string)
}

// decide asks the Decider; ok is false when it panicked. The Later is
// used only by a DeferringDecider, which then owns the packet's verdict
// (deferred true); packet and l4 only by a PayloadDecider.
func (r *Runtime) decide(p Packet, packet []byte, l4 int, later Later) (allow bool, reason string, deferred, ok bool) {
	counted := false
	defer func() {
		if e := recover(); e != nil {
			ok, deferred = false, false
			if counted {
				// A panic is no promise to answer later: the reader answers.
				later.q.pending.Add(-1)
				r.c.deferredPending.Add(-1)
			}
			r.log.Error(fmt.Errorf("%v", e), "Decider panicked", "src", p.Src, "dst", p.Dst, "proto", p.Proto)
		}
	}()
	if r.deferring != nil {
		// Counted before the call: the Decider may answer from another
		// goroutine before DecideOrDefer returns.
		later.q.pending.Add(1)
		r.c.deferredPending.Add(1)
		counted = true
		allow, reason, deferred = r.deferring.DecideOrDefer(p, later)
		if !deferred {
			later.q.pending.Add(-1)
			r.c.deferredPending.Add(-1)
		} else {
			r.c.deferred.Add(1)
		}
		return allow, reason, deferred, true
	}
	if r.payload != nil {
		allow, reason = r.payload.DecidePayload(p, packet, l4)
		return allow, reason, false, true
	}
	allow, reason = r.decider.Decide(p)
	return allow, reason, false, true
}

func (r *Runtime) logDenial(p Packet, reason string) {
	v := r.log.V(2)
	if !v.Enabled() {
		return
	}
	if !r.denyLog.Allow() {
		r.c.denyLogsSuppressed.Add(1)
		return
	}
	v.Info("Denied new connection",
		"family", p.Family,
		"proto", compile.Protocol(p.Proto).Name(),
		"src", netip.AddrPortFrom(p.Src, p.SrcPort).String(),
		"dst", netip.AddrPortFrom(p.Dst, p.DstPort).String(),
		"reason", reason,
		"suppressedTotal", r.c.denyLogsSuppressed.Load())
}
