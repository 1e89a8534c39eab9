package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// waitNS is the namespace of the wait-latency rounds.
const waitNS = "wait-bench"

// waitFirstReport bounds the wait for the agents' first NodeEnforcements
// (a failed write is retried after 1 s, 2 s, 4 s...).
const waitFirstReport = 40 * time.Second

// measureWaitLatency starts two real agents (tests/internal/cluster) and
// times, over WaitRounds, from a NetworkPolicy's Create call returning to
// status.Wait returning (every node enforces it), as `kubectl nftpolicy
// wait` does it: a Get, then lists and watches of the agents' pods and the
// NodeEnforcements. The policy is deleted after each round and that wait
// timed too. When the agents write no NodeEnforcement it measures nothing
// and says why in skip.
func measureWaitLatency(ctx context.Context, tb testing.TB, cfg StatusConfig, res *Result) (skip string, err error) {
	nodes := []string{"node-1", "node-2"}
	c := cluster.Start(tb, cluster.Config{Nodes: nodes, Verbosity: 1, Logf: cfg.Logf})
	if err := applyStatusInstall(tb, c.Env); err != nil {
		return "", err
	}
	if err := ensureAgentPods(ctx, c.Client, nodes); err != nil {
		return "", err
	}
	clients, err := statusClients(c.Env.RESTConfig())
	if err != nil {
		return "", err
	}
	if skip, err := awaitFirstReports(ctx, clients, len(nodes)); skip != "" || err != nil {
		return skip, err
	}
	if err := c.EnsureNamespace(ctx, waitNS, nil); err != nil {
		return "", err
	}
	for _, n := range nodes {
		p := cluster.Pod{Namespace: waitNS, Name: "server-" + n, Node: n, Labels: map[string]string{"app": "server"}}
		if _, err := c.CreatePod(ctx, p); err != nil {
			return "", err
		}
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return "", err
	}
	var created, deleted, reported []time.Duration
	pols := c.Client.NetworkingV1().NetworkPolicies(waitNS)
	for i := 0; i < cfg.WaitRounds; i++ {
		np, err := pols.Create(ctx, waitPolicy(i), metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		t0 := time.Now()
		row, err := waitRound(ctx, clients, np, false)
		if err != nil {
			return "", err
		}
		created, reported = append(created, time.Since(t0)), append(reported, row.Latency)
		if err := pols.Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
			return "", err
		}
		t0 = time.Now()
		if _, err := waitRound(ctx, clients, np, true); err != nil {
			return "", err
		}
		deleted = append(deleted, time.Since(t0))
	}
	res.Set("wait_latency_rounds", cfg.WaitRounds)
	res.Set("wait_latency_ms_p50", millis(Percentile(created, 50)))
	res.Set("wait_latency_ms_p90", millis(Percentile(created, 90)))
	res.Set("wait_latency_ms_max", millis(Percentile(created, 100)))
	res.Set("wait_delete_latency_ms_p50", millis(Percentile(deleted, 50)))
	res.Set("wait_reported_latency_ms_p50", millis(Percentile(reported, 50)))
	cfg.Logf("status: create -> status.Wait with 2 agents: p50 %v, p90 %v (%d rounds); deletion p50 %v; the agents' reported change-to-commit p50 %v",
		Percentile(created, 50).Round(100*time.Microsecond), Percentile(created, 90).Round(100*time.Microsecond), cfg.WaitRounds,
		Percentile(deleted, 50).Round(100*time.Microsecond), Percentile(reported, 50).Round(10*time.Microsecond))
	return "", nil
}

// awaitFirstReports waits until every agent pod's node has a
// NodeEnforcement, or says why not.
func awaitFirstReports(ctx context.Context, c status.Clients, nodes int) (skip string, err error) {
	deadline := time.Now().Add(waitFirstReport)
	for {
		cl, err := status.Gather(ctx, c, status.DefaultAgents)
		if err != nil {
			return "", err
		}
		reported := 0
		for _, n := range cl.Nodes {
			if n.Report != nil {
				reported++
			}
		}
		if len(cl.Nodes) == nodes && reported == nodes {
			return "", nil
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("%d of %d agents wrote a NodeEnforcement within %v (an agent without its status.Reporter wired writes none)",
				reported, nodes, waitFirstReport), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRound is one status.Wait, bounded by 30 s.
func waitRound(ctx context.Context, c status.Clients, np *networkingv1.NetworkPolicy, deleted bool) (status.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	row, err := status.Wait(ctx, c, status.DefaultAgents, policyRef(np), deleted)
	if err != nil {
		what := "creation"
		if deleted {
			what = "deletion"
		}
		return row, fmt.Errorf("status.Wait for the %s of %s: %w", what, np.Name, err)
	}
	return row, nil
}

// waitPolicy isolates the servers (a pod on each node) but for port 80
// from role=client.
func waitPolicy(i int) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(80)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: waitNS, Name: fmt.Sprintf("wait-%d", i)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
}
