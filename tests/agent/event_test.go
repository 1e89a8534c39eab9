package agent_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// oddPeers are policy peers the compiler reports problems for, or that an
// API server might let through where a stricter reading would not. Every
// one is submitted; those the API server rejects cannot reach an agent.
var oddPeers = []struct {
	name string
	peer networkingv1.NetworkPolicyPeer
}{
	{"ipblock-ipv4-mapped-ipv6", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::ffff:10.0.0.0/104"}}},
	{"ipblock-except-ipv4-mapped", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"::ffff:10.0.0.0/104"}}}},
	{"ipblock-leading-zeros", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "010.000.000.000/8"}}},
	{"ipblock-zone", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fe80::%eth0/64"}}},
	{"ipblock-except-equal", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.0.0.0/8"}}}},
	{"ipblock-except-other-family", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"fd00::/64"}}}},
	{"ipblock-and-selector", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: selector()}},
	{"empty-peer", networkingv1.NetworkPolicyPeer{}},
	{"selector-bad-operator", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Matches", Values: []string{"a"}}}}}},
	{"selector-in-without-values", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}}}},
}

// TestInvalidPolicyEvent looks for a NetworkPolicy that the API server
// accepts but nftpolicy finds problems in, and checks the agents' path for
// it: a Warning Event "InvalidNetworkPolicy" on the policy from each node's
// agent, the nftpolicy_invalid_policies gauge, and enforcement that still
// isolates the selected pod (the invalid part allows nothing). The API
// server validates NetworkPolicies with the same rules the compiler checks,
// so when it rejects every candidate the path cannot be reached through a
// validating API server and the test is skipped, saying why.
func TestInvalidPolicyEvent(t *testing.T) {
	requireRoot(t)
	// The agents start only once a candidate got through.
	c := cluster.Start(t, cluster.Config{NoAgents: true})
	ctx := testContext(t, 3*time.Minute)
	if err := c.EnsureNamespace(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		cluster.Pod{Namespace: "x", Name: "b", Node: "node-2"},
	)
	policies := c.Client.NetworkingV1().NetworkPolicies("x")
	var chosen *networkingv1.NetworkPolicy
	var problems []compile.Problem
	var log []string
	for _, cand := range oddPeers {
		np := makePolicy("x", cand.name, func(np *networkingv1.NetworkPolicy) {
			np.Spec.PodSelector = *selector("app", "web")
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{cand.peer}}}
		})
		stored, err := policies.Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			log = append(log, fmt.Sprintf("%s: rejected by the API server: %v", cand.name, err))
			continue
		}
		if ps := compile.ValidatePolicy(stored); len(ps) > 0 && chosen == nil {
			chosen, problems = stored, ps
			log = append(log, fmt.Sprintf("%s: accepted by the API server; nftpolicy reports %v", cand.name, ps))
			continue
		}
		log = append(log, fmt.Sprintf("%s: accepted by the API server, and nftpolicy finds no problem in it", cand.name))
		if err := policies.Delete(ctx, stored.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("candidates:\n  %s", strings.Join(log, "\n  "))
	if chosen == nil {
		t.Skipf("no NetworkPolicy that nftpolicy reports as invalid gets past the API server's validation (%d candidates, see the log): "+
			"the agent's InvalidNetworkPolicy Event only fires for objects that bypassed validation (e.g. written to etcd directly "+
			"or by an older API server with laxer rules), which a real, validating kube-apiserver does not allow", len(oddPeers))
	}

	for _, a := range c.Agents() {
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		if err := a.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Both agents report it.
	deadline := time.Now().Add(time.Minute)
	var events []corev1.Event
	for {
		list, err := c.Client.CoreV1().Events("x").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "NetworkPolicy", "involvedObject.name": chosen.Name, "reason": "InvalidNetworkPolicy",
		}.String()})
		if err != nil {
			t.Fatal(err)
		}
		events = list.Items
		hosts := map[string]bool{}
		for _, ev := range events {
			hosts[ev.Source.Host] = true
		}
		if hosts["node-1"] && hosts["node-2"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no InvalidNetworkPolicy Event from both agents for %s/%s within a minute; events: %+v", chosen.Namespace, chosen.Name, events)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, ev := range events {
		if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "nftpolicy" || !strings.Contains(ev.Message, problems[0].Field) {
			t.Errorf("event %s: type %q, source %+v, message %q; want a Warning from nftpolicy naming %s", ev.Name, ev.Type, ev.Source, ev.Message, problems[0].Field)
		}
		t.Logf("event from %s: %s %s: %s", ev.Source.Host, ev.Type, ev.Reason, ev.Message)
	}
	m := verify(t, ctx, c, "invalid policy")
	if cell := m.Cell("x/b", "x/a"); cell.Kernel {
		t.Errorf("x/b -> x/a connected: the invalid policy must still isolate x/a (%s)", cell.Reason)
	}
	for _, a := range c.Agents() {
		metrics, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := metrics["nftpolicy_invalid_policies"]; got != 1 {
			t.Errorf("agent of %s: nftpolicy_invalid_policies = %v, want 1", a.Node, got)
		}
	}
}
