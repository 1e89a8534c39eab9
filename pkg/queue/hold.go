package queue

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"
)

// Holder is an optional interface of a Decider for packets it cannot decide
// yet: a connection of a pod the agent has not learned about
// (evaluate.Evaluator.DecideHeld, through Evaluating).
// A decision that waits must not run on a queue's reader (the kernel keeps
// every later packet of that queue waiting behind it), so the Runtime
// defers a held packet (see DeferringDecider): it calls DecideHeld from a
// goroutine of its own and answers through the packet's Later. NFQUEUE
// verdicts name their packet's id, so they may be sent in any order; the
// reader sends no batch verdict while one is outstanding.
type Holder interface {
	Decider
	// Holds reports, without blocking, whether deciding p may wait.
	Holds(p Packet) bool
	// DecideHeld decides p, waiting (bounded by the Holder) until it can.
	// It returns early, with the fail-mode decision, when ctx ends.
	DecideHeld(ctx context.Context, p Packet) (allow bool, reason string)
}

// holding is the DeferringDecider a Runtime makes of a Holder: it defers
// the packets the Holder holds, at most cap(slots) at a time and at most
// perSource from one source address. Past either bound the packet is
// dropped at once (an overloaded queue never decides by the fail mode: a
// dropped SYN is sent again, by when the pod is usually known), counted
// (Stats.HeldDroppedSource, HeldDroppedFull, and the Observer's
// ObserveHeldDrop) and logged, rate limited, with its source.
type holding struct {
	r         *Runtime
	h         Holder
	slots     chan struct{}
	perSource int
	log       *rate.Limiter

	mu sync.Mutex
	// held counts the held packets per source address; an address leaves
	// when its count returns to 0, so the map has at most cap(slots)
	// entries.
	held map[netip.Addr]int
}

// Bounds of a held packet that holding drops, as HeldDropObserver
// receives them.
const (
	HeldBoundSource = "source"
	HeldBoundTotal  = "total"
)

// ReasonHeldOverload is the reason of a held packet dropped at a bound.
const ReasonHeldOverload = "too many connections of unknown pod addresses held (per source or in all): dropped, not decided"

// HeldDropObserver is an optional interface of RuntimeConfig.Observer: one
// call per held packet dropped at a bound (HeldBoundSource or
// HeldBoundTotal).
type HeldDropObserver interface {
	ObserveHeldDrop(bound string)
}

func newHolding(r *Runtime, h Holder, max, perSource int) *holding {
	return &holding{r: r, h: h, slots: make(chan struct{}, max), perSource: perSource,
		log: rate.NewLimiter(1, 5), held: map[netip.Addr]int{}}
}

// take reserves a slot for a packet of src; false (and counted) when a
// bound is reached.
func (a *holding) take(src netip.Addr) bool {
	a.mu.Lock()
	n := a.held[src]
	if n >= a.perSource {
		a.mu.Unlock()
		a.drop(src, HeldBoundSource, &a.r.c.heldDroppedSource)
		return false
	}
	select {
	case a.slots <- struct{}{}:
	default:
		a.mu.Unlock()
		a.drop(src, HeldBoundTotal, &a.r.c.heldDroppedFull)
		return false
	}
	a.held[src] = n + 1
	a.mu.Unlock()
	return true
}

// release frees the slot of a packet of src.
func (a *holding) release(src netip.Addr) {
	a.mu.Lock()
	if n := a.held[src] - 1; n > 0 {
		a.held[src] = n
	} else {
		delete(a.held, src)
	}
	<-a.slots
	a.mu.Unlock()
}

func (a *holding) drop(src netip.Addr, bound string, counter interface{ Add(uint64) uint64 }) {
	counter.Add(1)
	if o, ok := a.r.cfg.Observer.(HeldDropObserver); ok {
		o.ObserveHeldDrop(bound)
	}
	if a.log.Allow() {
		a.r.log.Info("Dropping a new connection of an unknown pod address: too many held", "bound", bound, "src", src,
			"perSource", a.perSource, "total", cap(a.slots))
	}
}

// Decide implements Decider.
func (a *holding) Decide(p Packet) (bool, string) { return a.h.Decide(p) }

// DecideOrDefer implements DeferringDecider.
func (a *holding) DecideOrDefer(p Packet, later Later) (bool, string, bool) {
	if !a.h.Holds(p) {
		allow, reason := a.h.Decide(p)
		return allow, reason, false
	}
	if !a.take(p.Src) {
		return false, ReasonHeldOverload, false
	}
	go func() {
		defer a.release(p.Src)
		allow, reason, ok := a.decideHeld(p)
		var err error
		if ok {
			err = later.Verdict(allow, reason)
		} else {
			err = later.fail()
		}
		if err != nil && a.r.runCtx.Err() == nil {
			a.r.log.Error(err, "Cannot send the verdict of a held packet")
		}
	}()
	return false, "", true
}

// decideHeld is DecideHeld on the Runtime's context; ok is false when the
// Holder panicked (the packet then gets the fail-mode verdict, as with a
// panicking Decider).
func (a *holding) decideHeld(p Packet) (allow bool, reason string, ok bool) {
	defer func() {
		if e := recover(); e != nil {
			ok = false
			a.r.log.Error(fmt.Errorf("%v", e), "Holder panicked", "src", p.Src, "dst", p.Dst, "proto", p.Proto)
		}
	}()
	allow, reason = a.h.DecideHeld(a.r.runCtx, p)
	return allow, reason, true
}

// fail answers a deferred packet that got no decision like failVerdict
// does: NF_ACCEPT (not remembered) when failing open, else NF_DROP.
func (l Later) fail() error {
	r := l.r
	v, counter := uint32(nfDrop), &r.c.panicsDropped
	if r.cfg.FailOpen {
		v, counter = nfAccept, &r.c.panicsAccepted
	}
	err := l.q.sendOne(l.id, v, false, 0)
	l.q.pending.Add(-1)
	r.c.deferredPending.Add(-1)
	if err != nil {
		r.c.verdictErrors.Add(1)
		return fmt.Errorf("deferred verdict for packet %d of queue %d: %w", l.id, l.q.queue, err)
	}
	counter.Add(1)
	return nil
}
