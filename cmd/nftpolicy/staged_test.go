package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// stagedScenario has staged policies of both APIs and a staged namespace
// (its header comment says which probe each policy would deny).
const stagedScenario = "../../tests/e2e/testdata/staged.yaml"

func TestEvalStaged(t *testing.T) {
	notIsolated := `"reason":"source not isolated for egress; destination not isolated for ingress"}`
	checkEval(t, stagedScenario, []string{
		`{"probe":0,"allowed":true,"ingress":true,"egress":true,` + notIsolated,
		`{"probe":1,"allowed":false,"ingress":false,"egress":true,"reason":"x/deny-b isolates x/b for ingress; no rule matched"}`,
		`{"probe":2,"allowed":true,"ingress":true,"egress":true,` + notIsolated,
		`{"probe":3,"allowed":false,"ingress":false,"egress":true,"reason":"denied by ClusterNetworkPolicy admin-deny-y-b (Admin, priority 5) ingress rule all"}`,
		`{"probe":4,"allowed":true,"ingress":true,"egress":true,` + notIsolated,
		`{"probe":5,"allowed":true,"ingress":true,"egress":true,` + notIsolated,
		`{"probe":6,"allowed":false,"ingress":false,"egress":true,"reason":"w/deny-a isolates w/a for ingress; no rule matched"}`,
	})
}

// TestCompileStaged: each node's ruleset is the one of the scenario
// without its staged policies, but for the staged log's copies of their
// subjects' packets (--staged-log=false here; on by default, as in the
// agent).
func TestCompileStaged(t *testing.T) {
	s, code := loadScenario(stagedScenario, os.Stderr)
	if s == nil {
		t.Fatalf("exit %d", code)
	}
	without := *s
	stagedNS := map[string]bool{}
	for _, ns := range s.Namespaces {
		stagedNS[ns.Name] = ns.Annotations[compile.StagedAnnotation] == "true"
	}
	without.Policies = nil
	for _, np := range s.Policies {
		if !stagedNS[np.Namespace] && np.Annotations[compile.StagedAnnotation] != "true" {
			without.Policies = append(without.Policies, np)
		}
	}
	without.ClusterNetworkPolicies = nil
	for _, cnp := range s.ClusterNetworkPolicies {
		if cnp.Annotations[compile.StagedAnnotation] != "true" {
			without.ClusterNetworkPolicies = append(without.ClusterNetworkPolicies, cnp)
		}
	}
	if len(without.Policies) != 2 || len(without.ClusterNetworkPolicies) != 1 {
		t.Fatalf("test premise: %d policies and %d cluster policies are not staged, want 2 and 1",
			len(without.Policies), len(without.ClusterNetworkPolicies))
	}
	data, err := yaml.Marshal(&without)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "without.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-1", "node-2"} {
		var got, want, errb bytes.Buffer
		if code := run([]string{"compile", "--scenario", stagedScenario, "--node", node, "--staged-log=false"}, &got, &errb); code != exitOK {
			t.Fatalf("exit %d, stderr: %s", code, errb.String())
		}
		if code := run([]string{"compile", "--scenario", path, "--node", node, "--staged-log=false"}, &want, &errb); code != exitOK {
			t.Fatalf("exit %d, stderr: %s", code, errb.String())
		}
		if got.String() != want.String() {
			t.Errorf("%s: the ruleset with staged policies differs from the one without them:\n%s", node, got.String())
		}
		if strings.Contains(got.String(), "admin-deny-z-a") {
			t.Errorf("%s: the ruleset names a staged ClusterNetworkPolicy", node)
		}
	}
}

func TestExplainStaged(t *testing.T) {
	for to, want := range map[string]string{"x/a": "ALLOWED", "x/b": "DENIED", "y/a": "ALLOWED", "z/a": "ALLOWED"} {
		var out, errb bytes.Buffer
		wantCode := exitOK
		if want == "DENIED" {
			wantCode = exitFailure
		}
		if code := run([]string{"explain", "--scenario", stagedScenario, "z/c", to}, &out, &errb); code != wantCode {
			t.Fatalf("exit %d, want %d: %s", code, wantCode, errb.String())
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain z/c %s: want %s:\n%s", to, want, out.String())
		}
	}
}

// TestExplainStagedVerdict: explain gives the verdict with the staged
// policies in force next to the enforced one, and nothing of the kind when
// no policy is staged.
func TestExplainStagedVerdict(t *testing.T) {
	explain := func(scenario, from, to string) ExplainResult {
		t.Helper()
		var out, errb bytes.Buffer
		code := run([]string{"explain", "--scenario", scenario, from, to, "--port", "80", "-o", "json"}, &out, &errb)
		var r ExplainResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("exit %d, stderr %s: %v", code, errb.String(), err)
		}
		if code != explainCode(r.Allowed) {
			t.Fatalf("allowed %v: exit %d, stderr: %s", r.Allowed, code, errb.String())
		}
		return r
	}
	r := explain(stagedScenario, "z/c", "x/a")
	if !r.Allowed || r.Staged == nil || r.Staged.Allowed || !strings.Contains(r.Staged.Reason, "x/deny-a") {
		t.Errorf("z/c -> x/a: allowed %v, staged %+v; want allowed, and denied by x/deny-a once staged policies are in force", r.Allowed, r.Staged)
	}
	r = explain(stagedScenario, "z/c", "w/a")
	if r.Allowed || r.Staged == nil || r.Staged.Allowed {
		t.Errorf("z/c -> w/a: allowed %v, staged %+v; want denied either way", r.Allowed, r.Staged)
	}
	if r := explain("testdata/cluster.yaml", "x/a", "x/b"); r.Staged != nil {
		t.Errorf("a scenario without staged policies: staged %+v, want none", r.Staged)
	}
}
