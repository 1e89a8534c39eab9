package agent_test

import (
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestAgentFollowsAPI runs the real agents with install.yaml's
// ServiceAccount and RBAC and changes the cluster through the API, one kind
// of watch event at a time. After each change it waits until both agents
// have committed the new state and checks every pod pair on real packets
// against the evaluator, plus a few verdicts written by hand.
//
// Pods x/a (app=web) and y/a (app=client) run on node-1, x/b (app=db) and
// y/b (app=client) on node-2; all serve 80/TCP.
func TestAgentFollowsAPI(t *testing.T) {
	requireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) {
			testAgentFollowsAPI(t, mode)
		})
	}
}

func testAgentFollowsAPI(t *testing.T, mode compile.Mode) {
	c := cluster.Start(t, cluster.Config{Mode: mode})
	ctx := testContext(t, 4*time.Minute)
	// Pods are created while the agents run: they arrive as watch events.
	createWebDBClients(t, ctx, c)
	type pair = [2]string
	m := verify(t, ctx, c, "no policies")
	for _, cell := range m.Cells() {
		if !cell.Kernel {
			t.Errorf("no policies: %s -> %s denied", cell.From, cell.To)
		}
	}

	// 1. Policies: x/a admits role=friend pods of any namespace on 80/TCP;
	// clients in y may only talk to namespace x.
	if _, err := c.ApplyPolicy(ctx, makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector(), PodSelector: selector("role", "friend")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPolicy(ctx, makePolicy("y", "client-egress", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "client")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector("ns", "x")}},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "policies created")
	expect(t, m, "policies created", map[pair]bool{
		{"y/b", "x/a"}: false, {"x/b", "x/a"}: false, {"y/a", "x/b"}: true,
		{"y/a", "y/b"}: false, {"x/a", "y/a"}: true,
	})

	// 2. A pod label: y/b becomes a friend.
	if err := c.LabelPod(ctx, "y", "b", map[string]string{"role": "friend"}); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "pod y/b labelled role=friend")
	expect(t, m, "pod y/b labelled role=friend", map[pair]bool{{"y/b", "x/a"}: true, {"y/a", "x/a"}: false})

	// 3. A policy edit: x/a now admits namespaces labelled team=blue
	// (none yet).
	if err := c.UpdatePolicy(ctx, "x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: selector("team", "blue")}}
	}); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "policy x/web edited")
	expect(t, m, "policy x/web edited", map[pair]bool{{"y/b", "x/a"}: false, {"y/a", "x/a"}: false})

	// 4. A namespace label: y joins team blue.
	if err := c.LabelNamespace(ctx, "y", map[string]string{"team": "blue"}); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "namespace y labelled team=blue")
	expect(t, m, "namespace y labelled team=blue", map[pair]bool{{"y/b", "x/a"}: true, {"y/a", "x/a"}: true, {"x/b", "x/a"}: false})

	// 5. A new pod selected by x/web, on the other node.
	mustCreatePods(t, ctx, c, cluster.Pod{Namespace: "x", Name: "c", Labels: map[string]string{"app": "web"}, Node: "node-2"})
	m = verify(t, ctx, c, "pod x/c created")
	expect(t, m, "pod x/c created", map[pair]bool{{"y/a", "x/c"}: true, {"x/a", "x/c"}: false, {"x/c", "x/b"}: true})

	// 6. A policy deletion.
	if err := c.DeletePolicy(ctx, "x", "web"); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "policy x/web deleted")
	expect(t, m, "policy x/web deleted", map[pair]bool{{"x/b", "x/a"}: true, {"x/a", "x/c"}: true, {"y/a", "y/b"}: false})

	// 7. A pod deletion, then the last policy.
	if err := c.DeletePod(ctx, "x", "c"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePolicy(ctx, "y", "client-egress"); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "everything deleted")
	for _, cell := range m.Cells() {
		if !cell.Kernel {
			t.Errorf("everything deleted: %s -> %s denied", cell.From, cell.To)
		}
	}

	// The agents programmed what the API holds, counted the same way; in
	// queue mode userspace gave verdicts both ways.
	verdicts := map[string]float64{}
	for _, a := range c.Agents() {
		metrics, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := metrics["nftpolicy_programmed_policies"]; got != 0 {
			t.Errorf("agent of %s: nftpolicy_programmed_policies = %v, want 0", a.Node, got)
		}
		if got := metrics["nftpolicy_sync_failures_total"]; got != 0 {
			t.Errorf("agent of %s: nftpolicy_sync_failures_total = %v, want 0", a.Node, got)
		}
		for _, v := range []string{"allowed", "denied"} {
			verdicts[v] += metrics[`nftpolicy_queue_verdicts_total{family="ipv4",protocol="tcp",verdict="`+v+`"}`]
		}
	}
	t.Logf("queue verdicts given by the agents: %v", verdicts)
	if mode == compile.ModeQueue && (verdicts["allowed"] == 0 || verdicts["denied"] == 0) {
		t.Errorf("queue mode: the agents' evaluators gave no allowed or no denied verdict (%v): connections were not queued", verdicts)
	}
}
