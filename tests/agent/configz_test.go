package agent_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestConfigz runs a real agent with a configuration file (--config) and
// flags, some naming the same settings, and reads GET /configz on its
// health port: the effective configuration is the defaults, then the
// file, then the command line's flags (the harness's --mode and
// --state-dir, and --unknown-pod-wait, win over the file's); the agent
// logs the same at start at -v=1 (the harness runs -v=2). /configz holds
// the kubeconfig's path, not its credentials.
func TestConfigz(t *testing.T) {
	requireRoot(t)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: nftpolicy.io/v1alpha1
kind: AgentConfiguration
mode: kernel
stateDir: /nonexistent/state
fullSyncPeriod: 1h
denyLog:
  linesPerSecond: 7
unknownPods:
  wait: 3s
dns:
  maxNamesPerPod: 100
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1"},
		AgentArgs: []string{"--config", file, "--unknown-pod-wait", "4s"}})
	ctx := testContext(t, time.Minute)
	a := c.Agent("node-1")
	code, body, err := a.Get(ctx, a.HealthAddr, "/configz")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /configz: %d %q %v", code, body, err)
	}
	got, err := config.Decode([]byte(body))
	if err != nil {
		t.Fatalf("/configz is no AgentConfiguration: %v\n%s", err, body)
	}
	for _, check := range []struct {
		what      string
		got, want any
	}{
		{"mode (flag over file)", got.Mode, string(c.Mode())},
		{"stateDir (flag over file)", got.StateDir, a.StateDir()},
		{"unknownPods.wait (flag over file)", got.UnknownPods.Wait.Duration, 4 * time.Second},
		{"healthBindAddress (flag)", got.HealthBindAddress, a.HealthAddr},
		{"fullSyncPeriod (file)", got.FullSyncPeriod.Duration, time.Hour},
		{"denyLog.linesPerSecond (file)", got.DenyLog.LinesPerSecond, 7},
		{"dns.maxNamesPerPod (file)", got.DNS.MaxNamesPerPod, 100},
		{"denyLog.flowInterval (default)", got.DenyLog.FlowInterval, config.Default().DenyLog.FlowInterval},
		{"kubeconfig (flag)", got.Kubeconfig, a.Kubeconfig},
	} {
		if check.got != check.want {
			t.Errorf("%s: /configz says %v, want %v", check.what, check.got, check.want)
		}
	}
	kubeconfig, err := os.ReadFile(a.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(kubeconfig), "\n") {
		for _, key := range []string{"-data: ", "token: "} {
			_, secret, ok := strings.Cut(line, key)
			if secret = strings.Trim(secret, `"`); ok && len(secret) > 16 && strings.Contains(body, secret) {
				t.Errorf("/configz holds the kubeconfig's credentials (%.20s...)", secret)
			}
		}
	}
	if log := a.LogTail(200); !strings.Contains(log, `"Effective configuration"`) || !strings.Contains(log, `\"fullSyncPeriod\":\"1h0m0s\"`) {
		t.Errorf("the agent did not log its effective configuration at start; log tail:\n%s", log)
	}
}
