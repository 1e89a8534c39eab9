package queue

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Decider decides whether a new connection is allowed. It is called once per
// queued packet, concurrently from several goroutines when more than one queue
// is used, so it must be safe for concurrent use, and it must be fast and
// never block: the kernel holds the packet (and every packet queued after it)
// until the verdict. reason is logged for denials.
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
	DefaultQueues           = 1
	DefaultMaxQueueLen      = 4096
	DefaultCopyRange        = 128
	DefaultDenyLogPerSecond = 10
	DefaultDenyLogBurst     = 20
	DefaultWriteTimeout     = time.Second
)

// RuntimeConfig configures a Runtime. Call Defaults to fill in zero fields.
type RuntimeConfig struct {
	// QueueNum is the first queue number.
	QueueNum uint16
	// Queues is the number of queues, QueueNum..QueueNum+Queues-1, one socket
	// and one goroutine each (the rule fans out over them by CPU).
	Queues uint16
	// FailOpen sets the kernel's fail-open flag (accept what does not fit in
	// the queue) and accepts packets that cannot be parsed. Without it these
	// are dropped.
	FailOpen bool
	// MaxQueueLen is the kernel queue length per queue.
	MaxQueueLen uint32
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
	// ReadBuffer, if not 0, is the socket receive buffer size in bytes.
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
}

