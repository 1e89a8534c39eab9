package agent_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestReadinessAndGracefulShutdown checks /readyz around the first sync and
// what a SIGTERM leaves behind. The agent of node-1 starts while the API
// server is unreachable for it (its relay holds connections): /healthz is
// 200 (the loop is alive), /readyz 503 and nothing is written to the kernel,
// since the informers have not synced. Once the API is reachable the agent
// syncs and /readyz turns 200. A SIGTERM then ends the agent with status 0
// and leaves the table in the node's kernel, still enforcing.
func TestReadinessAndGracefulShutdown(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{NoAgents: true})
	ctx := testContext(t, 3*time.Minute)
	if err := c.EnsureNamespace(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		cluster.Pod{Namespace: "x", Name: "b", Node: "node-2"},
		cluster.Pod{Namespace: "x", Name: "c", Node: "node-1"},
	)
	if _, err := c.ApplyPolicy(ctx, makePolicy("x", "deny-web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	})); err != nil {
		t.Fatal(err)
	}
	n2 := c.Agent("node-2")
	if err := n2.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n2.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	a := c.Agent("node-1")
	a.HoldAPI()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait for the health server, not for a time: the first answer must
	// already be 503, as the API is unreachable.
	var code int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if code, err = a.Ready(ctx); err == nil {
			break
		}
		if !a.Running() || time.Now().After(deadline) {
			t.Fatalf("the health server of node-1 never answered: %v\n%s", err, a.LogTail(20))
		}
	}
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the first sync: %d, want 503", code)
	}
	// Still 503 a while later: it is the missing sync, not a race.
	time.Sleep(500 * time.Millisecond)
	if code, err := a.Ready(ctx); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the API unreachable: %d, %v; want 503", code, err)
	}
	if code, _, err := a.Get(ctx, a.HealthAddr, "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz before the first sync: %d, %v; want 200", code, err)
	}
	if has, err := c.HasTable("node-1"); err != nil || has {
		t.Errorf("node-1 has the nftpolicy table before the first sync (%v, %v): nothing may be written before the informers synced", has, err)
	}

	a.ReleaseAPI()
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("/readyz: 503 while the API was unreachable, 200 after the first sync")
	verify(t, ctx, c, "both agents running")

	// Graceful stop: exit status 0, table and enforcement stay.
	if err := a.Stop(10 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, a.LogTail(20))
	}
	if has, err := c.HasTable("node-1"); err != nil || !has {
		t.Fatalf("after SIGTERM, node-1 lacks the nftpolicy table (%v, %v)", has, err)
	}
	table := c.ListTable("node-1")
	if !strings.Contains(table, "x/deny-web") {
		t.Errorf("after SIGTERM, the table of node-1 lacks the chains of x/deny-web:\n%s", table)
	}
	if !strings.Contains(a.LogTail(10), "the nftables ruleset stays in place") {
		t.Errorf("the agent did not log its shutdown:\n%s", a.LogTail(10))
	}
	m := verify(t, ctx, c, "agent of node-1 stopped") // node-2 is waited for; node-1 is the kernel alone
	expect(t, m, "agent of node-1 stopped", map[[2]string]bool{{"x/b", "x/a"}: false, {"x/c", "x/a"}: false, {"x/a", "x/b"}: true})
	t.Logf("after SIGTERM: `nft list table inet %s` on node-1 still has %d lines", compile.TableName, strings.Count(table, "\n"))
}
