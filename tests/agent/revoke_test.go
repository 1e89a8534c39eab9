package agent_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// webFlows is the revocation tests' cluster: x/web (node-1) serving a
// FlowServer per family, and long-lived TCP and UDP flows and pings of
// both families to it from y/a (node-1) and y/b (node-2, keep=yes), all
// dual-stack, running until the test ends.
type webFlows struct {
	c       *cluster.Cluster
	servers map[bool]*lab.FlowServer   // by IPv4
	pings   map[netip.Addr]*lab.Pinger // by client address
}

// log is the record of the flow from client over proto; a flow's log is
// found by its client address.
func (w *webFlows) log(proto string, client netip.Addr) *lab.FlowLog {
	return w.servers[client.Is4()].Log(proto, client)
}

func startWebFlows(t *testing.T, ctx context.Context) *webFlows {
	t.Helper()
	c := cluster.Start(t, cluster.Config{})
	for _, ns := range []string{"x", "y"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "web", Labels: map[string]string{"app": "web"}, Node: "node-1", IPs: addrs("10.244.1.10", "fd00:10:244:1::10")},
		cluster.Pod{Namespace: "y", Name: "a", Labels: map[string]string{"app": "client"}, Node: "node-1", IPs: addrs("10.244.1.11", "fd00:10:244:1::11")},
		cluster.Pod{Namespace: "y", Name: "b", Labels: map[string]string{"app": "client", "keep": "yes"}, Node: "node-2", IPs: addrs("10.244.2.10", "fd00:10:244:2::10")},
	)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	web, err := c.PodEndpoint("x/web")
	if err != nil {
		t.Fatal(err)
	}
	w := &webFlows{c: c, servers: map[bool]*lab.FlowServer{}, pings: map[netip.Addr]*lab.Pinger{}}
	for _, ip := range c.PodIPs("x/web") {
		srv, err := lab.StartFlowServer(c.Lab, web, ip)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		w.servers[ip.Is4()] = srv
	}
	flowCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop) // before the servers close
	for _, k := range []string{"y/a", "y/b"} {
		ep, err := c.PodEndpoint(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range c.PodIPs("x/web") {
			if err := lab.StartFlows(flowCtx, c.Lab, ep, ip); err != nil {
				t.Fatal(err)
			}
		}
		for i, src := range c.PodIPs(k) {
			dst := c.PodIPs("x/web")[i] // the same family
			p, err := lab.StartPinger(flowCtx, c.Lab, ep, src, dst, uint16(0x7700+len(w.pings)), 200*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			w.pings[src] = p
		}
	}
	time.Sleep(time.Second)
	for src, p := range w.pings {
		if n, _ := p.After(time.Time{}); n == 0 {
			t.Fatalf("the ping from %s to %s is not answered before any policy", src, p.Dst)
		}
	}
	return w
}

// webKeepOnly is x/web's policy of the revocation tests: ingress only
// from keep=yes pods (y/b); its own egress closed, so a cut flow cannot
// come back as a connection from the server.
func webKeepOnly() *networkingv1.NetworkPolicy {
	return makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector(), PodSelector: selector("keep", "yes")}}}}
	})
}

// TestAgentRevokesDeniedFlows: the real agents, a real API server, and
// long-lived TCP and UDP flows and pings from y/a (node-1) and y/b
// (node-2) to x/web (node-1), all dual-stack, over IPv4 and IPv6. A policy
// created through the API that admits only y/b must cut y/a's established
// flows and pings of both families (the agent deletes their conntrack
// entries) and leave y/b's untouched, without a lost datagram.
func TestAgentRevokesDeniedFlows(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t, 3*time.Minute)
	w := startWebFlows(t, ctx)
	c := w.c
	bBefore := map[netip.Addr]int{}
	for _, ip := range c.PodIPs("y/b") {
		_, bBefore[ip], _ = w.log("udp", ip).Snapshot()
	}

	if _, err := c.ApplyPolicy(ctx, webKeepOnly()); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for i, aIP := range c.PodIPs("y/a") {
		bIP := c.PodIPs("y/b")[i] // the same family
		for _, proto := range []string{"tcp", "udp"} {
			last, _, _ := w.log(proto, aIP).Snapshot()
			if last.After(applied.Add(1500 * time.Millisecond)) {
				t.Errorf("y/a %s from %s still flowing %v after the policy was created", proto, aIP, last.Sub(applied))
			} else {
				t.Logf("y/a %s from %s: last record %v after the API call", proto, aIP, max(last.Sub(applied), 0))
			}
			bLast, bN, bLost := w.log(proto, bIP).Snapshot()
			if bLast.Before(applied.Add(time.Second)) {
				t.Errorf("y/b %s from %s stopped: last record %v after the change", proto, bIP, bLast.Sub(applied))
			}
			if proto == "udp" && (bLost != 0 || bN <= bBefore[bIP]) {
				t.Errorf("y/b udp from %s: %d lost, %d records (%d before the change)", bIP, bLost, bN, bBefore[bIP])
			}
		}
		// The pings: the policy's rule names no ports, so y/b's are
		// still admitted; y/a's are cut like its TCP and UDP flows.
		if n, last := w.pings[aIP].After(applied.Add(1500 * time.Millisecond)); n > 0 {
			t.Errorf("y/a's ping from %s still answered %v after the policy was created", aIP, last.Sub(applied))
		}
		if n, _ := w.pings[bIP].After(applied.Add(time.Second)); n == 0 {
			t.Errorf("y/b's ping from %s stopped after the change", bIP)
		}
	}
}
