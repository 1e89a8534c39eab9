package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// gateAddr is the i-th address of 10.244.0.0/16 (pods of many nodes).
func gateAddr(i int) string {
	return fmt.Sprintf("10.244.%d.%d:4000", i/250, 2+i%250)
}

func newTestAuth(t *testing.T, gate reviewGateConfig) (http.Handler, *delegatedAuth, *atomic.Int32) {
	t.Helper()
	cl, reviews := fakeReviews()
	a := newDelegatedAuthWith(cl, newTestHTTPMetrics(t).auth, klog.Background(), gate)
	return a.wrap(metricsMux(prometheus.NewRegistry(), false)), a, reviews
}

func authGet(h http.Handler, from, token string) int {
	req, _ := http.NewRequest(http.MethodGet, "https://node:9402/metrics", nil)
	req.RemoteAddr = from
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// TestDelegatedAuthNoLockout is issue 43's lockout (item 7): more remote
// addresses than the gate remembers each send a made-up token; then a
// scraper with a valid token, from an address never seen, is let in, and
// the gate's memory stays bounded. The global rate is raised so that the
// test does not wait for it (TestReviewGateNewAddressFirst checks it).
func TestDelegatedAuthNoLockout(t *testing.T) {
	cfg := authGateConfig
	cfg.globalRate, cfg.globalBurst = 1e6, 1e6
	cfg.maxSource = 256
	h, a, _ := newTestAuth(t, cfg)
	for i := range cfg.maxSource + 44 {
		authGet(h, gateAddr(i), fmt.Sprintf("made-up-%d", i))
	}
	if got := authGet(h, "10.245.0.9:5000", "good"); got != http.StatusOK {
		t.Errorf("a valid token from a new address after %d addresses sent made-up tokens: %d, want 200", cfg.maxSource+44, got)
	}
	if n := a.gate.remembered(); n > cfg.maxSource {
		t.Errorf("the gate remembers %d addresses, bound %d", n, cfg.maxSource)
	}
}

// TestDelegatedAuthAllowedCacheKept: once a request is allowed, a flood of
// made-up tokens from many addresses (more than the caches hold) does not
// push its answer out: the next scrape needs no review.
func TestDelegatedAuthAllowedCacheKept(t *testing.T) {
	cfg := authGateConfig
	cfg.globalRate, cfg.globalBurst = 1e6, 1e6
	h, _, reviews := newTestAuth(t, cfg)
	if got := authGet(h, "10.245.0.9:5000", "good"); got != http.StatusOK {
		t.Fatalf("valid token: %d", got)
	}
	for i := range 2 * authCacheSize {
		authGet(h, gateAddr(i), fmt.Sprintf("made-up-%d", i))
	}
	before := reviews.Load()
	if got := authGet(h, "10.245.0.9:5000", "good"); got != http.StatusOK {
		t.Fatalf("valid token after the flood: %d", got)
	}
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("%d reviews for a request allowed before the flood: its answer was pushed out of the cache", n)
	}
}

// TestReviewGateNewAddressFirst: many addresses keep every global turn
// busy and the line full; an address that has had no review still gets a
// turn, ahead of them, every time (without the order by last review it
// finds the line full and gets 429).
func TestReviewGateNewAddressFirst(t *testing.T) {
	g := newReviewGate(reviewGateConfig{perSource: 1e6, burst: 1e6, globalRate: 100, globalBurst: 1,
		inFlight: 2, maxWait: 2 * time.Second, maxQueue: 8, maxSource: 64})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var attackerTurns atomic.Int32
	for i := range 32 {
		src := netip.MustParseAddrPort(gateAddr(i)).Addr()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				release, err := g.acquire(ctx, src)
				if err != nil {
					continue
				}
				attackerTurns.Add(1)
				time.Sleep(5 * time.Millisecond)
				release()
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	// Every flooding address has had turns (until then some are as new
	// as the newcomer, and go first by arrival).
	for attackerTurns.Load() < 64 {
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 5 {
		src := netip.MustParseAddr(fmt.Sprintf("10.245.0.%d", 10+i))
		release, err := g.acquire(ctx, src)
		if err != nil {
			t.Errorf("new address %v while 32 addresses flood: %v", src, err)
			continue
		}
		release()
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("cancelled early")
	}
}
