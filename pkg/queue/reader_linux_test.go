package queue

import (
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
)

// deferAll is a DeferringDecider that defers every IPv4 TCP packet to port
// 80 or 82 (80 is to be allowed, 82 denied), handing it to the test on
// held, and decides the others at once (allow 80 only).
type deferAll struct{ held chan Later }

func (d *deferAll) Decide(p Packet) (bool, string) { return p.DstPort == 80, "test: immediate" }

func (d *deferAll) DecideOrDefer(p Packet, l Later) (bool, string, bool) {
	if p.Family != 4 || p.Proto != unix.IPPROTO_TCP || (p.DstPort != 80 && p.DstPort != 82) {
		a, r := d.Decide(p)
		return a, r, false
	}
	d.held <- l
	return false, "", true
}

// newQueueLab is a topology whose router queues the client's new
// connections to testQueueNum, with echo servers on the server's addrs.
func newQueueLab(t *testing.T, addrs ...string) *topology {
	tp := newTopology(t)
	for _, a := range addrs {
		echoServer(t, tp.server, a)
	}
	loadRouter(t, tp, false, queuerule.QueueRuleConfig{QueueNum: testQueueNum})
	return tp
}

// TestRuntimeKernelDeferred checks deferred decisions: two packets wait
// for their verdicts while the reader goes on deciding others, then are
// answered out of order from another goroutine, each with its own verdict.
func TestRuntimeKernelDeferred(t *testing.T) {
	requireRoot(t)
	tp := newQueueLab(t, ":80", ":82")
	dec := &deferAll{held: make(chan Later, 16)}
	rt := startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark}, dec)

	res80, res82 := make(chan error, 1), make(chan error, 1)
	go func() { res80 <- tcpEcho(tp.client, "10.231.2.2:80", 5*time.Second) }()
	first := <-dec.held
	go func() { res82 <- tcpEcho(tp.client, "10.231.2.2:82", 3*time.Second) }()
	second := <-dec.held
	if s := rt.Stats(); s.DeferredPending != 2 {
		t.Errorf("DeferredPending = %d, want 2", s.DeferredPending)
	}
	// The reader is not blocked by the waiting packets.
	if err := tcpEcho(tp.client, "[fd31:2::2]:80", 3*time.Second); err != nil {
		t.Errorf("IPv6 TCP 80 while two packets wait: %v", err)
	}
	// Answer the later packet first, then the earlier one; then whatever
	// comes (SYN retransmits) at once.
	answer := func(l Later) {
		allow := l.Packet().DstPort == 80
		if err := l.Verdict(allow, "test: deferred"); err != nil {
			t.Errorf("Verdict(%v) for port %d: %v", allow, l.Packet().DstPort, err)
		}
	}
	answer(second)
	answer(first)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case l := <-dec.held:
				answer(l)
			case <-stop:
				return
			}
		}
	}()
	err80, err82 := <-res80, <-res82
	close(stop)
	<-done
	if err80 != nil {
		t.Errorf("deferred, then allowed TCP 80: %v", err80)
	}
	if err82 == nil {
		t.Error("deferred, then denied TCP 82 connected")
	}
	s := rt.Stats()
	if s.Deferred < 2 || s.Allowed() < 2 || s.Denied() < 1 || s.VerdictErrors != 0 || s.DeferredPending != 0 {
		t.Errorf("Stats() = %+v, want >= 2 deferred, >= 2 allowed, >= 1 denied, none pending, no errors", s)
	}
}

// TestRuntimeKernelBatchVerdicts holds the reader in the Decider until more
// packets wait in the queue: the reader then takes them in one round and
// answers them with one batch verdict when they are all allowed, and each
// with its own verdict when they are not.
func TestRuntimeKernelBatchVerdicts(t *testing.T) {
	requireRoot(t)
	tp := newQueueLab(t, ":80", ":81")

	var mu sync.Mutex
	gate := make(chan struct{})
	held := make(chan struct{}, 1)
	dec := DeciderFunc(func(p Packet) (bool, string) {
		mu.Lock()
		g := gate
		mu.Unlock()
		if g != nil {
			select {
			case held <- struct{}{}:
				<-g
			default:
			}
		}
		return p.DstPort == 80, "test"
	})
	rt := startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark}, dec)

	// wantBatch is checked for rounds of allowed connections only: SYN
	// retransmits of denied ones may come in pairs and be batched too.
	round := func(ports []string, wantBatch bool) {
		t.Helper()
		mu.Lock()
		gate = make(chan struct{})
		g := gate
		mu.Unlock()
		before := rt.Stats().BatchVerdicts
		errs := make([]chan error, len(ports))
		for i, port := range ports {
			errs[i] = make(chan error, 1)
			go func() { errs[i] <- tcpEcho(tp.client, "10.231.2.2:"+port, 3*time.Second) }()
			if i == 0 {
				<-held // the reader now waits in the Decider
			}
		}
		waitFor(t, "all SYNs queued", func() bool {
			st, err := inNS(tp.router, ReadKernelQueueStats)
			return err == nil && len(st) == 1 && int(st[0].QueueTotal) == len(ports)
		})
		mu.Lock()
		gate = nil
		mu.Unlock()
		close(g)
		for i, port := range ports {
			err := <-errs[i]
			if port == "80" && err != nil {
				t.Errorf("TCP 80: %v", err)
			}
			if port != "80" && err == nil {
				t.Errorf("TCP %s connected, want it denied", port)
			}
		}
		if got := rt.Stats().BatchVerdicts > before; wantBatch && !got {
			t.Errorf("batch verdict sent: %v, want %v (stats %+v)", got, wantBatch, rt.Stats())
		}
	}
	round([]string{"80", "80", "80", "80"}, true)
	round([]string{"80", "81", "80", "81"}, false)
	if s := rt.Stats(); s.VerdictErrors != 0 || s.Allowed() < 6 {
		t.Errorf("Stats() = %+v, want no verdict errors and >= 6 allowed", s)
	}
}

// TestRuntimeKernelHold: with Hold, the queue is bound but not read; the
// kernel keeps the packet queued (no listener would mean a drop) and the
// connection completes once Hold is closed.
func TestRuntimeKernelHold(t *testing.T) {
	requireRoot(t)
	tp := newQueueLab(t, ":80")
	hold := make(chan struct{})
	dec := &countingDecider{}
	startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark, Hold: hold}, dec)
	res := make(chan error, 1)
	go func() { res <- tcpEcho(tp.client, "10.231.2.2:80", 5*time.Second) }()
	waitFor(t, "the SYN waiting in the queue", func() bool {
		st, err := inNS(tp.router, ReadKernelQueueStats)
		return err == nil && len(st) == 1 && st[0].QueueTotal == 1
	})
	if n := dec.count(4, unix.IPPROTO_TCP, 80); n != 0 {
		t.Fatalf("the decider saw %d packets before Hold was closed", n)
	}
	close(hold)
	if err := <-res; err != nil {
		t.Errorf("TCP 80 held, then allowed: %v", err)
	}
	if n := dec.count(4, unix.IPPROTO_TCP, 80); n != 1 {
		t.Errorf("the decider saw %d packets, want 1", n)
	}
}
