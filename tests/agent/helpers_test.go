package agent_test

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}

// requireRoot stops tests that create network namespaces and run agents
// when not root (skip, or fail with NFTPOLICY_REQUIRE_TOOLS set). Missing
// tools are handled the same way by kubeenv.Start.
func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, "agent tests", testenv.Root("create network namespaces and run nftpolicy agents that program nftables and NFQUEUE in them"))
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// makePolicy builds a NetworkPolicy; tweak fills its spec.
func makePolicy(namespace, name string, tweak func(np *networkingv1.NetworkPolicy)) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	tweak(np)
	return np
}

func selector(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func tcpPort(p int32) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolTCP
	port := intstr.FromInt32(p)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
}

// addrs parses addresses (a pod's IPs, IPv4 first for a dual-stack pod).
func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// mustCreatePods creates pods, failing the test on error.
func mustCreatePods(t *testing.T, ctx context.Context, c *cluster.Cluster, pods ...cluster.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := c.CreatePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// createWebDBClients creates namespaces x and y (labelled ns=<name>) and
// their pods: x/a (app=web) and y/a (app=client) on node-1, x/b (app=db)
// and y/b (app=client) on node-2.
func createWebDBClients(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	for ns, labels := range map[string]map[string]string{"x": {"ns": "x"}, "y": {"ns": "y"}} {
		if err := c.EnsureNamespace(ctx, ns, labels); err != nil {
			t.Fatal(err)
		}
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		cluster.Pod{Namespace: "x", Name: "b", Labels: map[string]string{"app": "db"}, Node: "node-2"},
		cluster.Pod{Namespace: "y", Name: "a", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		cluster.Pod{Namespace: "y", Name: "b", Labels: map[string]string{"app": "client"}, Node: "node-2"},
	)
}

// verify waits until the agents are programmed, probes every pair on 80/TCP
// and fails the test when real packets and the evaluator disagree.
func verify(t *testing.T, ctx context.Context, c *cluster.Cluster, step string) *cluster.Matrix {
	t.Helper()
	start := time.Now()
	waited, err := c.WaitProgrammed(ctx)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	m, err := c.ProbeAll(ctx, cluster.ProbeOptions{})
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	t.Logf("%s: programmed after %v, %d connections probed in %v:\n%s", step, waited.Round(time.Millisecond),
		len(m.Cells()), time.Since(start).Round(time.Millisecond), m.Grid())
	if bad := m.Mismatches(); len(bad) > 0 {
		_, err := c.Verify(ctx, cluster.ProbeOptions{}) // re-probes and adds the nodes' tables
		t.Fatalf("%s: real packets disagree with the evaluator:\n%s\n(second probe: %v)", step, m.Report(), err)
	}
	return m
}

// expect checks hand-written verdicts, so that a harness mistake that fools
// both the kernel and the evaluator (say, a label that was never set) is
// still caught.
func expect(t *testing.T, m *cluster.Matrix, step string, want map[[2]string]bool) {
	t.Helper()
	for pair, allowed := range want {
		cell := m.Cell(pair[0], pair[1])
		if cell == nil {
			t.Errorf("%s: no cell %s -> %s", step, pair[0], pair[1])
			continue
		}
		if cell.Kernel != allowed || cell.Eval != allowed {
			t.Errorf("%s: %s -> %s: kernel %v, evaluator %v (%s); want %v", step, pair[0], pair[1], cell.Kernel, cell.Eval, cell.Reason, allowed)
		}
	}
}
