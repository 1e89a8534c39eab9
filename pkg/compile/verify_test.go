package compile_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// verifyCfg samples 1% of the decisions to NFLOG group 9, with the deny
// log on (group 7): a sampled denial still goes through its deny chain.
var verifyCfg = compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7,
	Verify: compile.VerifyConfig{Group: 9, PerMillion: 10_000}}

var sampledRule = regexp.MustCompile(`(?m)^add rule inet nftpolicy (\S+) meta nfproto (ipv4|ipv6) (?:numgen random mod 1000000 < 10000 )?(.*)update @verify-sources-(v4|v6) \{ (ip|ip6) saddr limit rate \d+/second burst \d+ packets \} log prefix "(v[a-z0-9]+)" group 9 (.*)$`)

// Golden rendering with runtime verification on, and what every sampled
// copy must be: ahead of a rule with the same matches and verdict, keyed
// by its own family, with an id that the program resolves to a decision
// of the same verdict. (TestGolden shows the rulesets without it
// unchanged.)
func TestVerifyRendering(t *testing.T) {
	for _, name := range []string{"cluster-tiers", "egress-dualstack", "deny-and-allow"} {
		t.Run(name, func(t *testing.T) {
			path := "testdata/golden/" + name + ".yaml"
			prog := compile.Build(scenariotest.GoldenInput(t, path))
			dump := renderScenario(t, path, verifyCfg)
			checkGoldenFile(t, "testdata/golden/"+name+".hybrid-verify.nft", dump)
			checkSampledRules(t, prog, dump)
		})
	}
}

// checkGoldenFile compares a ruleset dump with its golden file, or with
// -update writes the file.
func checkGoldenFile(t *testing.T, golden, dump string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(dump), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if want, err := os.ReadFile(golden); err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	} else if diff := cmp.Diff(string(want), dump); diff != "" {
		t.Errorf("ruleset differs from %s (-want +got):\n%s", golden, diff)
	}
}

func checkSampledRules(t *testing.T, prog *compile.Program, dump string) {
	t.Helper()
	ids := compile.VerifyIDs(prog)
	lines := strings.Split(dump, "\n")
	kinds := map[string]bool{}
	n := 0
	for i, l := range lines {
		m := sampledRule.FindStringSubmatch(l)
		if m == nil {
			if strings.Contains(l, "@verify-sources") {
				t.Errorf("a sampled rule of an unexpected shape: %s", l)
			}
			continue
		}
		n++
		chain, fam, matches, meterFam, word, id, verdict := m[1], m[2], m[3], m[4], m[5], m[6], m[7]
		if (fam == "ipv4") != (meterFam == "v4") || (fam == "ipv4") != (word == "ip") {
			t.Errorf("family %s with the meter of %s (%s): %s", fam, meterFam, word, l)
		}
		// The copy is followed (after its other family's copy) by the
		// rule it samples.
		want := "add rule inet nftpolicy " + chain + " " + matches + verdict
		next := ""
		for _, x := range lines[i+1:] {
			if !sampledRule.MatchString(x) {
				next = x
				break
			}
		}
		if next != want {
			t.Errorf("sampled copy\n  %s\nis not followed by its rule\n  %s\nbut by\n  %s", l, want, next)
		}
		info, ok := ids[id]
		if !ok {
			t.Errorf("id %s of %s: not in VerifyIDs", id, l)
			continue
		}
		kinds[info.Kind+" "+info.Verdict()] = true
		deny := strings.Contains(verdict, "drop") || strings.Contains(verdict, "goto deny-")
		if deny == info.Allow {
			t.Errorf("id %s (%s) on a rule with verdict %q", id, info, verdict)
		}
	}
	if n == 0 {
		t.Fatal("no sampled rule")
	}
	t.Logf("%d sampled rules; decisions: %v", n, kinds)
}

// Every decision point the kernel path has in a scenario with both APIs
// is sampled: policy rules and default denies, ClusterNetworkPolicy
// rules, and the default allow.
func TestVerifySamplesEveryKind(t *testing.T) {
	path := "testdata/golden/cluster-tiers.yaml"
	prog := compile.Build(scenariotest.GoldenInput(t, path))
	dump := renderScenario(t, path, verifyCfg)
	ids := compile.VerifyIDs(prog)
	got := map[string]bool{}
	for _, m := range sampledRule.FindAllStringSubmatch(dump, -1) {
		info := ids[m[6]]
		got[info.Kind+" "+info.Verdict()+" "+info.Direction.String()] = true
	}
	for _, want := range []string{
		"NetworkPolicy allow ingress", "NetworkPolicy deny ingress",
		"ClusterNetworkPolicy allow egress", "ClusterNetworkPolicy deny egress", "ClusterNetworkPolicy deny ingress",
		"default allow egress", "default allow ingress",
	} {
		if !got[want] {
			t.Errorf("no sampled %s; sampled: %v", want, got)
		}
	}
}

// Every decision is sampled at 100%: no numgen.
func TestVerifyEverything(t *testing.T) {
	cfg := verifyCfg
	cfg.Verify.PerMillion = compile.VerifyPerMillion
	dump := renderScenario(t, "testdata/golden/cluster-tiers.yaml", cfg)
	if strings.Contains(dump, "numgen") {
		t.Error("numgen rendered at 100% sampling")
	}
	if !strings.Contains(dump, `log prefix "v`) {
		t.Error("no sample rendered at 100% sampling")
	}
}

func TestVerifyConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  compile.RenderConfig
		want string
	}{
		{"queue mode", compile.RenderConfig{Mode: compile.ModeQueue, Verify: compile.VerifyConfig{Group: 9, PerMillion: 1}}, "queue mode"},
		{"over one", compile.RenderConfig{Verify: compile.VerifyConfig{Group: 9, PerMillion: compile.VerifyPerMillion + 1}}, "at most"},
		{"deny log group", compile.RenderConfig{DenyLogGroup: 9, Verify: compile.VerifyConfig{Group: 9, PerMillion: 1}}, "deny log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compile.Render(&compile.Program{}, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestVerifyInfoString(t *testing.T) {
	for _, tc := range []struct {
		info compile.VerifyInfo
		want string
	}{
		{compile.VerifyInfo{Allow: true, Direction: compile.Ingress, Kind: compile.DenyKindNetworkPolicy, Policy: "x/a", Rule: "x/a ingress[0]"},
			"allow ingress by NetworkPolicy x/a ingress[0]"},
		{compile.VerifyInfo{Direction: compile.Ingress, Kind: compile.DenyKindNetworkPolicy, Policy: "x/a, x/b", Rule: compile.DenyRuleDefault},
			"deny ingress by NetworkPolicy x/a, x/b default deny"},
		{compile.VerifyInfo{Direction: compile.Egress, Kind: compile.DenyKindClusterNetworkPolicy, Policy: "guard", Tier: compile.TierAdmin, Rule: "no-y"},
			"deny egress by ClusterNetworkPolicy guard (Admin) rule no-y"},
		{compile.VerifyInfo{Allow: true, Direction: compile.Egress, Kind: compile.VerifyKindDefault}, "allow egress by default (no policy decides)"},
	} {
		if got := tc.info.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
