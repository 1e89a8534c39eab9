package main

import (
	"container/list"
	"context"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// reviewGate decides when a TokenReview or SubjectAccessReview that the
// caches could not answer may go to the API server. Its limits bound what
// the agent and the API server spend on peers with bad tokens, without
// letting any set of peers lock out another one (issue 43, item 7):
//
//   - Each remote address has its own allowance (a token bucket): past it,
//     that address alone is refused (429).
//   - Reviews overall are bounded in rate and in number in flight. When
//     there is no turn at once, a request waits (a bounded time, in a
//     bounded line) and turns go first to the address whose last review is
//     oldest, an address never reviewed (or forgotten) first of all: many
//     addresses flooding keep each other recent, so one that has not asked
//     lately (a scraper rescheduled to a new address, or whose cached
//     answer expired) is served ahead of them.
//   - The addresses remembered are bounded; a new address never waits for
//     room: the one unused longest is forgotten, which only gives it a
//     fresh allowance and the front of the line, where it competes with
//     other new addresses in arrival order.
type reviewGate struct {
	perSource rate.Limit
	burst     int
	inFlight  int
	maxWait   time.Duration
	maxQueue  int
	maxSource int
	now       func() time.Time

	mu       sync.Mutex
	global   *rate.Limiter
	busy     int
	sources  map[netip.Addr]*list.Element // of *gateSource, most recently used first
	lru      *list.List
	waiting  []*gateWaiter
	retrying bool // a timer will look at the line again when the next global token is due
}

type gateSource struct {
	addr       netip.Addr
	lim        *rate.Limiter
	lastReview time.Time // zero: never reviewed
}

type gateWaiter struct {
	src    *gateSource
	since  time.Time // arrival, to break ties in arrival order
	ready  chan struct{}
	result error // set under mu before ready is closed
}

// reviewGateConfig is the gate's bounds; see the constants in
// agent_metricsauth.go for install values.
type reviewGateConfig struct {
	perSource   rate.Limit
	burst       int
	globalRate  rate.Limit
	globalBurst int
	inFlight    int
	maxWait     time.Duration
	maxQueue    int
	maxSource   int
}

func newReviewGate(c reviewGateConfig) *reviewGate {
	return &reviewGate{perSource: c.perSource, burst: c.burst, inFlight: c.inFlight, maxWait: c.maxWait,
		maxQueue: c.maxQueue, maxSource: c.maxSource, now: time.Now,
		global:  rate.NewLimiter(c.globalRate, c.globalBurst),
		sources: map[netip.Addr]*list.Element{}, lru: list.New()}
}

// acquire waits for a turn for one review from src; the caller runs the
// review and then calls the release function. errThrottled when src is
// past its allowance, or no turn came within maxWait.
func (g *reviewGate) acquire(ctx context.Context, src netip.Addr) (func(), error) {
	g.mu.Lock()
	now := g.now()
	s := g.source(src)
	if !s.lim.AllowN(now, 1) {
		g.mu.Unlock()
		return nil, errThrottled
	}
	if len(g.waiting) == 0 && g.turnLocked(now) {
		g.grantLocked(s, now)
		g.mu.Unlock()
		return g.release, nil
	}
	w := &gateWaiter{src: s, since: now, ready: make(chan struct{})}
	if !g.enqueueLocked(w) {
		g.mu.Unlock()
		return nil, errThrottled
	}
	g.dispatchLocked()
	g.mu.Unlock()

	timer := time.NewTimer(g.maxWait)
	defer timer.Stop()
	select {
	case <-w.ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.ready:
		if w.result != nil {
			return nil, w.result
		}
		return g.release, nil
	default:
	}
	g.removeLocked(w)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errThrottled
}

// source returns src's state, remembering it (and forgetting the address
// unused longest when there are maxSource).
func (g *reviewGate) source(src netip.Addr) *gateSource {
	if e, ok := g.sources[src]; ok {
		g.lru.MoveToFront(e)
		return e.Value.(*gateSource)
	}
	for len(g.sources) >= g.maxSource {
		old := g.lru.Back()
		g.lru.Remove(old)
		delete(g.sources, old.Value.(*gateSource).addr)
	}
	s := &gateSource{addr: src, lim: rate.NewLimiter(g.perSource, g.burst)}
	g.sources[src] = g.lru.PushFront(s)
	return s
}

// before: whether a waiter goes ahead of b: the older last review first,
// then the earlier arrival.
func (a *gateWaiter) before(b *gateWaiter) bool {
	if !a.src.lastReview.Equal(b.src.lastReview) {
		return a.src.lastReview.Before(b.src.lastReview)
	}
	return a.since.Before(b.since)
}

// enqueueLocked puts w in line; when the line is full, the last in line
// (by priority) leaves it with errThrottled if w goes before it, else w
// is refused.
func (g *reviewGate) enqueueLocked(w *gateWaiter) bool {
	if len(g.waiting) >= g.maxQueue {
		last := 0
		for i, o := range g.waiting {
			if g.waiting[last].before(o) {
				last = i
			}
		}
		if !w.before(g.waiting[last]) {
			return false
		}
		o := g.waiting[last]
		g.waiting = append(g.waiting[:last], g.waiting[last+1:]...)
		o.result = errThrottled
		close(o.ready)
	}
	g.waiting = append(g.waiting, w)
	return true
}

func (g *reviewGate) removeLocked(w *gateWaiter) {
	for i, o := range g.waiting {
		if o == w {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

// turnLocked takes a global turn if one is free now.
func (g *reviewGate) turnLocked(now time.Time) bool {
	return g.busy < g.inFlight && g.global.AllowN(now, 1)
}

func (g *reviewGate) grantLocked(s *gateSource, now time.Time) {
	g.busy++
	s.lastReview = now
}

func (g *reviewGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy--
	g.dispatchLocked()
}

// dispatchLocked gives free turns to the waiters first in line. When the
// global rate is what stops it, a timer looks again when the next token is
// due; when the in-flight bound is, the next release does.
func (g *reviewGate) dispatchLocked() {
	now := g.now()
	for len(g.waiting) > 0 && g.busy < g.inFlight {
		if !g.global.AllowN(now, 1) {
			g.retryLocked(now)
			return
		}
		first := 0
		for i, o := range g.waiting {
			if o.before(g.waiting[first]) {
				first = i
			}
		}
		w := g.waiting[first]
		g.waiting = append(g.waiting[:first], g.waiting[first+1:]...)
		g.grantLocked(w.src, now)
		close(w.ready)
	}
}

func (g *reviewGate) retryLocked(now time.Time) {
	if g.retrying {
		return
	}
	need := 1 - g.global.TokensAt(now)
	delay := time.Duration(need / float64(g.global.Limit()) * float64(time.Second))
	if delay < time.Millisecond {
		delay = time.Millisecond
	}
	g.retrying = true
	time.AfterFunc(delay, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.retrying = false
		g.dispatchLocked()
	})
}

// remembered is how many addresses the gate holds state for.
func (g *reviewGate) remembered() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sources)
}
