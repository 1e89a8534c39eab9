package queue

import (
	"context"
	"fmt"
)

// Holder is an optional interface of a Decider for packets it cannot decide
// yet: a connection of a pod the agent has not learned about (unknown.go).
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
// the packets the Holder holds, at most cap(slots) at a time. Past that
// (the kernel queue cannot hold many more anyway) Decide decides at once,
// with the decision the Holder gives at its wait's bound.
type holding struct {
	r     *Runtime
	h     Holder
	slots chan struct{}
}

func newHolding(r *Runtime, h Holder, max int) *holding {
	return &holding{r: r, h: h, slots: make(chan struct{}, max)}
}

// Decide implements Decider.
func (a *holding) Decide(p Packet) (bool, string) { return a.h.Decide(p) }

// DecideOrDefer implements DeferringDecider.
func (a *holding) DecideOrDefer(p Packet, later Later) (bool, string, bool) {
	if !a.h.Holds(p) {
		allow, reason := a.h.Decide(p)
		return allow, reason, false
	}
	select {
	case a.slots <- struct{}{}:
	default:
		allow, reason := a.h.Decide(p)
		return allow, reason, false
	}
	go func() {
		defer func() { <-a.slots }()
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
