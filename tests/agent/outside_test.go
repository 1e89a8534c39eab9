package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// repairWait bounds how long TestAgentRepairsOutsideChanges waits for a
// repair: generous (the agent repairs within milliseconds here), and far
// below --full-sync-period, so that only the table's watch passes it.
const repairWait = 10 * time.Second

// TestAgentRepairsOutsideChanges changes the table of node-1's agent from
// outside, as an administrator or another service would, while a policy
// denies r/bad -> r/server: `nft flush ruleset` (the table deleted), one
// element of the verdict map that sends the server's traffic to its policy
// deleted, a foreign accept rule inserted into one of the table's base
// chains, and a loop of `nft flush ruleset` (the repairs rate-limited, the
// table back after the last one). After each, the denied connection must
// be denied again within repairWait (the agents run with a
// --full-sync-period of an hour), the
// allowed one allowed, the table must be nftpolicy's alone, and the change
// counted by kind. Readiness is true once repaired.
func TestAgentRepairsOutsideChanges(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{Mode: compile.ModeHybrid, AgentArgs: []string{"--full-sync-period", "1h"}})
	ctx := testContext(t, 3*time.Minute)
	if err := c.EnsureNamespace(ctx, "r", nil); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "r", Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		cluster.Pod{Namespace: "r", Name: "good", Labels: map[string]string{"role": "good"}, Node: "node-2"},
		cluster.Pod{Namespace: "r", Name: "bad", Labels: map[string]string{"role": "bad"}, Node: "node-2"},
	)
	if _, err := c.ApplyPolicy(ctx, makePolicy("r", "server", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "server")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selector("role", "good")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	m := verify(t, ctx, c, "before")
	expect(t, m, "before", map[[2]string]bool{{"r/good", "r/server"}: true, {"r/bad", "r/server"}: false})
	server := c.PodIPs("r/server")[0]
	bad, err := c.PodEndpoint("r/bad")
	if err != nil {
		t.Fatal(err)
	}
	good, err := c.PodEndpoint("r/good")
	if err != nil {
		t.Fatal(err)
	}
	agent := c.Agent("node-1")
	nft := func(args ...string) {
		t.Helper()
		if out, err := c.Lab.NodeExec("node-1", append([]string{"nft"}, args...)...); err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	steps := []struct {
		name, kind string
		change     func()
	}{
		{"nft flush ruleset", "table", func() { nft("flush", "ruleset") }},
		{"a verdict map element deleted", "element", func() {
			nft("delete", "element", "inet", compile.TableName, "ingress-pods-v4", "{", server.String(), "}")
		}},
		{"a foreign rule inserted", "rule", func() {
			nft("insert", "rule", "inet", compile.TableName, "forward", "accept", "comment", `"foreign"`)
		}},
		{"a loop of 200 nft flush ruleset", "table", func() {
			if out, err := c.Lab.NodeExec("node-1", "sh", "-c", "for i in $(seq 200); do nft flush ruleset || exit 1; done"); err != nil {
				t.Fatalf("flush loop: %v: %s", err, out)
			}
		}},
	}
	for _, s := range steps {
		before, err := agent.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.change()
		start := time.Now()
		if err := waitDenied(ctx, c, bad, server); err != nil {
			t.Fatalf("%s: r/bad -> r/server not denied again within %v: %v\ntable:\n%s", s.name, repairWait, err, c.ListTable("node-1"))
		}
		t.Logf("%s: r/bad -> r/server denied again after %v", s.name, time.Since(start).Round(time.Millisecond))
		if ok, err := c.Lab.Probe(ctx, good, server, 80, netlab.TCP, 0); err != nil || !ok {
			t.Errorf("%s: r/good -> r/server: allowed %v (%v), want allowed", s.name, ok, err)
		}
		if table := c.ListTable("node-1"); strings.Contains(table, "foreign") {
			t.Errorf("%s: the foreign rule is still in the table:\n%s", s.name, table)
		}
		after, err := agent.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("nftpolicy_outside_changes_total{kind=%q}", s.kind)
		if after[name] <= before[name] {
			t.Errorf("%s: %s %v, was %v: not counted", s.name, name, after[name], before[name])
		}
		if err := agent.WaitReady(ctx); err != nil {
			t.Errorf("%s: not ready after the repair: %v", s.name, err)
		}
	}
	// The agent's own transactions are not outside changes: a policy edit
	// and a pod made after the repairs are not counted.
	before, err := agent.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c, cluster.Pod{Namespace: "r", Name: "server2", Labels: map[string]string{"app": "server"}, Node: "node-1"})
	verify(t, ctx, c, "own changes")
	after, err := agent.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range after {
		if strings.HasPrefix(name, "nftpolicy_outside_changes_total") && v != before[name] {
			t.Errorf("the agent's own changes counted as outside ones: %s %v, was %v", name, v, before[name])
		}
	}
}

// waitDenied probes from -> to:80 until the connection is denied, for at
// most repairWait.
func waitDenied(ctx context.Context, c *cluster.Cluster, from netlab.Endpoint, to netip.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, repairWait)
	defer cancel()
	for {
		ok, err := c.Lab.Probe(ctx, from, to, 80, netlab.TCP, 500*time.Millisecond)
		if err == nil && !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still admitted (last probe: %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