// Defaults returns c with its zero fields set to their defaults.
func (c RuntimeConfig) Defaults() RuntimeConfig {
	if c.Queues == 0 {
		c.Queues = DefaultQueues
	}
	if c.MaxQueueLen == 0 {
		c.MaxQueueLen = DefaultMaxQueueLen
	}
	if c.CopyRange == 0 {
		c.CopyRange = DefaultCopyRange
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
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
//   - allow: NF_REPEAT with packet mark = (original mark | AllowMark);
//   - deny: NF_DROP;
//   - unparsable packet (or a panicking Decider): NF_ACCEPT when FailOpen,
//     else NF_DROP, counted in Stats. NF_ACCEPT, not NF_REPEAT, so that such
//     a connection is not remembered as allowed.
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
// with --queue-variant xt-compat the chain pkg/sets.InstallCompatQueueRule
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
// GSO flag, so that big GSO packets are neither segmented nor copied. With
// FailOpen the kernel's NFQA_CFG_F_FAIL_OPEN flag is set too: packets that
// do not fit in a full queue (or a full socket buffer) are accepted instead of
// dropped. That is independent from the rule's "bypass" flag, which decides
// what happens when no process is bound to the queue at all (see
// pkg/sets.QueueRuleConfig).
type Runtime struct {
	cfg     RuntimeConfig
	decider Decider
	log     klog.Logger
	denyLog *rate.Limiter

	started atomic.Bool
	ready   chan struct{}
	c       counters
	// held bounds the packets whose decisions wait (hold.go).
	held chan struct{}
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
	return &Runtime{
		cfg:     cfg,
		decider: decider,
		log:     cfg.Logger,
		denyLog: rate.NewLimiter(rate.Limit(cfg.DenyLogPerSecond), cfg.DenyLogBurst),
		ready:   make(chan struct{}),
		held:    make(chan struct{}, cfg.MaxQueueLen),
	}, nil
}

// Config returns the effective configuration.
func (r *Runtime) Config() RuntimeConfig { return r.cfg }

// Ready is closed once every queue is bound and packets are being read.
func (r *Runtime) Ready() <-chan struct{} { return r.ready }

// Run opens and binds the queues, then answers packets until ctx is done (it
// returns nil then) or a socket fails (it returns the error). The sockets are
// opened before Run blocks, on the calling goroutine (see RuntimeConfig.NetNS).
// Closing the sockets unbinds the queues: the rule's bypass flag then decides
// whether queued traffic passes. Run may be called once.
func (r *Runtime) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("nfqueue runtime already started")
	}
	ctx, cancel := context.WithCancel(ctx)
	var queues []*nfqueue.Nfqueue
	defer func() {
		cancel()
		for _, q := range queues {
			_ = q.Close()
		}
	}()

	flags := uint32(nfqueue.NfQaCfgFlagGSO)
	if r.cfg.FailOpen {
		flags |= nfqueue.NfQaCfgFlagFailOpen
	}
	fatal := make(chan error, int(r.cfg.Queues))
	for i := uint16(0); i < r.cfg.Queues; i++ {
		num := r.cfg.QueueNum + i
		nf, err := nfqueue.Open(&nfqueue.Config{
			NetNS:        r.cfg.NetNS,
			NfQueue:      num,
			MaxQueueLen:  r.cfg.MaxQueueLen,
			MaxPacketLen: r.cfg.CopyRange,
			Copymode:     nfqueue.NfQnlCopyPacket,
			Flags:        flags,
			AfFamily:     unix.AF_INET, // ignored by kernels >= 3.8: one socket gets IPv4 and IPv6
			WriteTimeout: r.cfg.WriteTimeout,
			Logger:       nfqLogger{r.log},
		})
		if err != nil {
			return fmt.Errorf("opening nfqueue %d: %w", num, err)
		}
		queues = append(queues, nf)
		// Overruns are handled by the kernel (drop, or accept with FailOpen);
		// do not let them surface as ENOBUFS read errors.
		if err := nf.SetOption(netlink.NoENOBUFS, true); err != nil {
			r.log.V(2).Info("Cannot set NETLINK_NO_ENOBUFS", "queue", num, "err", err)
		}
		if r.cfg.ReadBuffer > 0 {
			if err := nf.Con.SetReadBuffer(r.cfg.ReadBuffer); err != nil {
				r.log.Info("Cannot set nfqueue socket read buffer", "queue", num, "err", err)
			}
		}
		w := &worker{r: r, nf: nf, queue: num, ctx: ctx}
		errfn := func(err error) int {
			if ctx.Err() != nil {
				return 1
			}
			var oe *netlink.OpError
			if errors.As(err, &oe) && (oe.Timeout() || errors.Is(oe.Err, unix.ENOBUFS) || errors.Is(oe.Err, unix.EINTR)) {
				r.c.receiveErrors.Add(1)
				return 0
			}
			r.c.receiveErrors.Add(1)
			fatal <- fmt.Errorf("reading nfqueue %d: %w", num, err)
			return 1
		}
		if err := nf.RegisterWithErrorFunc(ctx, w.handle, errfn); err != nil {
			return fmt.Errorf("binding nfqueue %d: %w", num, err)
		}
	}
	r.log.Info("Listening on nfqueue", "first", r.cfg.QueueNum, "queues", r.cfg.Queues,
		"failOpen", r.cfg.FailOpen, "allowMark", fmt.Sprintf("%#x", r.cfg.AllowMark))
	close(r.ready)

	select {
	case <-ctx.Done():
		return nil
	case err := <-fatal:
		return err
	}
}

type worker struct {
	r     *Runtime
	nf    *nfqueue.Nfqueue
	queue uint16
	ctx   context.Context
}

func (w *worker) handle(a nfqueue.Attribute) int {
	r := w.r
	r.c.received.Add(1)
	if a.PacketID == nil {
		r.c.malformed.Add(1)
		return 0
	}
	id := *a.PacketID
	var mark uint32
	if a.Mark != nil {
		mark = *a.Mark
	}
	var payload []byte
	if a.Payload != nil {
		payload = *a.Payload
	}

	if mark&r.cfg.AllowMark == r.cfg.AllowMark {
		// The packet already carries the allow bit: the ruleset did not
		// consume it after NF_REPEAT (missing or different first rule, or
		// another owner of the bit). Answering NF_REPEAT again would loop;
		// the bit means a previous verdict allowed the packet, so accept.
		if err := w.nf.SetVerdict(id, nfqueue.NfAccept); err != nil {
			r.c.verdictErrors.Add(1)
			return 0
		}
		if r.c.markLoops.Add(1) == 1 {
			r.log.Error(nil, "Queued packet already carries the allow mark: the ruleset's first rule does not handle it; accepting such packets without a decision",
				"queue", w.queue, "mark", fmt.Sprintf("%#x", mark), "allowMark", fmt.Sprintf("%#x", r.cfg.AllowMark))
		}
		return 0
	}

	p, l4, err := parsePacket(payload)
	if err != nil {
		w.failVerdict(id, &r.c.unparsableAccepted, &r.c.unparsableDropped)
		if r.log.V(4).Enabled() {
			r.log.V(4).Info("Unparsable queued packet", "queue", w.queue, "len", len(payload), "err", err)
		}
		return 0
	}

	if w.hold(id, mark, p) {
		return 0 // answered later, from its own goroutine (hold.go)
	}
	start := time.Now()
	allow, reason, ok := r.decide(p, payload, l4)
	w.answer(id, mark, p, allow, reason, ok, time.Since(start))
	return 0
}

