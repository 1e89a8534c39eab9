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
// ClusterRole grants the agent exactly what it uses. No root needed.
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
	const sa = "system:serviceaccount:kube-system:nftpolicy"
	checks := []struct {
		verb, resource string
		want           bool
	}{
		{"list", "pods", true},
		{"watch", "pods", true},
		{"list", "namespaces", true},
		{"watch", "namespaces", true},
		{"list", "networkpolicies.networking.k8s.io", true},
		{"watch", "networkpolicies.networking.k8s.io", true},
		{"get", "nodes", true},
		{"create", "events", true},
		{"patch", "events", true},
		// Nothing it does not need.
		{"update", "pods", false},
		{"delete", "networkpolicies.networking.k8s.io", false},
		{"list", "nodes", false},
		{"get", "secrets", false},
		{"list", "configmaps", false},
	}
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := env.Kubectl(t, "auth", "can-i", c.verb, c.resource, "--all-namespaces", "--as="+sa)
			got := strings.TrimSpace(out) == "yes"
			if got != c.want || (err != nil && strings.TrimSpace(out) != "no") {
				t.Errorf("can %s %s %s: %q (err %v), want %v", sa, c.verb, c.resource, out, err, c.want)
			}
		}()
	}
	wg.Wait()
}
