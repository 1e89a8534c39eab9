package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/tests/e2e"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// evalLine is one line of `nftpolicy eval` (and, without the evaluator's
// fields and the connection, of the runner).
type evalLine struct {
	Probe    int    `json:"probe"`
	Allowed  bool   `json:"allowed"`
	Ingress  bool   `json:"ingress"`
	Egress   bool   `json:"egress"`
	Reason   string `json:"reason"`
	Error    string `json:"error"`
	From     string `json:"from"`
	To       string `json:"to"`
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
}

func parseLines(t *testing.T, out []byte) []evalLine {
	t.Helper()
	var lines []evalLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l evalLine
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		if l.Probe != len(lines) {
			t.Fatalf("output line %d is for probe %d", len(lines), l.Probe)
		}
		lines = append(lines, l)
	}
	return lines
}

// evalScenario runs the built `nftpolicy eval` on a scenario file.
func evalScenario(t *testing.T, path string) []evalLine {
	t.Helper()
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "eval", "--scenario", path).Output()
	if err != nil {
		t.Fatalf("nftpolicy eval --scenario %s: %v", path, err)
	}
	return parseLines(t, out)
}

// compareRun checks the runner's verdicts against eval's, probe for probe.
func compareRun(t *testing.T, s *scenario.Scenario, want []evalLine, got []evalLine, detail func(i int) string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("the runner printed %d lines, eval %d", len(got), len(want))
	}
	bad, allowed := 0, 0
	for i := range want {
		if got[i].Allowed {
			allowed++
		}
		if got[i].Error != "" || got[i].Allowed != want[i].Allowed {
			bad++
			pr := s.Probes[i]
			t.Errorf("probe %d %s -> %s %d/%s: runner %s%s, eval %s (ingress=%v egress=%v): %s",
				i, pr.From, pr.To, pr.Port, pr.ProbeProtocol(), ct.VerdictWord(got[i].Allowed), got[i].Error+detail(i),
				ct.VerdictWord(want[i].Allowed), want[i].Ingress, want[i].Egress, want[i].Reason)
		}
	}
	t.Logf("%d probes, %d allowed; %d disagree with nftpolicy eval", len(want), allowed, bad)
}

// runEntryPoint runs s with RunScenario in mode and compares every probe
// with eval's verdicts.
func runEntryPoint(t *testing.T, s *scenario.Scenario, want []evalLine, mode compile.Mode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	began := time.Now()
	out, err := e2e.RunScenario(ctx, t, s, e2e.RunConfig{Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]evalLine, len(out))
	for i, o := range out {
		got[i] = evalLine{Probe: o.Probe, Allowed: o.Allowed}
		if o.Err != nil {
			got[i].Error = o.Err.Error()
		}
	}
	compareRun(t, s, want, got, func(i int) string {
		return fmt.Sprintf(" (%v: %s, tries %d)", out[i].Spec, out[i].Detail, out[i].Tries)
	})
	t.Logf("RunScenario (%s, until the probes are done): %v", mode, time.Since(began).Round(time.Millisecond))
}

// scriptAndBinary returns the path of hack/run-scenario.sh and the agent
// binary it is to run (cluster.BinEnv), built once per test process.
func scriptAndBinary(t *testing.T) (script, bin string) {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if bin, err = cluster.AgentBinary(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "hack", "run-scenario.sh"), bin
}

// runScript runs hack/run-scenario.sh on the scenario file at path in mode,
// compares every line with eval's verdicts and returns its wall time.
func runScript(t *testing.T, path string, s *scenario.Scenario, want []evalLine, mode compile.Mode) time.Duration {
	t.Helper()
	script, bin := scriptAndBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script, path, "--mode", string(mode))
	cmd.Env = append(os.Environ(), cluster.BinEnv+"="+bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	took := time.Since(began)
	if err != nil {
		t.Fatalf("hack/run-scenario.sh: %v\nstderr:\n%s", err, stderr.String())
	}
	compareRun(t, s, want, parseLines(t, out), func(int) string { return "" })
	t.Logf("hack/run-scenario.sh %s --mode %s: %v wall time, exit status 0", filepath.Base(path), mode, took.Round(time.Millisecond))
	return took
}

