package kernel

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/internal/podlab"
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

func selector(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func ports(tcp, udp int32) []networkingv1.NetworkPolicyPort {
	t, u := corev1.ProtocolTCP, corev1.ProtocolUDP
	return []networkingv1.NetworkPolicyPort{{Protocol: &t, Port: ptrTo(intstr.FromInt32(tcp))}, {Protocol: &u, Port: ptrTo(intstr.FromInt32(udp))}}
}

func ptrTo[T any](v T) *T { return &v }

// newPodPolicies: pods of namespace "new" may only reach x/srv, and only
// with role=client. Only the new pod's own egress denies the others: a pod
// the agent does not know yet would be unrestricted without the unknown-pod
// path (an allow-list on x/srv's ingress would fail closed for it anyway).
func newPodPolicies(l *podlab.Lab) {
	l.Namespace("x", nil)
	l.Namespace("new", nil)
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "default-deny-egress"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "clients-to-srv"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *selector("role", "client"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: selector("kubernetes.io/metadata.name", "x"), PodSelector: selector("app", "srv")}}, Ports: ports(80, 53)}}}})
}

// TestNewPodsDecidedBeforeKnown creates pods one after another under a
// default-deny policy; each sends its first packet (TCP or UDP, to x/srv on
// the other or the same node) the moment its interface is up, and the
// agents learn it informerDelay later. No connection the policies deny may
// be admitted (no conntrack entry from a denied pod on either node), every
// allowed one must connect, only later.
func TestNewPodsDecidedBeforeKnown(t *testing.T) {
	requireRoot(t)
	n := 200
	if testing.Short() {
		n = 40
	}
	const informerDelay = 30 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	counts := &unknownCounts{}
	l, err := podlab.New(ctx, podlab.Config{UnknownPods: counts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	newPodPolicies(l)
	srv := podlab.PodSpec{Namespace: "x", Name: "srv", Node: 0, IP: podlab.PodIP(0, 0), Labels: map[string]string{"app": "srv"},
		TCPPorts: []uint16{80}, UDPPorts: []uint16{53}}
	if err := l.StartPod(srv); err != nil {
		t.Fatal(err)
	}
	l.Know(srv)
	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		pod     podlab.PodSpec
		allowed bool
		proto   netlab.Proto
		res     netlab.ProbeResult
	}
	results := make([]outcome, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		p := podlab.PodSpec{Namespace: "new", Name: fmt.Sprintf("p%03d", i), Node: i % 2, IP: podlab.PodIP(i%2, 1+i/2), Labels: map[string]string{}}
		allowed := (i/2)%2 == 0
		if allowed {
			p.Labels["role"] = "client"
		}
		proto, port := netlab.TCP, uint16(80)
		if (i/4)%2 == 1 {
			proto, port = netlab.UDP, 53
		}
		if err := l.StartPod(p); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res := l.Net.ProbeOne(ctx, netlab.ProbeReq{From: podlab.PodEndpoint(p), To: srv.IP, Port: port, Proto: proto, Timeout: 8 * time.Second})
			results[i] = outcome{p, allowed, proto, res}
		}(i)
		time.Sleep(informerDelay)
		l.Know(p)
		if err := l.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()

	denied := map[netip.Addr]string{}
	var delays []time.Duration
	for _, o := range results {
		if o.res.Err != nil {
			t.Fatalf("%s: probe: %v", o.pod.Name, o.res.Err)
		}
		switch {
		case o.allowed && !o.res.Connected:
			t.Errorf("%s (%s, allowed): not connected (%s after %v)", o.pod.Name, o.proto, o.res.Reason, o.res.Duration)
		case !o.allowed && o.res.Connected:
			t.Errorf("%s (%s, denied): connected", o.pod.Name, o.proto)
		case o.allowed:
			delays = append(delays, o.res.Duration)
		default:
			denied[o.pod.IP] = o.pod.Name
		}
	}
	// A packet admitted through either node's forward hook leaves a
	// confirmed conntrack entry; a dropped first packet leaves none.
	for _, node := range podlab.Nodes {
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
	held := counts.get(queue.UnknownPodProgrammed)
	if held == 0 {
		t.Fatal("no connection was held for an unknown pod: the test did not exercise the unknown-pod path")
	}
	if to := counts.get(queue.UnknownPodTimeoutDropped) + counts.get(queue.UnknownPodTimeoutAllowed); to != 0 {
		t.Errorf("%d connections reached the wait's bound", to)
	}

	// Programmed pods never reach the queue again.
	before := map[string]uint64{}
	for _, node := range podlab.Nodes {
		before[node] = l.QueueReceived(node)
	}
	var again []netlab.ProbeReq
	for _, o := range results[:min(n, 40)] {
		port := uint16(80)
		if o.proto == netlab.UDP {
			port = 53
		}
		again = append(again, netlab.ProbeReq{From: podlab.PodEndpoint(o.pod), To: srv.IP, Port: port, Proto: o.proto, Timeout: 2 * time.Second})
	}
	for i, r := range l.Net.ProbeMany(ctx, again, 8) {
		if r.Connected != results[i].allowed {
			t.Errorf("%s again: connected=%v, want %v", results[i].pod.Name, r.Connected, results[i].allowed)
		}
	}
	for _, node := range podlab.Nodes {
		if got := l.QueueReceived(node); got != before[node] {
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
