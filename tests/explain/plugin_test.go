package explain_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// The kubectl plugin's binary against a real kube-apiserver, with a
// kubeconfig of two contexts: the current one names a server that is
// down, --context selects the live one, and --as impersonates a user
// without RBAC, who is refused. Exit statuses: 0 done, 2 bad input, 3 the
// API server cannot be reached or refuses.
func TestPluginLive(t *testing.T) {
	env := kubeenv.Start(t)
	plugin, err := cluster.PluginBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createObjects(ctx, t, env)
	docs, err := cluster.InstallDocuments("CustomResourceDefinition")
	if err != nil {
		t.Fatal(err)
	}
	crd := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(crd, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"apply", "-f", crd}, {"wait", "--for=condition=Established", "--timeout=60s", "crd/nodeenforcements.nftpolicy.io"}} {
		if out, err := env.Kubectl(t, args...); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	kubeconfig := twoContexts(t, env.AdminKubeconfig)
	run := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, plugin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String(), errb.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, out.String(), errb.String()
	}
	// The current context's server is down.
	if code, _, errOut := run("status", "-n", "x"); code != 3 || !strings.Contains(errOut, "connection refused") {
		t.Errorf("current context (down): exit %d, stderr %q; want 3, connection refused", code, errOut)
	}
	// --context selects the live server; the context's namespace is x.
	code, out, errOut := run("status", "--context", "live")
	if code != 0 || !strings.Contains(out, "x/allow-web") || !strings.Contains(out, "x/default-deny") {
		t.Errorf("--context live: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, errOut := run("status", "--context", "live", "np/allow-web", "-o", "yaml"); code != 0 || !strings.Contains(out, "name: allow-web") {
		t.Errorf("--context live np/allow-web -o yaml: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := run("status", "--context", "live", "np/nope"); code != 2 || !strings.Contains(errOut, "NetworkPolicy x/nope not found") {
		t.Errorf("a policy that does not exist: exit %d, stderr %q; want 2", code, errOut)
	}
	// An unprivileged user, by impersonation: refused, exit 3, named.
	for _, args := range [][]string{
		{"status", "--context", "live", "--as", "nobody"},
		{"wait", "np/allow-web", "--context", "live", "--as", "nobody", "--as-group", "nobodies"},
	} {
		if code, _, errOut := run(args...); code != 3 || !strings.Contains(errOut, `User "nobody" cannot`) {
			t.Errorf("%v: exit %d, stderr %q; want 3 and the refusal", args, code, errOut)
		}
	}
}

// twoContexts writes a kubeconfig with the admin's context as "live" and
// a current context "down" whose server does not listen.
func twoContexts(t *testing.T, admin string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		t.Fatal(err)
	}
	cur := cfg.Contexts[cfg.CurrentContext]
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "https://" + l.Addr().String()
	l.Close()
	cfg.Clusters["down"] = &clientcmdapi.Cluster{Server: down, InsecureSkipTLSVerify: true}
	cfg.Contexts["live"] = &clientcmdapi.Context{Cluster: cur.Cluster, AuthInfo: cur.AuthInfo, Namespace: "x"}
	cfg.Contexts["down"] = &clientcmdapi.Context{Cluster: "down", AuthInfo: cur.AuthInfo, Namespace: "x"}
	cfg.CurrentContext = "down"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
