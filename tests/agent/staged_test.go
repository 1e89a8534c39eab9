package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestAgentStagedPolicies: through a real API server and the real agents,
// a staged NetworkPolicy (its own nftpolicy.io/staged annotation, or its
// namespace's) blocks nothing, and the agents log what it would deny;
// removing the annotation enforces it, and adding it back stages it again.
func TestAgentStagedPolicies(t *testing.T) {
	requireRoot(t)
	staged := map[string]string{compile.StagedAnnotation: "true"}
	c := cluster.Start(t, cluster.Config{})
	ctx := testContext(t, 3*time.Minute)
	// y is staged from the start: its policy is never enforced until the
	// annotation goes.
	if err := c.ApplyScenario(ctx, &scenario.Scenario{Namespaces: []scenario.Namespace{{Name: "x"}, {Name: "y", Annotations: staged}}}); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "web", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		cluster.Pod{Namespace: "y", Name: "a", Labels: map[string]string{"app": "client"}, Node: "node-2"},
	)
	denyIngress := func(ns string) *networkingv1.NetworkPolicy {
		return makePolicy(ns, "deny-ingress", func(np *networkingv1.NetworkPolicy) {
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		})
	}
	xPolicy := denyIngress("x")
	xPolicy.Annotations = staged
	for _, np := range []*networkingv1.NetworkPolicy{xPolicy, denyIngress("y")} {
		if _, err := c.ApplyPolicy(ctx, np); err != nil {
			t.Fatal(err)
		}
	}
	toWeb, toA := [2]string{"y/a", "x/web"}, [2]string{"x/web", "y/a"}
	m := verify(t, ctx, c, "both staged")
	expect(t, m, "both staged", map[[2]string]bool{toWeb: true, toA: true})
	// What they would do, in the agents' logs (the staged log, on by
	// default): each node reports its own pod's ingress.
	stagedLine(t, ctx, c, "node-1", `src="y/a"`, `dst="x/web"`, `would="deny"`, `policy="x/deny-ingress"`)
	stagedLine(t, ctx, c, "node-2", `src="x/web"`, `dst="y/a"`, `would="deny"`, `policy="y/deny-ingress"`)

	setStaged := func(on bool) {
		t.Helper()
		if err := c.UpdatePolicy(ctx, "x", "deny-ingress", func(np *networkingv1.NetworkPolicy) {
			if on {
				np.Annotations = staged
			} else {
				delete(np.Annotations, compile.StagedAnnotation)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	setStaged(false)
	m = verify(t, ctx, c, "x/deny-ingress unstaged")
	expect(t, m, "x/deny-ingress unstaged", map[[2]string]bool{toWeb: false, toA: true})

	if err := c.AnnotateNamespace(ctx, "y", nil, compile.StagedAnnotation); err != nil {
		t.Fatal(err)
	}
	m = verify(t, ctx, c, "namespace y unstaged")
	expect(t, m, "namespace y unstaged", map[[2]string]bool{toWeb: false, toA: false})

	setStaged(true)
	m = verify(t, ctx, c, "x/deny-ingress staged again")
	expect(t, m, "x/deny-ingress staged again", map[[2]string]bool{toWeb: true, toA: false})
}

// stagedLine waits for a "Staged verdict" line with every part in node's
// agent log.
func stagedLine(t *testing.T, ctx context.Context, c *cluster.Cluster, node string, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, l := range strings.Split(c.Agent(node).LogTail(200), "\n") {
			if strings.Contains(l, `"Staged verdict"`) && allIn(l, parts) {
				t.Logf("%s: %s", node, l)
				return
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: no staged log line with %v; log tail:\n%s", node, parts, c.Agent(node).LogTail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func allIn(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
