package cli

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// apiServer answers every request with code and a Kubernetes Status.
func apiServer(t *testing.T, code int, reason string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":%q,"code":%d,"message":"%s: %s"}`,
			reason, code, strings.ToLower(reason), r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// kubeconfig writes a kubeconfig with one context per server (named as
// the map's keys) and selects current.
func kubeconfig(t *testing.T, current string, servers map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\ncurrent-context: %s\nclusters:\n", current)
	for name, url := range servers {
		fmt.Fprintf(&b, "- name: %s\n  cluster: {server: %q}\n", name, url)
	}
	b.WriteString("users:\n- name: u\n  user: {token: t}\ncontexts:\n")
	for name := range servers {
		fmt.Fprintf(&b, "- name: %s\n  context: {cluster: %s, user: u, namespace: x}\n", name, name)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedPort is an address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func runCmd(cmd func([]string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := cmd(args, &out, &errb)
	return code, out.String(), errb.String()
}

func statusCmd(args []string, out, errb *bytes.Buffer) int { return Status(args, out, errb) }
func waitCmd(args []string, out, errb *bytes.Buffer) int   { return Wait(args, out, errb) }

// $KUBECONFIG naming a missing file is said as such, not as "no
// kubeconfig" (client-go skips missing files of $KUBECONFIG).
func TestKubeconfigEnvMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexistent")
	t.Setenv("KUBECONFIG", missing)
	code, _, errOut := runCmd(statusCmd, "-A")
	if code != ExitBadInput {
		t.Errorf("exit %d, want %d", code, ExitBadInput)
	}
	if want := "$KUBECONFIG names " + missing + ", which does not exist"; !strings.Contains(errOut, want) {
		t.Errorf("stderr %q lacks %q", errOut, want)
	}
	// An explicit --kubeconfig wins over the variable.
	t.Setenv("KUBECONFIG", missing)
	path := kubeconfig(t, "a", map[string]string{"a": apiServer(t, http.StatusForbidden, "Forbidden")})
	if code, _, errOut := runCmd(statusCmd, "-A", "--kubeconfig", path); code != ExitUnreachable {
		t.Errorf("--kubeconfig: exit %d, want %d; stderr: %s", code, ExitUnreachable, errOut)
	}
}

// One table for every command: a refused request or an unreachable
// server is 3, a policy that does not exist is 2, bad flags are 2.
func TestExitCodes(t *testing.T) {
	forbidden := apiServer(t, http.StatusForbidden, "Forbidden")
	notFound := apiServer(t, http.StatusNotFound, "NotFound")
	path := kubeconfig(t, "forbidden", map[string]string{"forbidden": forbidden, "notfound": notFound, "down": closedPort(t)})
	for _, tc := range []struct {
		name string
		cmd  func([]string, *bytes.Buffer, *bytes.Buffer) int
		args []string
		want int
		msg  string
	}{
		{"status forbidden", statusCmd, []string{"-A"}, ExitUnreachable, "forbidden"},
		{"status down", statusCmd, []string{"-A", "--context", "down"}, ExitUnreachable, "connection refused"},
		{"status missing policy", statusCmd, []string{"np/nope", "--context", "notfound"}, ExitBadInput, "NetworkPolicy x/nope not found"},
		{"status bad -o", statusCmd, []string{"-o", "table"}, ExitBadInput, "-o text, wide, json or yaml"},
		{"status bad flag", statusCmd, []string{"--bogus"}, ExitBadInput, "unknown flag: --bogus"},
		{"wait forbidden", waitCmd, []string{"np/a"}, ExitUnreachable, "forbidden"},
		{"wait down", waitCmd, []string{"np/a", "--context", "down", "--timeout", "2s"}, ExitUnreachable, "connection refused"},
		{"wait missing policy", waitCmd, []string{"np/nope", "--context", "notfound"}, ExitBadInput, "NetworkPolicy x/nope not found"},
		{"wait bad --for", waitCmd, []string{"np/a", "--for", "ready"}, ExitBadInput, "--for=programmed or --for=delete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCmd(tc.cmd, append(tc.args, "--kubeconfig", path)...)
			if code != tc.want || !strings.Contains(errOut, tc.msg) {
				t.Errorf("exit %d, want %d; stderr %q, want %q in it", code, tc.want, errOut, tc.msg)
			}
		})
	}
}

// wait takes kubectl's spelling --for=delete: it goes on to ask the API
// server (here, a refusal: exit 3) instead of refusing the flag (exit 2).
func TestWaitForDelete(t *testing.T) {
	path := kubeconfig(t, "a", map[string]string{"a": apiServer(t, http.StatusForbidden, "Forbidden")})
	for _, spelling := range []string{"--for=delete", "--for=deleted"} {
		code, _, errOut := runCmd(waitCmd, "np/a", spelling, "--kubeconfig", path)
		if code != ExitUnreachable || !strings.Contains(errOut, "forbidden") {
			t.Errorf("%s: exit %d, want %d; stderr: %s", spelling, code, ExitUnreachable, errOut)
		}
	}
}

// --context selects the kubeconfig's context; -n and the context's
// namespace name the policy's namespace.
func TestContextAndNamespace(t *testing.T) {
	path := kubeconfig(t, "forbidden", map[string]string{
		"forbidden": apiServer(t, http.StatusForbidden, "Forbidden"),
		"notfound":  apiServer(t, http.StatusNotFound, "NotFound"),
	})
	if _, _, errOut := runCmd(statusCmd, "np/p", "--kubeconfig", path); !strings.Contains(errOut, "forbidden: /apis/networking.k8s.io/v1/namespaces/x/") {
		t.Errorf("current context: stderr %q", errOut)
	}
	if _, _, errOut := runCmd(statusCmd, "np/p", "--kubeconfig", path, "--context", "notfound", "-n", "y"); !strings.Contains(errOut, "NetworkPolicy y/p not found") {
		t.Errorf("--context notfound -n y: stderr %q", errOut)
	}
}