// answer sends the verdict for a decided packet, counts and logs it.
func (w *worker) answer(id, mark uint32, p Packet, allow bool, reason string, ok bool, d time.Duration) {
	r := w.r
	var err error
	if !ok {
		w.failVerdict(id, &r.c.panicsAccepted, &r.c.panicsDropped)
		return
	}
	if allow && r.cfg.AcceptOnAllow {
		err = w.nf.SetVerdict(id, nfqueue.NfAccept)
	} else if allow {
		err = w.nf.SetVerdictWithOption(id, nfqueue.NfRepeat, nfqueue.WithMark(mark|r.cfg.AllowMark))
	} else {
		err = w.nf.SetVerdict(id, nfqueue.NfDrop)
	}
	if err != nil {
		r.c.verdictErrors.Add(1)
		r.log.Error(err, "Cannot send nfqueue verdict", "queue", w.queue, "id", id)
		return
	}
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
func (w *worker) failVerdict(id uint32, accepted, dropped *atomic.Uint64) {
	v := nfqueue.NfDrop
	if w.r.cfg.FailOpen {
		v = nfqueue.NfAccept
	}
	if err := w.nf.SetVerdict(id, v); err != nil {
		w.r.c.verdictErrors.Add(1)
		w.r.log.Error(err, "Cannot send nfqueue verdict", "queue", w.queue, "id", id)
		return
	}
	if v == nfqueue.NfAccept {
		accepted.Add(1)
	} else {
		dropped.Add(1)
	}
}

// PayloadDecider is a Decider that reads the queued packet itself: the
// Runtime calls DecidePayload instead of Decide, with the packet from its
// IP header on (cut at the copy range; valid only during the call) and the
// offset of its transport header (0: none).
type PayloadDecider interface {
	Decider
	DecidePayload(p Packet, packet []byte, l4 int) (allow bool, reason string)
}

func (r *Runtime) decide(p Packet, packet []byte, l4 int) (allow bool, reason string, ok bool) {
	defer func() {
		if e := recover(); e != nil {
			ok = false
			r.log.Error(fmt.Errorf("%v", e), "Decider panicked", "src", p.Src, "dst", p.Dst, "proto", p.Proto)
		}
	}()
	if pd, isPD := r.decider.(PayloadDecider); isPD {
		allow, reason = pd.DecidePayload(p, packet, l4)
	} else {
		allow, reason = r.decider.Decide(p)
	}
	return allow, reason, true
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

// nfqLogger adapts a klog.Logger to go-nfqueue's Logger.
type nfqLogger struct{ l klog.Logger }

func (n nfqLogger) Debugf(format string, args ...interface{}) {
	if n.l.V(5).Enabled() {
		n.l.V(5).Info(fmt.Sprintf(format, args...))
	}
}

func (n nfqLogger) Errorf(format string, args ...interface{}) {
	// go-nfqueue also reports its normal shutdown through Errorf ("Stop
	// receiving ...", "Could not unbind ..." once the socket is closed; the
	// kernel unbinds a closed socket's queues itself). Read errors reach
	// Run's error handler anyway.
	v := n.l.V(2)
	if strings.HasPrefix(format, "Stop receiving") || strings.HasPrefix(format, "Could not unbind") {
		v = n.l.V(4)
	}
	if v.Enabled() {
		v.Info(fmt.Sprintf(format, args...))
	}
}
