package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestNodeEnforcementFollowsPolicies: each agent keeps its node's
// NodeEnforcement (owned by the Node): once a NetworkPolicy is programmed,
// every node's NetworkPolicy watermark is at least its resourceVersion and
// its changes list it with a latency; its deletion is listed as a deleted
// change at a later resourceVersion, which the watermark reaches.
func TestNodeEnforcementFollowsPolicies(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t, 2*time.Minute)
	c := cluster.Start(t, cluster.Config{})
	dyn, err := dynamic.NewForConfig(c.Env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureNamespace(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c, cluster.Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}, Node: "node-1"})
	np, err := c.ApplyPolicy(ctx, makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)}}}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	ref := status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: "x", Name: "web"}
	for _, node := range c.Nodes() {
		ch := waitReported(t, ctx, dyn, node, func(ch status.Change) bool {
			return ch.PolicyRef == ref && !ch.Deleted && ch.ResourceVersion == np.ResourceVersion
		}, np.ResourceVersion)
		if ch.LatencyMicros <= 0 {
			t.Errorf("%s: the change %+v has no latency", node, ch)
		}
	}

	if err := c.DeletePolicy(ctx, "x", "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	for _, node := range c.Nodes() {
		waitReported(t, ctx, dyn, node, func(ch status.Change) bool {
			return ch.PolicyRef == ref && ch.Deleted && compareRV(t, ch.ResourceVersion, np.ResourceVersion) > 0
		}, np.ResourceVersion)
	}
}

// waitReported waits until the node's NodeEnforcement lists a change that
// match accepts with its NetworkPolicy watermark at least that change's and
// least's resourceVersion, checks that the Node owns it, and returns the
// change.
func waitReported(t *testing.T, ctx context.Context, dyn dynamic.Interface, node string, match func(status.Change) bool, least string) status.Change {
	t.Helper()
	var last string
	for {
		u, err := dyn.Resource(status.GVR).Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			ne, err := status.FromUnstructured(u)
			if err != nil {
				t.Fatal(err)
			}
			if owners := ne.OwnerReferences; len(owners) != 1 || owners[0].Kind != "Node" || owners[0].Name != node || owners[0].UID == "" {
				t.Errorf("%s: NodeEnforcement owners %+v, want its Node", node, owners)
			}
			wm := ne.Status.Programmed.NetworkPolicies
			for _, ch := range ne.Status.Changes {
				if match(ch) && compareRV(t, wm, ch.ResourceVersion) >= 0 && compareRV(t, wm, least) >= 0 {
					return ch
				}
			}
			last = fmt.Sprintf("watermarks %+v, changes %+v", ne.Status.Programmed, ne.Status.Changes)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the NodeEnforcement does not report the change: %s", node, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// compareRV compares resourceVersions; "" (no watermark yet) is lowest.
func compareRV(t *testing.T, a, b string) int {
	t.Helper()
	if a == "" {
		return -1
	}
	c, err := resourceversion.CompareResourceVersion(a, b)
	if err != nil {
		t.Fatalf("comparing resourceVersions %q and %q: %v", a, b, err)
	}
	return c
}
