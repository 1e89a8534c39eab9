package redteam

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/slicetest"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// sliceStaleAfter is the agent's --pod-slices-stale-after in the attack:
// short, so that the test does not wait the default 45 s.
const sliceStaleAfter = 3 * time.Second

// TestRedTeamSliceAddressReuse: with --pod-source slices, the publisher
// goes away (its Lease is no longer renewed). A pod that an allow policy
// admits (reuse/trusted, on node-2) is deleted meanwhile, and its slice
// keeps it: nobody updates the slice. An attacker's new pod of other
// labels (reuse/intruder) gets the same address on node-2 and connects to
// reuse/db on node-1, whose policy admits only role=trusted. The agent on
// node-1 must not take the intruder for the deleted pod: once the Lease is
// stale for --pod-slices-stale-after it reads every Pod and denies the
// intruder. With the fallback disabled (a bound of 1,000 hours) the same
// attack is admitted: that is what the fallback defends against.
func TestRedTeamSliceAddressReuse(t *testing.T) {
	testenv.Require(t, "red-team slice tests", testenv.Root("create network namespaces and run an nftpolicy agent in them"))
	t.Run("fallback-disabled", func(t *testing.T) {
		if !sliceReuseAttack(t, 1000*time.Hour) {
			t.Fatal("the intruder was denied without the fallback too: the attack shows nothing")
		}
	})
	t.Run("fallback", func(t *testing.T) {
		if sliceReuseAttack(t, sliceStaleAfter) {
			t.Fatalf("the intruder, on a deleted pod's address, was admitted as that pod %v after the publisher went away", 4*sliceStaleAfter)
		}
	})
}

// sliceReuseAttack runs the attack against an agent whose stale bound is
// staleAfter, and reports whether the intruder's connection was admitted
// 4x sliceStaleAfter after the publisher went away.
func sliceReuseAttack(t *testing.T, staleAfter time.Duration) bool {
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1", "node-2"}, NoAgents: true,
		AgentArgs: []string{"--pod-source", "slices", "--pod-slices-stale-after", staleAfter.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	slicetest.InstallCRD(t, c.Env)
	slicetest.GrantAgentRead(t, c.Env)
	lease := slicetest.StartLease(ctx, t, c.Client, 500*time.Millisecond)
	if err := c.EnsureNamespace(ctx, "reuse", nil); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, p := range []cluster.Pod{
		{Namespace: "reuse", Name: "db", Labels: map[string]string{"app": "db"}, Node: "node-1"},
		{Namespace: "reuse", Name: "trusted", Labels: map[string]string{"role": "trusted"}, Node: "node-2"},
	} {
		obj, err := c.CreatePod(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		pods[p.Name] = obj
		// The publisher's slices (db's entry, of node-1, node-1's agent
		// leaves out).
		if err := slicetest.Write(ctx, c.Client, slicetest.Slice(p.Name, obj)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.ApplyPolicy(ctx, compiletest.NetPol("reuse", "db", compiletest.Sel("app", "db"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("role", "trusted")))))); err != nil {
		t.Fatal(err)
	}
	a := c.Agent("node-1")
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitPodSource(t, ctx, a, "slices")
	// The harness's wait works in slices mode: the agent's inputs
	// fingerprint is computed from the slices it reads.
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "trusted admitted", "reuse/trusted", "reuse/db", true, time.Now())

	// The attack.
	lease.Pause()
	away := time.Now()
	addr := c.PodIPs("reuse/trusted")
	if err := c.DeletePod(ctx, "reuse", "trusted"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreatePod(ctx, cluster.Pod{Namespace: "reuse", Name: "intruder", Labels: map[string]string{"role": "other"},
		Node: "node-2", IPs: addr}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(away.Add(4 * sliceStaleAfter)))
	admitted := policyConnect(t, ctx, c, "reuse/intruder", c.PodIPs("reuse/db")[0])
	m, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stale bound %v: intruder (%v) -> db admitted %v, %v after the publisher went away; pod source slices %v, pods %v",
		staleAfter, addr, admitted, time.Since(away).Round(time.Millisecond),
		m[`nftpolicy_pod_source{source="slices"}`], m[`nftpolicy_pod_source{source="pods"}`])
	policyLive(t, ctx, a)
	if !admitted {
		switchEvent(t, ctx, c, "Other nodes' pods are read from pods")
	}
	return admitted
}

// switchEvent waits for the agent's PodSourceSwitched Event on node-1
// whose message starts with prefix.
func switchEvent(t *testing.T, ctx context.Context, c *cluster.Cluster, prefix string) {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		evs, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=PodSourceSwitched"})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.InvolvedObject.Kind+"/"+ev.InvolvedObject.Name+": "+ev.Message)
			if ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == "node-1" && strings.HasPrefix(ev.Message, prefix) {
				return
			}
		}
	}
	t.Errorf("no PodSourceSwitched Event on node-1 starting %q; seen %q", prefix, seen)
}

// waitPodSource waits until the agent reads other nodes' pods from source.
func waitPodSource(t *testing.T, ctx context.Context, a *cluster.Agent, source string) {
	t.Helper()
	key := `nftpolicy_pod_source{source="` + source + `"}`
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		m, err := a.Metrics(ctx)
		if err == nil && m[key] == 1 {
			return
		}
	}
	t.Fatalf("the agent does not read pods from %s; log:\n%s", source, a.LogTail(30))
}
