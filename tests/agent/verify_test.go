package agent_test

import (
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestAgentVerifiesKernelVerdicts runs the real agents with --verify-rate 1
// (every verdict sampled) through pod and policy changes of the API: the
// agents decide every sampled kernel verdict again, allowed and denied,
// and find no disagreement.
func TestAgentVerifiesKernelVerdicts(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{AgentArgs: []string{"--verify-rate=1", "--verify-kernel-rate=1000"}})
	ctx := testContext(t, 3*time.Minute)
	createWebDBClients(t, ctx, c)
	verify(t, ctx, c, "no policies")
	if _, err := c.ApplyPolicy(ctx, makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector("ns", "y"), PodSelector: selector("app", "client")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPolicy(ctx, makePolicy("y", "client-egress", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "client")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector("ns", "x")}}}}
	})); err != nil {
		t.Fatal(err)
	}
	verify(t, ctx, c, "policies")
	if err := c.LabelPod(ctx, "y", "b", map[string]string{"app": "other"}); err != nil {
		t.Fatal(err)
	}
	verify(t, ctx, c, "y/b relabelled")
	time.Sleep(time.Second) // the last samples read and settled

	sum := map[string]float64{}
	for _, a := range c.Agents() {
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range m {
			if strings.HasPrefix(k, "nftpolicy_verdicts_verified_total") || strings.HasPrefix(k, "nftpolicy_verdict_disagreements_total") {
				sum[k] += v
			}
		}
	}
	t.Logf("both agents: %v", sum)
	if sum[`nftpolicy_verdicts_verified_total{kernel="allow"}`] == 0 || sum[`nftpolicy_verdicts_verified_total{kernel="deny"}`] == 0 {
		t.Error("allowed and denied verdicts must both have been verified")
	}
	for k, v := range sum {
		if strings.HasPrefix(k, "nftpolicy_verdict_disagreements_total") && v != 0 {
			t.Errorf("%s = %v", k, v)
		}
	}
}