// TestRunScenario runs testdata/grid-600.yaml (9 pods, 600 probes) with
// the runner's Go entry point in hybrid mode and with hack/run-scenario.sh
// in queue mode, and compares every probe with `nftpolicy eval`.
func TestRunScenario(t *testing.T) {
	requireLab(t)
	// The bound: 9 pods and 600 probes in under 3 minutes once the
	// tools are built (this includes building the runner).
	runBothWays(t, "testdata/grid-600.yaml", 3*time.Minute, nil)

	t.Run("exit-status", func(t *testing.T) {
		script, bin := scriptAndBinary(t)
		dir := t.TempDir()
		unknownField := filepath.Join(dir, "unknown-field.yaml")
		if err := os.WriteFile(unknownField, []byte("pods: [{namespace: x, name: a, ip: 10.244.1.10, lables: {}}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		agentPort := filepath.Join(dir, "agent-port.yaml")
		if err := os.WriteFile(agentPort, []byte("nodes: [{name: node-1, ips: [192.168.7.1]}]\npods: [{namespace: x, name: a, ip: 10.244.1.10}]\n"+
			"probes: [{from: {pod: x/a}, to: {node: node-1}, port: 9402}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			file string
			code int
			says string
		}{
			{unknownField, 2, `unknown field "pods[0].lables"`},
			{"testdata/hostnetwork.yaml", 1, "hostNetwork pods are not supported"},
			{agentPort, 1, "TCP port 9402 of node node-1 is the node agent's own"},
			{filepath.Join(dir, "missing.yaml"), 2, "cannot read"},
		} {
			cmd := exec.Command("bash", script, tc.file)
			cmd.Env = append(os.Environ(), cluster.BinEnv+"="+bin)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.says) {
				t.Errorf("run-scenario.sh %s: %v, want exit status %d saying %q; output:\n%s", filepath.Base(tc.file), err, tc.code, tc.says, out)
			}
		}
	})

	// A policy that the API server rejects is a scenario error (exit
	// status 2), found only once the cluster is up.
	t.Run("api-rejects-policy", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		data, err := os.ReadFile("testdata/bad-policy.yaml")
		if err != nil {
			t.Fatal(err)
		}
		// nftpolicy's own validation rejects it, as the API server does...
		if _, err := scenario.Parse(data); err == nil || !strings.Contains(err.Error(), "must not have bits set beyond the prefix length") {
			t.Fatalf("scenario.Parse: %v; want the host-bits error", err)
		}
		// ...and so does the real API server when the scenario gets past ours.
		var bad scenario.Scenario
		if err := sigsyaml.Unmarshal(data, &bad); err != nil {
			t.Fatal(err)
		}
		_, err = e2e.RunScenario(ctx, t, &bad, e2e.RunConfig{})
		var se *scenario.Error
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "must not have bits set beyond the prefix length") {
			t.Fatalf("RunScenario: %v; want a *scenario.Error from the API server's validation", err)
		}
		t.Logf("as expected: %v", err)
	})
}

// TestRunScenarioClusterPolicies runs testdata/cluster-policies.yaml
// (ClusterNetworkPolicies of both tiers, Pass, `nodes` and `networks` peers,
// probes to and from nodes) with the runner's Go entry point in hybrid mode
// and with hack/run-scenario.sh in queue mode, and compares every probe with
// `nftpolicy eval`.
func TestRunScenarioClusterPolicies(t *testing.T) {
	requireLab(t)
	runBothWays(t, "testdata/cluster-policies.yaml", 0, checkClusterPoliciesPremise)
}

// checkClusterPoliciesPremise checks that testdata/cluster-policies.yaml
// exercises what it claims to: some probes of each verdict, and the
// deciding objects of both tiers.
func checkClusterPoliciesPremise(t *testing.T, path string, want []evalLine) {
	allowed, reasons := 0, ""
	for _, w := range want {
		if w.Allowed {
			allowed++
		}
		reasons += w.Reason + "\n"
	}
	for _, says := range []string{"(Admin, priority 10) egress rule pass-to-y", "(Baseline, priority 5) ingress rule not-from-x",
		"egress rule no-fenced-nodes", "egress rule no-documentation-net", "between a node and its own pods"} {
		if !strings.Contains(reasons, says) {
			t.Errorf("test premise: no probe of %s is decided by %q", filepath.Base(path), says)
		}
	}
	if allowed == 0 || allowed == len(want) {
		t.Fatalf("test premise: %d of %d probes allowed by eval; want both verdicts", allowed, len(want))
	}
}

