package queue

import (
	"context"
	"time"
)

// Holder is an optional interface of a Decider for packets it cannot decide
// yet: a connection of a pod the agent has not learned about (unknown.go).
// The runtime reads each queue's packets in one goroutine and the kernel
// keeps every later packet of that queue waiting behind one being decided,
// so a decision that waits must not run there: the runtime calls
// DecideHeld from a goroutine of its own and sends the verdict from there.
// NFQUEUE verdicts name their packet's id, so they may be sent in any
// order; only batch verdicts (which this runtime never sends) must not.
type Holder interface {
	// Holds reports, without blocking, whether deciding p may wait.
	Holds(p Packet) bool
	// DecideHeld decides p, waiting (bounded by the Holder) until it can.
	// It returns early, with the fail-mode decision, when ctx ends.
	DecideHeld(ctx context.Context, p Packet) (allow bool, reason string)
}

// hold answers p from a goroutine when the Decider may have to wait for it.
// It reports false when the packet is to be decided right away: the
// Decider does not hold it, or MaxQueueLen packets are already waiting (the
// kernel queue cannot hold more anyway), in which case Decide gives the
// decision it would give at the wait's bound.
func (w *worker) hold(id, mark uint32, p Packet) bool {
	h, ok := w.r.decider.(Holder)
	if !ok || !h.Holds(p) {
		return false
	}
	select {
	case w.r.held <- struct{}{}:
	default:
		return false
	}
	go func() {
		defer func() { <-w.r.held }()
		start := time.Now()
		allow, reason, ok := w.r.decideHeld(w.ctx, h, p)
		w.answer(id, mark, p, allow, reason, ok, time.Since(start))
	}()
	return true
}

// decideHeld is decide for a held packet: a panicking Holder gets the
// fail-mode verdict, as a panicking Decider does.
func (r *Runtime) decideHeld(ctx context.Context, h Holder, p Packet) (allow bool, reason string, ok bool) {
	defer func() {
		if e := recover(); e != nil {
			ok = false
			r.log.Error(nil, "Holder panicked", "src", p.Src, "dst", p.Dst, "proto", p.Proto, "panic", e)
		}
	}()
	allow, reason = h.DecideHeld(ctx, p)
	return allow, reason, true
}
