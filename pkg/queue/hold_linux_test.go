package queue

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// gateHolder holds connections to port 80 until release is closed (then
// allows them); it decides everything else at once, and gives port 80 the
// fail-mode denial when it cannot hold (Decide).
type gateHolder struct {
	release chan struct{}
	waiting chan struct{}
}

func (g *gateHolder) Decide(p Packet) (bool, string) {
	return p.DstPort != 80, "test: not held, decided at the bound"
}

func (g *gateHolder) Holds(p Packet) bool { return p.DstPort == 80 }

func (g *gateHolder) DecideHeld(ctx context.Context, p Packet) (bool, string) {
	g.waiting <- struct{}{}
	select {
	case <-g.release:
		return true, "test: released"
	case <-ctx.Done():
		return false, "test: stopped"
	}
}

// TestRuntimeKernelHolder checks that a Holder's held packet is deferred
// (the reader goes on answering others) and answered when DecideHeld
// returns.
func TestRuntimeKernelHolder(t *testing.T) {
	requireRoot(t)
	tp := newQueueLab(t, ":80", ":81")
	g := &gateHolder{release: make(chan struct{}), waiting: make(chan struct{}, 4)}
	rt := startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark}, g)

	held := make(chan error, 1)
	go func() { held <- tcpEcho(tp.client, "10.231.2.2:80", 5*time.Second) }()
	<-g.waiting
	if s := rt.Stats(); s.DeferredPending != 1 {
		t.Errorf("DeferredPending = %d, want 1", s.DeferredPending)
	}
	// Not held: decided while the first waits.
	if err := tcpEcho(tp.client, "10.231.2.2:81", 3*time.Second); err != nil {
		t.Errorf("TCP 81 while a packet is held: %v", err)
	}
	close(g.release)
	if err := <-held; err != nil {
		t.Errorf("held connection, released: %v", err)
	}
	// The count drops just after the verdict is sent, so the client may
	// see its connection before the count does: wait for it.
	deadline := time.Now().Add(5 * time.Second)
	for rt.Stats().DeferredPending != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("DeferredPending = %d 5 s after the release, want 0", rt.Stats().DeferredPending)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHoldingCap: past the cap of outstanding held packets, DecideOrDefer
// drops at once, and a slot frees when a held decision is answered.
func TestHoldingCap(t *testing.T) {
	g := &gateHolder{release: make(chan struct{}), waiting: make(chan struct{}, 4)}
	r, err := NewRuntime(RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark, MaxQueueLen: 1}, g)
	if err != nil {
		t.Fatal(err)
	}
	// A closed socket: the verdict write fails, which the test ignores.
	q := &qsock{queue: testQueueNum, fd: -1, closed: true}
	later := func(id uint32) Later {
		q.pending.Add(1) // as Runtime.decide does before DecideOrDefer
		r.c.deferredPending.Add(1)
		return Later{r: r, q: q, id: id}
	}
	p80 := Packet{Family: 4, Proto: 6, DstPort: 80}
	if _, _, deferred := r.deferring.DecideOrDefer(p80, later(1)); !deferred {
		t.Fatal("a held packet was not deferred")
	}
	<-g.waiting
	allow, reason, deferred := r.deferring.DecideOrDefer(p80, later(2))
	if deferred || allow {
		t.Fatalf("past the cap: allow %v, deferred %v (%s); want an immediate denial", allow, deferred, reason)
	}
	q.pending.Add(-1) // the reader's part for the packet it answered
	r.c.deferredPending.Add(-1)
	close(g.release)
	deadline := time.Now().Add(5 * time.Second)
	for r.c.deferredPending.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the held decision was not answered: %d pending", r.c.deferredPending.Load())
		}
		time.Sleep(time.Millisecond)
	}
	for {
		if _, _, deferred := r.deferring.DecideOrDefer(p80, later(3)); deferred {
			<-g.waiting
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot was not freed after the held decision was answered")
		}
		q.pending.Add(-1)
		r.c.deferredPending.Add(-1)
		time.Sleep(time.Millisecond)
	}
}

// TestHoldingPerSource: one source address holds at most MaxHeldPerSource
// packets; past it its packets are dropped at once (not decided by the
// Holder's fail mode), counted, while other sources keep holding.
func TestHoldingPerSource(t *testing.T) {
	g := &gateHolder{release: make(chan struct{}), waiting: make(chan struct{}, 4)}
	defer close(g.release)
	r, err := NewRuntime(RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark, MaxQueueLen: 4, MaxHeldPerSource: 1}, g)
	if err != nil {
		t.Fatal(err)
	}
	q := &qsock{queue: testQueueNum, fd: -1, closed: true}
	later := func(id uint32) Later {
		q.pending.Add(1)
		r.c.deferredPending.Add(1)
		return Later{r: r, q: q, id: id}
	}
	flooder := Packet{Family: 4, Proto: 6, DstPort: 80, Src: netip.MustParseAddr("10.244.1.5")}
	other := Packet{Family: 4, Proto: 6, DstPort: 80, Src: netip.MustParseAddr("10.244.1.6")}
	if _, _, deferred := r.deferring.DecideOrDefer(flooder, later(1)); !deferred {
		t.Fatal("the first held packet was not deferred")
	}
	<-g.waiting
	allow, reason, deferred := r.deferring.DecideOrDefer(flooder, later(2))
	if deferred || allow || reason != ReasonHeldOverload {
		t.Fatalf("past the source's bound: allow %v, deferred %v (%s); want a drop at once", allow, deferred, reason)
	}
	if _, _, deferred := r.deferring.DecideOrDefer(other, later(3)); !deferred {
		t.Fatal("another source's packet was not held")
	}
	<-g.waiting
	if s := r.Stats(); s.HeldDroppedSource != 1 || s.HeldDroppedFull != 0 {
		t.Errorf("stats %+v, want 1 held packet dropped at the source's bound", s)
	}
}
