package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exampleScenario is scenario-format.md's example (plus the pod y/b it uses).
const exampleScenario = "../../pkg/scenario/testdata/example.yaml"

// checkEval runs `nftpolicy eval` on a scenario and compares its lines.
func checkEval(t *testing.T, scenario string, want []string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run([]string{"eval", "--scenario", scenario}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr: %s", code, errb.String())
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i := range want {
		// The connection decided follows the verdict; TestEvalConnection
		// checks it, the callers the verdicts.
		verdict, _, ok := strings.Cut(got[i], `,"from":`)
		if !ok || verdict+"}" != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	if errb.Len() > 0 {
		t.Errorf("stderr: %s", errb.String())
	}
}

func TestEvalExample(t *testing.T) {
	want := []string{
		`{"probe":0,"allowed":false,"ingress":false,"egress":true,"reason":"x/deny-all isolates x/a for ingress; no rule matched"}`,
		`{"probe":1,"allowed":false,"ingress":false,"egress":true,"reason":"x/deny-all isolates x/a for ingress; no rule matched"}`,
		`{"probe":2,"allowed":true,"ingress":true,"egress":true,"reason":"source not isolated for egress; destination not isolated for ingress"}`,
	}
	checkEval(t, exampleScenario, want)
}

// Every format names the connection each probe decided.
func TestEvalConnection(t *testing.T) {
	for output, want := range map[string][]string{
		"json": {
			`"reason":"x/deny-all isolates x/a for ingress; no rule matched","from":"y/b","to":"x/a","protocol":"TCP","port":80}`,
			`"from":"192.0.2.10","to":"x/a","protocol":"UDP","port":81}`,
			`"from":"x/a","to":"198.51.100.20","protocol":"TCP","port":80}`,
		},
		"yaml": {"- allowed: false\n  egress: true\n  from: y/b\n", "  port: 81\n  probe: 1\n  protocol: UDP\n", "  to: 198.51.100.20\n"},
		"text": {"PROBE  FROM", "0      y/b         x/a            TCP       80    DENIED", "2      x/a         198.51.100.20  TCP       80    ALLOWED"},
	} {
		var out, errb bytes.Buffer
		if code := run([]string{"eval", "--scenario", exampleScenario, "-o", output}, &out, &errb); code != exitOK {
			t.Fatalf("-o %s: exit %d, stderr: %s", output, code, errb.String())
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("-o %s lacks %q:\n%s", output, w, out.String())
			}
		}
	}
}

func TestEvalBadScenario(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, content string
		// want is part of stderr.
		want string
	}{
		{"malformed YAML", "pods: [\n", "parsing"},
		{"unknown field", "pods: []\nprobez: []\n", `unknown field "probez"`},
		{"unknown pod", "probes:\n  - {from: {pod: x/a}, to: {ip: 192.0.2.1}, port: 80}\n", `unknown pod "x/a"`},
		{"rejected policy", `pods: [{namespace: x, name: a, ip: 10.244.1.1}]
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: p, namespace: x}
    spec:
      podSelector: {}
      egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/8]}}]}]
`, "spec.egress[0].to[0].ipBlock.except[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			if code := run([]string{"eval", "--scenario", path}, &out, &errb); code != exitBadInput {
				t.Errorf("exit %d, want %d", code, exitBadInput)
			}
			if out.Len() > 0 {
				t.Errorf("stdout not empty: %s", out.String())
			}
			msg := errb.String()
			if !strings.Contains(msg, path) || !strings.Contains(msg, "invalid scenario") || !strings.Contains(msg, c.want) {
				t.Errorf("stderr %q should name the file, say \"invalid scenario\" and mention %q", msg, c.want)
			}
		})
	}
}

func TestEvalUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"eval"}, {"eval", "--scenario", filepath.Join(t.TempDir(), "missing.yaml")}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != exitBadInput {
			t.Errorf("%q: exit %d, want %d", args, code, exitBadInput)
		}
		if errb.Len() == 0 {
			t.Errorf("%q: no message on stderr", args)
		}
	}
}

// KNOWN BUG (failing on purpose; reported, not fixed here): with
// pflag.ContinueOnError, pflag v1.1.0 prints neither the error nor the usage,
// and runEval returns exit status 2 without a word. runEval should print
// "nftpolicy eval: <err>" and call fs.Usage() before returning exitBadInput.
func TestEvalBadFlagExplains(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"eval", "--bogus"}, &out, &errb); code != exitBadInput {
		t.Errorf("exit %d, want %d", code, exitBadInput)
	}
	if !strings.Contains(errb.String(), "bogus") {
		t.Errorf("stderr %q does not name the unknown flag --bogus", errb.String())
	}
}
