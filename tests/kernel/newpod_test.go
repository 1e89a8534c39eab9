package kernel

import (
	"context"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// unknownCounts counts the evaluators' unknown-pod decisions by result.
type unknownCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (u *unknownCounts) ObserveUnknownPod(result string, _ time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == nil {
		u.n = map[string]int{}
	}
	u.n[result]++
}

func (u *unknownCounts) get(result string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[result]
}

// TestNewPodsDecidedBeforeKnown creates pods one after another under a
// default-deny policy; each sends its first packet (TCP or UDP, to x/srv on
// the other or the same node) the moment its interface is up, and the
// agents learn it informerDelay later. No connection the policies deny may
// be admitted (no conntrack entry from a denied pod on either node), every
// allowed one must connect, only later. Over IPv4, and over IPv6 with
// dual-stack pods (the IPv6 pod ranges are the nodes' second podCIDRs).
func TestNewPodsDecidedBeforeKnown(t *testing.T) {
	requireRoot(t)
	for _, fam := range []struct {
		name string
		srv  func(i, n int) netip.Addr
	}{{"IPv4", lab.PodIP}, {"IPv6", lab.PodIPv6}} {
		t.Run(fam.name, func(t *testing.T) { newPodsDecidedBeforeKnown(t, fam.srv(0, 0)) })
	}
}

// newPodsDecidedBeforeKnown is TestNewPodsDecidedBeforeKnown with the pods
// connecting to x/srv's address srvIP (x/srv is dual-stack for IPv6).
func newPodsDecidedBeforeKnown(t *testing.T, srvIP netip.Addr) {
	n := 200
	if testing.Short() {
		n = 40
	}
	const informerDelay = 30 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	counts := &unknownCounts{}
	l, err := lab.New(ctx, nil, lab.Config{UnknownPods: counts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	l.NewPodPolicies()
	srv := lab.PodSpec{Namespace: "x", Name: "srv", Node: 0, IP: lab.PodIP(0, 0), Labels: map[string]string{"app": "srv"},
		TCPPorts: []uint16{80}, UDPPorts: []uint16{53}}
	if srvIP.Is6() {
		srv.IPv6 = srvIP
	}
	if err := l.StartPod(srv); err != nil {
		t.Fatal(err)
	}
	l.Know(srv)
	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}

	rep, err := l.RunNewPods(ctx, srvIP, n, informerDelay)
	if err != nil {
		t.Fatal(err)
	}
	results := rep.Outcomes

	denied := map[netip.Addr]string{}
	var delays []time.Duration
	for _, o := range results {
		pod := o.Probe.From.Pod
		if o.Err != nil {
			t.Fatalf("%s: probe: %v", pod, o.Err)
		}
		switch {
		case o.Want && !o.Connected:
			t.Errorf("%s (%s, allowed): not connected (%s after %v)", pod, o.Proto, o.Reason, o.Duration)
		case !o.Want && o.Connected:
			t.Errorf("%s (%s, denied): connected", pod, o.Proto)
		case o.Want:
			delays = append(delays, o.Duration)
		default:
			denied[o.Src] = pod
		}
	}
	// A packet admitted through either node's forward hook leaves a
	// confirmed conntrack entry; a dropped first packet leaves none.
	for _, node := range l.Nodes() {
		flows, err := l.Conntrack(node)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if name, ok := denied[f.TupleOrig.IP.SourceAddress]; ok {
				t.Errorf("%s: conntrack entry from denied pod %s: %v", node, name, f)
			}
		}
	}
	held := counts.get(evaluate.UnknownPodProgrammed)
	if held == 0 {
		t.Fatal("no connection was held for an unknown pod: the test did not exercise the unknown-pod path")
	}
	if to := counts.get(evaluate.UnknownPodTimeoutDropped) + counts.get(evaluate.UnknownPodTimeoutAllowed); to != 0 {
		t.Errorf("%d connections reached the wait's bound", to)
	}

	// Programmed pods never reach the queue again.
	received := func(node string) uint64 {
		st, _ := l.QueueStats(node)
		return st.Received
	}
	before := map[string]uint64{}
	for _, node := range l.Nodes() {
		before[node] = received(node)
	}
	var again []netlab.ProbeReq
	for _, o := range results[:min(n, 40)] {
		req := o.ProbeReq
		req.Timeout = 2 * time.Second
		again = append(again, req)
	}
	for i, r := range l.Net().ProbeMany(ctx, again, 8) {
		if r.Connected != results[i].Want {
			t.Errorf("%s again: connected=%v, want %v", results[i].Probe.From.Pod, r.Connected, results[i].Want)
		}
	}
	for _, node := range l.Nodes() {
		if got := received(node); got != before[node] {
			t.Errorf("%s: %d packets of programmed pods were queued", node, got-before[node])
		}
	}

	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	t.Logf("%d new pods (%d allowed, %d denied), informer delay %v: %d connections held until programmed; "+
		"0 denied connections admitted; allowed first-connection time p50 %v, p99 %v, max %v",
		n, len(delays), len(denied), informerDelay, held, pct(delays, 50), pct(delays, 99), slices.Max(delays))
}

// pct is the p-th percentile of sorted durations.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}
