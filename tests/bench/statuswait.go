package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

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
// NodeEnforcements. Wait is then timed again for the same policy (what
// Wait itself takes), and for its deletion. When the agents write no
// NodeEnforcement it measures nothing and says why in skip.
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
	var rounds []waitSample
	for i := 0; i < cfg.WaitRounds; i++ {
		w, err := waitOnce(ctx, clients, c.Client, i)
		if err != nil {
			return "", err
		}
		rounds = append(rounds, w)
	}
	pick := func(f func(waitSample) time.Duration) (ds []time.Duration) {
		for _, w := range rounds {
			ds = append(ds, f(w))
		}
		return ds
	}
	created := pick(func(w waitSample) time.Duration { return w.created })
	res.Set("wait_latency_rounds", cfg.WaitRounds)
	res.Set("wait_latency_ms_p50", millis(Percentile(created, 50)))
	res.Set("wait_latency_ms_p90", millis(Percentile(created, 90)))
	res.Set("wait_latency_ms_max", millis(Percentile(created, 100)))
	for _, f := range []struct {
		name string
		of   func(waitSample) time.Duration
	}{
		{"wait_shown_ms_p50", func(w waitSample) time.Duration { return w.shown }},
		{"wait_enforced_ms_p50", func(w waitSample) time.Duration { return w.again }},
		{"wait_delete_latency_ms_p50", func(w waitSample) time.Duration { return w.deleted }},
		{"wait_reported_latency_ms_p50", func(w waitSample) time.Duration { return w.reported }},
	} {
		res.Set(f.name, millis(Percentile(pick(f.of), 50)))
	}
	cfg.Logf("status: create -> status.Wait with 2 agents, %d rounds: %s", cfg.WaitRounds, strings.ReplaceAll(strings.TrimSpace(res.Lines()), "\n", ", "))
	return "", nil
}

// waitSample is one round of measureWaitLatency.
type waitSample struct {
	// created: Create returned -> Wait returned; shown: -> every node's
	// NodeEnforcement shows the policy (a watch opened before); again: a
	// second Wait; deleted: Delete returned -> Wait for the deletion
	// returned; reported: the nodes' own change-to-commit latency.
	created, shown, again, deleted, reported time.Duration
}

// waitOnce creates policy i, waits for it, waits again, deletes it and
// waits for the deletion.
func waitOnce(ctx context.Context, c status.Clients, cs kubernetes.Interface, i int) (waitSample, error) {
	var w waitSample
	ne := c.Dynamic.Resource(status.GVR)
	list, err := ne.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return w, err
	}
	watcher, err := ne.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		return w, err
	}
	pols := cs.NetworkingV1().NetworkPolicies(waitNS)
	np, err := pols.Create(ctx, waitPolicy(i), metav1.CreateOptions{})
	if err != nil {
		watcher.Stop()
		return w, err
	}
	t0 := time.Now()
	shown := make(chan error, 1)
	go func() {
		err := awaitWatermark(ctx, c.Dynamic, watcher, 2, np.ResourceVersion)
		w.shown = time.Since(t0)
		shown <- err
	}()
	row, err := waitRound(ctx, c, np, false)
	if err != nil {
		return w, err
	}
	w.created, w.reported = time.Since(t0), row.Latency
	if err := <-shown; err != nil {
		return w, err
	}
	t0 = time.Now()
	if _, err := waitRound(ctx, c, np, false); err != nil {
		return w, err
	}
	w.again = time.Since(t0)
	if err := pols.Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		return w, err
	}
	t0 = time.Now()
	if _, err := waitRound(ctx, c, np, true); err != nil {
		return w, err
	}
	w.deleted = time.Since(t0)
	return w, nil
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
