package kernel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

func ingressFrom(name string, peer *metav1.LabelSelector) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *lab.MatchLabels("app", "srv"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: peer}}}}}}
}

// TestRevocation runs long-lived TCP and UDP flows from four clients to
// x/srv and changes what admits them three times: a policy edit, a label
// change, a policy delete that re-opens nothing. After each, the flows the
// change denies must stop (their conntrack entries are deleted; the next
// packet is new and dropped) and the others must go on without one lost
// datagram. The pods are dual-stack and every client runs its flows over
// IPv4 and IPv6: both families' entries are revoked.
func TestRevocation(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	counts := &revokedCounts{}
	l, err := lab.New(ctx, nil, lab.Config{Revoke: true, Revoked: counts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	l.Namespace("x", nil)
	l.Namespace("y", nil)
	srv := lab.PodSpec{Namespace: "x", Name: "srv", Node: 0, IP: lab.PodIP(0, 0), IPv6: lab.PodIPv6(0, 0), Labels: map[string]string{"app": "srv"}}
	client := func(name string, node, n int, labels ...string) lab.PodSpec {
		return lab.PodSpec{Namespace: "y", Name: name, Node: node, IP: lab.PodIP(node, n), IPv6: lab.PodIPv6(node, n), Labels: lab.MatchLabels(labels...).MatchLabels}
	}
	c1 := client("c1", 1, 1, "role", "client", "tier", "gold") // denied by the label change
	c2 := client("c2", 0, 2, "role", "client")                 // denied by the policy edit
	c3 := client("c3", 1, 3, "role", "client", "tier", "gold", "name", "c3")
	c4 := client("c4", 0, 4, "role", "client", "tier", "gold") // denied by the delete
	for _, p := range []lab.PodSpec{srv, c1, c2, c3, c4} {
		if err := l.StartPod(p); err != nil {
			t.Fatal(err)
		}
		l.Know(p)
	}
	l.SetPolicy(ingressFrom("allow", lab.MatchLabels("role", "client")))
	l.SetPolicy(ingressFrom("allow-c3", lab.MatchLabels("name", "c3")))
	// x/srv sends nothing new: a revoked flow cannot come back as a
	// connection from the server.
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "srv-no-egress"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *lab.MatchLabels("app", "srv"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	// One server per family; a flow's log is found by its client address.
	servers := map[bool]*lab.FlowServer{} // by IPv4
	for _, ip := range srv.IPs() {
		s, err := lab.StartFlowServer(l.Net(), srv.Endpoint(), ip)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		servers[ip.Is4()] = s
	}
	flowLog := func(proto string, client netip.Addr) *lab.FlowLog { return servers[client.Is4()].Log(proto, client) }
	flowCtx, stopFlows := context.WithCancel(ctx)
	defer stopFlows()
	for _, c := range []lab.PodSpec{c1, c2, c3, c4} {
		for _, ip := range srv.IPs() {
			if err := lab.StartFlows(flowCtx, l.Net(), c.Endpoint(), ip); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(500 * time.Millisecond)

	var stops []time.Duration
	alive := map[string]lab.PodSpec{"c1": c1, "c2": c2, "c3": c3, "c4": c4}
	for _, step := range []struct {
		name   string
		change func()
		denied string
	}{
		{"policy edit", func() { l.SetPolicy(ingressFrom("allow", lab.MatchLabels("role", "client", "tier", "gold"))) }, "c2"},
		{"label change", func() { c1.Labels = map[string]string{"role": "client", "tier": "silver"}; l.Know(c1) }, "c1"},
		{"policy delete", func() { l.DeletePolicy("x", "allow") }, "c4"},
	} {
		before := map[netip.Addr]int{}
		for _, c := range alive {
			for _, ip := range c.IPs() {
				_, before[ip], _ = flowLog("udp", ip).Snapshot()
			}
		}
		step.change()
		changed := time.Now()
		if err := l.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		for name, c := range alive {
			for _, ip := range c.IPs() {
				for _, proto := range []string{"tcp", "udp"} {
					last, n, lost := flowLog(proto, ip).Snapshot()
					if name == step.denied {
						if last.After(changed.Add(time.Second)) {
							t.Errorf("%s: %s %s from %s still flowing %v after the change", step.name, name, proto, ip, last.Sub(changed))
						}
						stops = append(stops, max(last.Sub(changed), 0))
						continue
					}
					if last.Before(changed.Add(time.Second)) {
						t.Errorf("%s: allowed %s %s from %s stopped (last record %v after the change)", step.name, name, proto, ip, last.Sub(changed))
					}
					if proto == "udp" && lost != 0 {
						t.Errorf("%s: allowed %s from %s lost %d datagrams", step.name, name, ip, lost)
					}
					if proto == "udp" && n <= before[ip] {
						t.Errorf("%s: allowed %s from %s received nothing since the change", step.name, name, ip)
					}
				}
			}
		}
		delete(alive, step.denied)
	}
	if got := counts.total(); got < 12 {
		t.Errorf("%d revoked flows counted, want at least 12 (3 clients, TCP and UDP, IPv4 and IPv6)", got)
	}
	sort.Slice(stops, func(i, j int) bool { return stops[i] < stops[j] })
	t.Logf("denied flows stopped after the change (publish + revocation + in-flight records): p50 %v, p99 %v, max %v; revoked per policy: %v",
		pct(stops, 50), pct(stops, 99), slices.Max(stops), counts.byPolicy())
}

type revokedCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (r *revokedCounts) ObserveRevoked(policy string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]int{}
	}
	r.m[policy]++
}

func (r *revokedCounts) ObservePass(_ time.Duration, _ int, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		panic(fmt.Sprintf("revocation pass failed: %v", err))
	}
}

func (r *revokedCounts) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.m {
		n += v
	}
	return n
}

func (r *revokedCounts) byPolicy() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.m {
		out[k] = v
	}
	return out
}
