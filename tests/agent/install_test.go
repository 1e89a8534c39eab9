package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestInstallManifest checks install.yaml against a real API server: every
// object passes server-side validation and admission (dry run), and the
// ClusterRole grants the agent exactly what it uses (read-only
// ClusterNetworkPolicies, asked with their CRD installed). No root needed.
func TestInstallManifest(t *testing.T) {
	env := cluster.StartControlPlane(t)
	manifest, err := cluster.InstallManifest()
	if err != nil {
		t.Fatal(err)
	}

	out, err := env.Kubectl(t, "apply", "--dry-run=server", "-f", manifest)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f install.yaml: %v\n%s", err, out)
	}
	t.Logf("kubectl apply --dry-run=server:\n%s", out)
	for _, obj := range []string{"serviceaccount/nftpolicy", "clusterrole.rbac.authorization.k8s.io/nftpolicy",
		"clusterrolebinding.rbac.authorization.k8s.io/nftpolicy", "daemonset.apps/nftpolicy"} {
		if !strings.Contains(out, obj+" created (server dry run)") {
			t.Errorf("kubectl output lacks %q", obj+" created (server dry run)")
		}
	}

	// The RBAC the agent runs with: apply it for real and ask the
	// authorizer what the ServiceAccount may do.
	docs, err := cluster.InstallDocuments("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
	if err != nil {
		t.Fatal(err)
	}
	rbac := filepath.Join(t.TempDir(), "rbac.yaml")
	if err := os.WriteFile(rbac, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", rbac); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	// kubectl resolves resource names through discovery: without the CRD it
	// cannot even ask about clusternetworkpolicies.
	crd, err := cluster.CRDPath(t.Context(), "standard")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "--server-side", "-f", crd); err != nil {
		t.Fatalf("kubectl apply -f %s: %v\n%s", crd, err, out)
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+cluster.ClusterPolicyCRD); err != nil {
		t.Fatalf("waiting for the ClusterNetworkPolicy CRD: %v\n%s", err, out)
	}
	const sa = "system:serviceaccount:kube-system:nftpolicy"
	const cnps = "clusternetworkpolicies.policy.networking.k8s.io"
	checks := []struct {
		verb, resource string
		want           bool
		subresource    string
	}{
		{"list", "pods", true, ""},
		{"watch", "pods", true, ""},
		{"list", "namespaces", true, ""},
		{"watch", "namespaces", true, ""},
		{"list", "networkpolicies.networking.k8s.io", true, ""},
		{"watch", "networkpolicies.networking.k8s.io", true, ""},
		{"list", "nodes", true, ""},
		{"watch", "nodes", true, ""},
		{"list", cnps, true, ""},
		{"watch", cnps, true, ""},
		{"create", "events", true, ""},
		{"patch", "events", true, ""},
		// Nothing it does not need.
		{"update", "pods", false, ""},
		{"delete", "networkpolicies.networking.k8s.io", false, ""},
		{"get", "nodes", false, ""},
		{"update", "nodes", false, ""},
		{"create", cnps, false, ""},
		{"update", cnps, false, ""},
		{"patch", cnps, false, ""},
		{"delete", cnps, false, ""},
		{"update", cnps, false, "status"},
		{"patch", cnps, false, "status"},
		{"get", "secrets", false, ""},
		{"list", "configmaps", false, ""},
	}
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"auth", "can-i", c.verb, c.resource, "--all-namespaces", "--as=" + sa}
			what := c.resource
			if c.subresource != "" {
				args = append(args, "--subresource="+c.subresource)
				what += "/" + c.subresource
			}
			out, err := env.Kubectl(t, args...)
			got := strings.TrimSpace(out) == "yes"
			if got != c.want || (err != nil && strings.TrimSpace(out) != "no") {
				t.Errorf("can %s %s %s: %q (err %v), want %v", sa, c.verb, what, out, err, c.want)
			}
		}()
	}
	wg.Wait()
}
