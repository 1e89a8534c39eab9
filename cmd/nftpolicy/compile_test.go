package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
)

// agentRendered is the ruleset of node-1 of the scenario at path as the
// agent renders it with args: its flags parsed as runAgent does, its
// render configuration completed as agent() does (renderConfig,
// newPod.configure, finishRenderConfig with prober as the kernel).
func agentRendered(t *testing.T, path string, prober queuerule.QueueProber, args ...string) string {
	t.Helper()
	o := parseAgentFlags(t, prober, args...)
	mode, err := compile.ParseMode(o.mode)
	if err != nil {
		t.Fatal(err)
	}
	render, err := o.renderConfig(mode)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.newPod.configure(&render, &evaluate.Evaluator{}, prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	metrics, _, err := newRegistry()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.finishRenderConfig(context.Background(), &render, render.DNSQueueNum, metrics); err != nil {
		t.Fatal(err)
	}
	s, code := loadScenario(path, io.Discard)
	if s == nil {
		t.Fatalf("loading %s: exit %d", path, code)
	}
	out, _, err := CompileScenario(s, "node-1", nil, o.budgets, render)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCompileRendersAgentDefaults: `nftpolicy compile` prints what the
// agent renders with the same flags, by default the agent's defaults (the
// deny log and the staged log on), for every golden scenario.
func TestCompileRendersAgentDefaults(t *testing.T) {
	scenarios, _ := filepath.Glob("../../pkg/compile/testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	native := &stubProber{native: true, compat: true}
	compat := &stubProber{compat: true}
	for _, tc := range []struct {
		name              string
		prober            *stubProber
		agentArgs, cmdArg []string
	}{
		{"defaults", native, nil, nil},
		{"xt-compat", compat, nil, []string{"--queue-variant", "xt-compat"}},
		{"kernel", native, []string{"--mode", "kernel"}, []string{"--mode", "kernel"}},
		{"queue", native, []string{"--mode", "queue", "--queues", "2"}, []string{"--mode", "queue", "--queues", "2"}},
		{"no-logs", native, []string{"--deny-log=false", "--staged-log=false"}, []string{"--deny-log=false", "--staged-log=false"}},
		{"verify", native, []string{"--verify-rate", "0.5", "--deny-log-group", "30"}, []string{"--verify-rate", "0.5", "--deny-log-group", "30"}},
	} {
		for _, sc := range scenarios {
			t.Run(tc.name+"/"+strings.TrimSuffix(filepath.Base(sc), ".yaml"), func(t *testing.T) {
				want := agentRendered(t, sc, tc.prober, tc.agentArgs...)
				var out, errb bytes.Buffer
				if code := run(append([]string{"compile", "--scenario", sc, "--node", "node-1"}, tc.cmdArg...), &out, &errb); code != exitOK {
					t.Fatalf("exit %d: %s", code, errb.String())
				}
				if diff := cmp.Diff(want, out.String()); diff != "" {
					t.Errorf("compile %v differs from the agent's ruleset with %v (-agent +compile):\n%s", tc.cmdArg, tc.agentArgs, diff)
				}
			})
		}
	}
	// The agent's defaults include the deny log: compile's output logs
	// drops to its group, and --deny-log=false turns that off.
	sc := "../../pkg/compile/testdata/golden/deny-and-allow.yaml"
	for _, tc := range []struct {
		args []string
		log  bool
	}{{nil, true}, {[]string{"--deny-log=false"}, false}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"compile", "--scenario", sc, "--node", "node-1"}, tc.args...), &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errb.String())
		}
		if got := strings.Contains(out.String(), "counter log prefix"); got != tc.log {
			t.Errorf("compile %v: logs denials (counter log prefix): %v, want %v", tc.args, got, tc.log)
		}
	}
}
