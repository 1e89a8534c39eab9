package agent_test

import (
	"context"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// TestAgentRevokesDeniedFlows: the real agents, a real API server, and
// long-lived TCP and UDP flows from y/a (node-1) and y/b (node-2) to x/web
// (node-1). A policy created through the API that admits only y/b must cut
// y/a's established flows (the agent deletes their conntrack entries) and
// leave y/b's untouched, without a lost datagram.
func TestAgentRevokesDeniedFlows(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{})
	ctx := testContext(t, 3*time.Minute)
	for _, ns := range []string{"x", "y"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "web", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		cluster.Pod{Namespace: "y", Name: "a", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		cluster.Pod{Namespace: "y", Name: "b", Labels: map[string]string{"app": "client", "keep": "yes"}, Node: "node-2"},
	)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	web, err := c.PodEndpoint("x/web")
	if err != nil {
		t.Fatal(err)
	}
	webIP := c.PodIPs("x/web")[0]
	srv, err := lab.StartFlowServer(c.Lab, web, webIP)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	flowCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, k := range []string{"y/a", "y/b"} {
		ep, err := c.PodEndpoint(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := lab.StartFlows(flowCtx, c.Lab, ep, webIP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	aIP, bIP := c.PodIPs("y/a")[0], c.PodIPs("y/b")[0]
	_, bBefore, _ := srv.Log("udp", bIP).Snapshot()

	// x/web: ingress only from keep=yes pods; its own egress closed, so a
	// cut flow cannot come back as a connection from the server.
	if _, err := c.ApplyPolicy(ctx, makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector(), PodSelector: selector("keep", "yes")}}}}
	})); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, proto := range []string{"tcp", "udp"} {
		last, _, _ := srv.Log(proto, aIP).Snapshot()
		if last.After(applied.Add(1500 * time.Millisecond)) {
			t.Errorf("y/a %s still flowing %v after the policy was created", proto, last.Sub(applied))
		} else {
			t.Logf("y/a %s: last record %v after the API call", proto, max(last.Sub(applied), 0))
		}
		bLast, bN, bLost := srv.Log(proto, bIP).Snapshot()
		if bLast.Before(applied.Add(time.Second)) {
			t.Errorf("y/b %s stopped: last record %v after the change", proto, bLast.Sub(applied))
		}
		if proto == "udp" && (bLost != 0 || bN <= bBefore) {
			t.Errorf("y/b udp: %d lost, %d records (%d before the change)", bLost, bN, bBefore)
		}
	}
}
