package compile_test

import (
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

func TestDomainPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		match   []string
		noMatch []string
	}{
		{"kubernetes.io", []string{"kubernetes.io", "KUBERNETES.io"}, []string{"www.kubernetes.io", "my-kubernetes.io", "wikipedia.org"}},
		{"blog.kubernetes.io.", []string{"blog.kubernetes.io"}, []string{"www.kubernetes.io", "kubernetes.io"}},
		{"*.kubernetes.io", []string{"www.kubernetes.io", "blog.kubernetes.io", "latest.blog.kubernetes.io"}, []string{"kubernetes.io", "wikipedia.org", "xkubernetes.io"}},
	} {
		p, err := compile.ParseDomainPattern(tc.pattern)
		if err != nil {
			t.Fatalf("%s: %v", tc.pattern, err)
		}
		for _, n := range tc.match {
			if !p.Matches(compile.NormalizeDomain(n)) {
				t.Errorf("%s does not match %s", tc.pattern, n)
			}
		}
		for _, n := range tc.noMatch {
			if p.Matches(compile.NormalizeDomain(n)) {
				t.Errorf("%s matches %s", tc.pattern, n)
			}
		}
	}
	for _, bad := range []string{"com", "*", "*.com", "a.*.com", "www*.example.com", "-a.example.com", "exa mple.com", ""} {
		if _, err := compile.ParseDomainPattern(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

const fqdnScenario = `
pods:
  - {namespace: x, name: a, ips: [10.0.0.1, "fd00::1"], node: n1}
  - {namespace: x, name: b, ip: 10.0.0.2, node: n1}
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: web}
    spec:
      tier: Admin
      priority: 1
      subject: {namespaces: {}}
      egress:
        - {name: names, action: Accept, to: [{domainNames: [www.example.com, "*.example.org"]}]}
        - {name: rest, action: Deny, to: [{networks: [0.0.0.0/0]}]}
dnsAnswers:
  - {pod: x/a, name: www.example.com., ips: [192.0.2.1, "2001:db8::1"], ttl: 60}
  - {pod: x/a, name: example.org, ips: [192.0.2.2], ttl: 60}
  - {pod: x/b, name: a.example.org, ips: [192.0.2.3], ttl: 60}
`

func TestRenderFQDN(t *testing.T) {
	s, err := scenario.Parse([]byte(fqdnScenario))
	if err != nil {
		t.Fatal(err)
	}
	prog := compile.Build(s.Input("n1", nil, nil))
	if len(prog.Problems) != 0 {
		t.Fatalf("problems: %v", prog.Problems)
	}
	set4, set6 := compile.FQDNSetName(&prog.ClusterPolicies[0], 0, true), compile.FQDNSetName(&prog.ClusterPolicies[0], 0, false)
	if !strings.HasPrefix(set4, "admin-web-egress-0-fqdn-") || !strings.HasSuffix(set4, "-v4") || strings.TrimSuffix(set4, "-v4") != strings.TrimSuffix(set6, "-v6") {
		t.Errorf("learned sets %s and %s", set4, set6)
	}
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel, compile.ModeQueue} {
		rs, err := compile.Render(prog, compile.RenderConfig{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		fs := rs.Sets[set4]
		if (fs != nil) != (mode != compile.ModeQueue) {
			t.Errorf("%s: learned set present = %v", mode, fs != nil)
		}
		if fs != nil {
			if !fs.Dynamic || fs.Set.Type != "ipv4_addr . ipv4_addr" || len(fs.Set.Flags) != 1 || fs.Set.Flags[0] != "timeout" || len(fs.Elements) != 0 {
				t.Errorf("%s: %s = %+v %+v", mode, set4, fs, fs.Set)
			}
			if !hasRuleText(rs.Chains["admin-web-egress"], "ip saddr . ip daddr @"+set4+" counter goto ingress") {
				t.Errorf("%s: no rule matches %s", mode, set4)
			}
		}
		_, capture := rs.Chains[compile.ChainDNS]
		if capture != (mode != compile.ModeKernel) {
			t.Errorf("%s: DNS capture chain present = %v", mode, capture)
		}
		if capture {
			first := rs.Chains[compile.ChainForward].Rules[0].Text()
			if !strings.Contains(first, "udp sport 53") || !strings.Contains(first, "@"+compile.SetFQDNPodsV4) {
				t.Errorf("%s: forward starts with %q, not the DNS capture", mode, first)
			}
			if rs.Chains[compile.ChainOutput] == nil || len(rs.Sets[compile.SetFQDNPodsV4].Elements) != 2 {
				t.Errorf("%s: no output capture or fqdn-pods element", mode)
			}
		}
	}

}

func hasRuleText(c *compile.Chain, text string) bool {
	if c == nil {
		return false
	}
	for _, r := range c.Rules {
		if r.Text() == text {
			return true
		}
	}
	return false
}

// TestFQDNSetFollowsNames: the learned set is named after the rule's
// names, so that narrowing a rule replaces it (and what it learned for the
// removed names); spelling, order and duplicates do not change it.
func TestFQDNSetFollowsNames(t *testing.T) {
	build := func(names string) (*compile.Program, *compile.Ruleset) {
		t.Helper()
		s, err := scenario.Parse([]byte(strings.Replace(fqdnScenario, `[www.example.com, "*.example.org"]`, names, 1)))
		if err != nil {
			t.Fatal(err)
		}
		prog := compile.Build(s.Input("n1", nil, nil))
		if len(prog.Problems) != 0 {
			t.Fatalf("%s: problems: %v", names, prog.Problems)
		}
		rs, err := compile.Render(prog, compile.RenderConfig{Mode: compile.ModeHybrid})
		if err != nil {
			t.Fatal(err)
		}
		return prog, rs
	}
	setOf := func(names string) string {
		t.Helper()
		prog, rs := build(names)
		rules := prog.FQDNRules()
		if len(rules) != 1 {
			t.Fatalf("%s: %d domainNames rules", names, len(rules))
		}
		for _, v4 := range []bool{true, false} {
			set := rs.Sets[rules[0].Set(v4)]
			if set == nil || !set.Dynamic {
				t.Fatalf("%s: the ruleset has no learned set %s", names, rules[0].Set(v4))
			}
			if !strings.Contains(*set.Set.Comment, "www.example.com") && strings.Contains(names, "www") {
				t.Errorf("%s: the comment %q does not list the names", names, *set.Set.Comment)
			}
		}
		return rules[0].SetV4
	}
	both := setOf(`[www.example.com, "*.example.org"]`)
	for _, same := range []string{`["*.example.org", www.example.com]`, `[WWW.Example.COM., "*.example.org", www.example.com]`} {
		if got := setOf(same); got != both {
			t.Errorf("%s: set %s, want %s (the same names)", same, got, both)
		}
	}
	for _, other := range []string{`["*.example.org"]`, `[www.example.com]`, `[www.example.com, "*.example.org", api.example.com]`, `[www.example.com, example.org]`} {
		if got := setOf(other); got == both {
			t.Errorf("%s: set %s, the one of other names", other, got)
		}
	}
}