// runBothWays runs the scenario file name with the runner's Go entry point
// in hybrid mode and with hack/run-scenario.sh in queue mode, and compares
// every probe with `nftpolicy eval`. premise, when set, first checks eval's
// verdicts; bound, when not zero, is the script's longest wall time.
func runBothWays(t *testing.T, name string, bound time.Duration, premise func(t *testing.T, path string, want []evalLine)) {
	path, err := filepath.Abs(name)
	if err != nil {
		t.Fatal(err)
	}
	s := scenariotest.Load(t, path)
	want := evalScenario(t, path)
	if premise != nil {
		premise(t, path, want)
	}
	t.Run("hybrid-entry-point", func(t *testing.T) {
		runEntryPoint(t, s, want, compile.ModeHybrid)
	})
	t.Run("queue-run-scenario.sh", func(t *testing.T) {
		if took := runScript(t, path, s, want, compile.ModeQueue); bound > 0 && took > bound {
			t.Errorf("hack/run-scenario.sh took %v, more than %v", took, bound)
		}
	})
}

// TestRunScenarioDomainNames runs testdata/domain-names.yaml: the pods
// resolve their dnsAnswers through the runner's DNS server and the agents
// learn them from the real replies (hybrid: the kernel's sets; queue: the
// evaluator's learner); every probe must agree with `nftpolicy eval`.
func TestRunScenarioDomainNames(t *testing.T) {
	requireLab(t)
	runBothWays(t, "testdata/domain-names.yaml", 0, func(t *testing.T, path string, want []evalLine) {
		allowed := 0
		for _, w := range want {
			if w.Allowed {
				allowed++
			}
		}
		if allowed == 0 || allowed == len(want) {
			t.Fatalf("test premise: %d of %d probes allowed by eval; want both verdicts", allowed, len(want))
		}
	})
}

// TestRunScenarioStaged runs testdata/staged.yaml: staged policies of both
// APIs and a staged namespace, created with their annotations through the
// API, must block nothing (every probe agrees with `nftpolicy eval`, and
// eval allows what only staged policies would deny).
func TestRunScenarioStaged(t *testing.T) {
	requireLab(t)
	runBothWays(t, "testdata/staged.yaml", 0, func(t *testing.T, path string, want []evalLine) {
		for i, allowed := range []bool{true, false, true, false, true, true, false} {
			if want[i].Allowed != allowed {
				t.Fatalf("test premise: eval says probe %d is %s (%s)", i, ct.VerdictWord(want[i].Allowed), want[i].Reason)
			}
		}
	})
}

// TestRunScenarioDualStack runs the kernel suite's
// ../kernel/testdata/dualstack.yaml through the runner: dual-stack and
// IPv6-only pods probed per family, an IPv4-only ipBlock that admits a
// dual-stack pod's IPv4 and not its IPv6, an IPv6-only pod that resolves
// an AAAA answer through the runner's DNS over IPv6 and reaches only that
// address, and a `nodes` peer reached at the node's IPv6 address. Every
// probe must agree with `nftpolicy eval`, and eval with the verdicts
// written here for the IPv6 cases.
func TestRunScenarioDualStack(t *testing.T) {
	requireLab(t)
	runBothWays(t, "../kernel/testdata/dualstack.yaml", 0, func(t *testing.T, path string, want []evalLine) {
		for i, allowed := range map[int]bool{16: true, 17: false, 18: true, 19: false, 20: true, 21: false, 22: true, 23: false, 24: false} {
			if i >= len(want) || want[i].Allowed != allowed {
				t.Fatalf("test premise: probe %d of %s: eval %+v, want %s", i, filepath.Base(path), want[min(i, len(want)-1)], ct.VerdictWord(allowed))
			}
		}
	})
}
