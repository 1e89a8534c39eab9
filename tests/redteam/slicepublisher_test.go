package redteam

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// slicePublisherStaleAfter is the agent's stale bound in the test: above
// the publisher's renewal period (2 s), short so that the fallback comes
// soon after the publisher is killed.
const slicePublisherStaleAfter = 6 * time.Second

// TestRedTeamSlicePublisherEndToEnd: the real publisher process
// (`nftpolicy publish`) and an agent in slice mode. A remote pod's
// relabelling (node-2) reaches node-1's ruleset through the publisher's
// slices; the publisher killed (SIGKILL: no Lease released, no last
// write), node-1's agent reads every Pod once the synced Lease is stale,
// and a remote change made after the kill is in force through its Pod.
func TestRedTeamSlicePublisherEndToEnd(t *testing.T) {
	testenv.Require(t, "red-team slice tests", testenv.Root("create network namespaces and run an nftpolicy agent in them"))
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1", "node-2"}, NoAgents: true,
		AgentArgs: []string{"--pod-source", "slices", "--pod-slices-stale-after", slicePublisherStaleAfter.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pub := startPublisherProcess(t, c)
	if err := c.EnsureNamespace(ctx, "e2e", nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []cluster.Pod{
		{Namespace: "e2e", Name: "db", Labels: map[string]string{"app": "db"}, Node: "node-1"},
		{Namespace: "e2e", Name: "client", Labels: map[string]string{"role": "other"}, Node: "node-2"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.ApplyPolicy(ctx, compiletest.NetPol("e2e", "db", compiletest.Sel("app", "db"),
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
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "client not yet trusted", "e2e/client", "e2e/db", false, time.Now())

	written := time.Now()
	if err := c.LabelPod(ctx, "e2e", "client", map[string]string{"role": "trusted"}); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "relabelled through the publisher's slices", "e2e/client", "e2e/db", true, written)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}

	if err := pub.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitPodSource(t, ctx, a, "pods")
	// The bound runs from the last renewal the agent saw, up to the
	// publisher's renewal period (2 s) before the kill.
	t.Logf("the agent read every Pod %v after the publisher was killed (stale bound %v from the last renewal)",
		time.Since(killed).Round(time.Millisecond), slicePublisherStaleAfter)
	written = time.Now()
	if err := c.LabelPod(ctx, "e2e", "client", map[string]string{"role": "other"}); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "relabelled with the publisher gone", "e2e/client", "e2e/db", false, written)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	policyLive(t, ctx, a)
}

// startPublisherProcess runs `nftpolicy publish` as the cluster's admin
// (the harness applies no admission policy on slices), its log in the
// test's directory; the test's end kills it.
func startPublisherProcess(t *testing.T, c *cluster.Cluster) *exec.Cmd {
	t.Helper()
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "publisher.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "publish", "--kubeconfig", c.Env.AdminKubeconfig, "--identity", "publisher-0",
		"--metrics-bind-address", "")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("publisher log:\n%s", lastBytes(string(b), 4000))
			}
		}
	})
	return cmd
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
