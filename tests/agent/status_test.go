package agent_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// nftpolicyCLI runs `kubectl-nftpolicy args...` (the plugin) as an administrator and returns
// its exit code, stdout and stderr.
func nftpolicyCLI(t *testing.T, ctx context.Context, c *cluster.Cluster, args ...string) (int, string, string) {
	t.Helper()
	bin, err := cluster.PluginBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", c.Env.AdminKubeconfig)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("nftpolicy %s: %v", strings.Join(args, " "), err)
	}
	return code, stdout.String(), stderr.String()
}

// statusLine is the line of `nftpolicy status -o wide` about a policy.
func statusLine(t *testing.T, ctx context.Context, c *cluster.Cluster, args ...string) string {
	t.Helper()
	code, out, errOut := nftpolicyCLI(t, ctx, c, append([]string{"status", "-o", "wide"}, args...)...)
	if code != 0 {
		t.Fatalf("nftpolicy status: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("nftpolicy status %s: want a header and one line, got:\n%s", strings.Join(args, " "), out)
	}
	return lines[1]
}

// TestStatusAndWait: two nodes. `wait` returns once both enforce a new
// policy and `status` says 2/2; with one agent stopped, `status` says 1/2
// naming its node and `wait` for a change times out (exit 1) naming it;
// an invalid ClusterNetworkPolicy shows its warning; `wait --for=deleted`
// returns once both enforce a deletion.
func TestStatusAndWait(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t, 4*time.Minute)
	c := cluster.Start(t, cluster.Config{})
	if err := c.EnsureNamespace(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	np := makePolicy("x", "deny", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "db")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	})
	np, err := c.Client.NetworkingV1().NetworkPolicies("x").Create(ctx, np, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := nftpolicyCLI(t, ctx, c, "wait", "networkpolicy/deny", "-n", "x", "--for=programmed", "--timeout=30s")
	if code != 0 || !strings.Contains(out, "on 2/2 nodes") {
		t.Fatalf("wait after create: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	t.Logf("wait: %s", strings.TrimSpace(out))
	if line := statusLine(t, ctx, c, "-n", "x", "np/deny"); !strings.Contains(line, " 2/2 ") {
		t.Errorf("status with both agents up: %q, want 2/2", line)
	}

	// One agent down: its kernel keeps the old program.
	if err := c.Agent("node-2").Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var line string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if line = statusLine(t, ctx, c, "-n", "x", "np/deny"); strings.Contains(line, " 1/2 ") {
			break
		}
	}
	if !strings.Contains(line, " 1/2 ") || !strings.Contains(line, "node-2: agent pod") {
		t.Errorf("status with node-2's agent stopped: %q, want 1/2 naming node-2", line)
	}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)}}}
	if _, err := c.Client.NetworkingV1().NetworkPolicies("x").Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = nftpolicyCLI(t, ctx, c, "wait", "np/deny", "-n", "x", "--timeout=3s")
	if code != 1 || !strings.Contains(errOut, "node-2") || strings.Contains(errOut, "node-1:") {
		t.Errorf("wait with node-2's agent stopped: exit %d, want 1 naming node-2 only\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	t.Logf("wait timing out: %s", strings.TrimSpace(errOut))
	// --exit-code=false: the timeout is said, the exit status is 0.
	code, _, errOut = nftpolicyCLI(t, ctx, c, "wait", "np/deny", "-n", "x", "--timeout=1s", "--exit-code=false")
	if code != 0 || !strings.Contains(errOut, "timed out after 1s") {
		t.Errorf("wait --exit-code=false timing out: exit %d, want 0 and the timeout said; stderr: %s", code, errOut)
	}
	if err := c.Agent("node-2").Start(); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = nftpolicyCLI(t, ctx, c, "wait", "np/deny", "-n", "x", "--timeout=60s"); code != 0 {
		t.Errorf("wait after node-2's agent came back: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	// An invalid ClusterNetworkPolicy: enforced fail-closed, with a warning.
	if err := c.InstallClusterPolicyCRD(ctx, "experimental"); err != nil {
		t.Fatal(err)
	}
	cnp := ct.CNP("x-domains", "Baseline", 5, ct.NamespacesSubject(ct.Sel("ns", "nowhere")),
		ct.CNPEgress(ct.CNPRule("docs", "Deny", ct.ToDomains("example.com"))))
	if _, err := c.ApplyClusterPolicy(ctx, cnp); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = nftpolicyCLI(t, ctx, c, "wait", "cnp/x-domains", "--timeout=60s"); code != 0 || !strings.Contains(out, "warning: InvalidClusterNetworkPolicy") {
		t.Errorf("wait for the invalid ClusterNetworkPolicy: exit %d, want 0 with its warning\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if line := statusLine(t, ctx, c, "cnp/x-domains"); !strings.Contains(line, " 2/2 ") || !strings.Contains(line, "InvalidClusterNetworkPolicy") {
		t.Errorf("status of the invalid ClusterNetworkPolicy: %q, want 2/2 and its warning", line)
	}

	// A deletion.
	if err := c.Client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = nftpolicyCLI(t, ctx, c, "wait", "np/deny", "-n", "x", "--for=deleted", "--timeout=30s"); code != 0 || !strings.Contains(out, "deleted on 2/2 nodes") {
		t.Errorf("wait --for=deleted: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
}
