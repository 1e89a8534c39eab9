package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// kernelListing renders the scenario for node-1, loads the ruleset into the
// kernel of a scratch network namespace and returns `nft -j list table`.
func kernelListing(t *testing.T, prog *compile.Program, cfg compile.RenderConfig) []byte {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads the ruleset into a scratch network namespace's kernel")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary")
	}
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fake := knftables.NewFake(knftables.InetFamily, compile.TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("nftpolicy-trace-%d", rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	load := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	load.Stdin = strings.NewReader(fake.Dump())
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("loading the ruleset: %v: %s", err, out)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet", compile.TableName).Output()
	if err != nil {
		t.Fatalf("listing: %v", err)
	}
	return out
}

// TestTraceAgreesWithEvaluator traces connections between every pair of
// endpoints of the golden scenarios through the kernel's own listing of the
// rendered ruleset and checks the kernel verdict against the evaluator's.
func TestTraceAgreesWithEvaluator(t *testing.T) {
	for _, name := range []string{"deny-and-allow", "egress-dualstack", "deny-and-allow+cnp", "cluster-tiers"} {
		t.Run(name, func(t *testing.T) {
			file, withCNP := strings.CutSuffix(name, "+cnp")
			in := scenariotest.GoldenInput(t, "../../pkg/compile/testdata/golden/"+file+".yaml")
			if withCNP {
				x := ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x"))
				in.ClusterPolicies = append(in.ClusterPolicies,
					ct.CNP("x-guard", "Admin", 10, x,
						ct.CNPIngress(ct.CNPRule("pass-y", "Pass", ct.ToNamespaces(ct.Sel("team", "frontend"))), ct.CNPRule("no-pods", "Deny", ct.ToNamespaces(ct.Sel()))),
						ct.CNPEgress(ct.CNPRule("no-dns", "Deny", ct.ToNetworks("198.51.100.0/24")).On(ct.Proto("UDP", 53)), ct.CNPRule("web", "Accept", ct.ToNetworks("198.51.100.0/24")))),
					ct.CNP("closed", "Baseline", 100, x, ct.CNPEgress(ct.CNPRule("", "Deny", ct.ToNetworks("0.0.0.0/0", "::/0")))))
			}
			prog := compile.Build(in)
			if len(prog.Problems) > 0 {
				t.Fatalf("problems: %v", prog.Problems)
			}
			listing := kernelListing(t, prog, compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7, SkipUnknownPods: true})
			var addrs []netip.Addr
			for i := range prog.Pods {
				addrs = append(addrs, prog.Pods[i].IPs...)
			}
			for _, na := range prog.NodeAddrs {
				addrs = append(addrs, na...) // node-1's: the input hook
			}
			for _, a := range []string{"192.0.2.1", "192.0.2.70", "198.51.100.7", "2001:db8::1", "2001:db8:1::5"} {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			denied := 0
			for _, src := range addrs {
				for _, dst := range addrs {
					if src.Is4() != dst.Is4() {
						continue
					}
					for _, pp := range []struct {
						proto compile.Protocol
						port  uint16
					}{{compile.ProtoTCP, 80}, {compile.ProtoTCP, 8080}, {compile.ProtoTCP, 443}, {compile.ProtoUDP, 53}, {compile.ProtoSCTP, 80}} {
						tr, err := TraceRuleset(listing, src, dst, pp.proto, pp.port)
						if err != nil {
							t.Fatalf("%s -> %s: %v", src, dst, err)
						}
						v := evaluate.Evaluate(prog, src, dst, pp.proto, pp.port)
						if (tr.Verdict == "accept") != v.Allowed {
							t.Errorf("%s -> %s %s %d: kernel %s (%v), evaluator %v (%s)", src, dst, pp.proto, pp.port, tr.Verdict, tr.Steps, v.Allowed, v.Reason())
						}
						if tr.Verdict == "drop" {
							denied++
							if tr.DenyID == "" || tr.Comment == "" {
								t.Errorf("%s -> %s: a drop without its deny id or the deciding rule: %+v", src, dst, tr)
							}
						}
					}
				}
			}
			if denied == 0 {
				t.Error("no connection was denied: the comparison proves nothing")
			}
		})
	}
}

func TestExplainCommand(t *testing.T) {
	scenario := "../../pkg/compile/testdata/golden/deny-and-allow.yaml"
	var out, errb bytes.Buffer
	// Denied: exit 1, as kubectl auth can-i says no; --exit-code=false: 0.
	if code := run([]string{"explain", "--scenario", scenario, "y/client", "x/web", "--port", "81", "-o", "json"}, &out, &errb); code != exitFailure {
		t.Fatalf("exit %d, want %d: %s", code, exitFailure, errb.String())
	}
	var quiet bytes.Buffer
	if code := run([]string{"explain", "--scenario", scenario, "y/client", "x/web", "--port", "81", "--exit-code=false"}, &quiet, &errb); code != exitOK {
		t.Fatalf("--exit-code=false: exit %d: %s", code, errb.String())
	}
	var res struct {
		Allowed, Ingress, Egress bool
		Reason                   string
		NearestMiss              []evaluate.Miss
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Ingress || !res.Egress || !strings.Contains(res.Reason, "x/allow-web, x/default-deny isolate x/web") {
		t.Errorf("got %+v", res)
	}
	if len(res.NearestMiss) != 1 || res.NearestMiss[0].Condition != evaluate.CondPort || res.NearestMiss[0].Change.Port != 80 ||
		res.NearestMiss[0].Rule != "x/allow-web ingress[0]" {
		t.Errorf("nearest misses %+v; want x/allow-web ingress[0] on port 80", res.NearestMiss)
	}

	// YAML: the JSON's field names, the connection decided included.
	out.Reset()
	if code := run([]string{"explain", "--scenario", scenario, "y/client", "x/web", "--port", "81", "-o", "yaml"}, &out, &errb); code != exitFailure {
		t.Fatalf("-o yaml: exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"from: y/client\n", "to: x/web\n", "port: 81\n", "protocol: TCP\n", "allowed: false\n", "nearestMiss:\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-o yaml lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if code := run([]string{"explain", "--scenario", scenario, "y/client", "x/web", "--port", "8080"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "ALLOWED") || !strings.Contains(out.String(), "allowed by x/allow-web ingress[0]") {
		t.Errorf("text output:\n%s", out.String())
	}
	for _, args := range [][]string{
		{"y/client"},
		{"y/client", "x/nope"},
		{"y/client", "x/web", "--protocol", "ICMP"},
		{"y/client", "node:node-1"}, // scenarios give nodes no addresses
		{"y/client", "x/web", "-o", "wide"},
	} {
		errb.Reset()
		if code := run(append([]string{"explain", "--scenario", scenario}, args...), &out, &errb); code != exitBadInput || errb.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 with a message", args, code, errb.String())
		}
	}
}

// explainCode is explain's exit status for a verdict.
func explainCode(allowed bool) int {
	if allowed {
		return exitOK
	}
	return exitFailure
}

// TestExplainOutOfRange: a port outside 1-65535 or a timeout that is not
// positive is bad input (exit 2, the flag and its range named) before any
// scenario, cluster or ruleset is read, in each of explain's forms.
func TestExplainOutOfRange(t *testing.T) {
	scenario := "../../pkg/compile/testdata/golden/deny-and-allow.yaml"
	forms := map[string][]string{
		"scenario": {"--scenario", scenario, "y/client", "x/web"},
		"live":     {"--kubeconfig", "/nonexistent", "y/client", "x/web"},
		"ruleset":  {"--from-ruleset", "--ruleset-file", "/nonexistent", "10.0.0.1", "10.0.0.2"},
	}
	for form, base := range forms {
		for _, tc := range []struct{ flags, want []string }{
			{[]string{"--port", "0"}, []string{"--port 0", "1-65535"}},
			{[]string{"--port", "-1"}, []string{"--port -1", "1-65535"}},
			{[]string{"--port", "65536"}, []string{"--port 65536", "1-65535"}},
			{[]string{"--port", "70000"}, []string{"--port 70000", "1-65535"}},
			{[]string{"--timeout", "0s"}, []string{"--timeout 0s", "positive"}},
			{[]string{"--timeout", "-1s"}, []string{"--timeout -1s", "positive"}},
		} {
			var out, errb bytes.Buffer
			code := run(append(append([]string{"explain"}, base...), tc.flags...), &out, &errb)
			if code != exitBadInput {
				t.Errorf("%s %v: exit %d, want %d (stdout %q, stderr %q)", form, tc.flags, code, exitBadInput, out.String(), errb.String())
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("%s %v: stderr %q lacks %q", form, tc.flags, errb.String(), w)
				}
			}
		}
	}
	// The edges of the range are ports.
	for _, p := range []string{"1", "65535"} {
		var out, errb bytes.Buffer
		if code := run([]string{"explain", "--scenario", scenario, "y/client", "x/web", "--port", p, "--exit-code=false"}, &out, &errb); code != exitOK {
			t.Errorf("--port %s: exit %d: %s", p, code, errb.String())
		}
	}
}

// TestExplainBadRulesetFile: a --ruleset-file that does not exist or is
// not nft's JSON is bad input (exit 2), which a CI step can tell from a
// denial (1).
func TestExplainBadRulesetFile(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "garbage.json")
	if err := os.WriteFile(garbage, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(t.TempDir(), "missing.json"), garbage} {
		var out, errb bytes.Buffer
		code := run([]string{"explain", "--from-ruleset", "--ruleset-file", file, "10.0.0.1", "10.0.0.2"}, &out, &errb)
		if code != exitBadInput || errb.Len() == 0 {
			t.Errorf("%s: exit %d, stderr %q; want %d with a message", filepath.Base(file), code, errb.String(), exitBadInput)
		}
	}
}
