package compile_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
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
	s, err := compile.ParseScenario([]byte(fqdnScenario))
	if err != nil {
		t.Fatal(err)
	}
	prog := compile.Build(s.Input("n1", nil, nil))
	if len(prog.Problems) != 0 {
		t.Fatalf("problems: %v", prog.Problems)
	}
	set4 := "admin-web-egress-0-fqdn-v4"
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
			if !hasRuleText(rs.Chains["admin-web-egress"], "ip saddr . ip daddr @"+set4+" counter goto egress-allowed") {
				t.Errorf("%s: no rule matches %s", mode, set4)
			}
		}
		_, capture := rs.Chains[compile.ChainDNS]
		if capture != (mode != compile.ModeKernel) {
			t.Errorf("%s: DNS capture chain present = %v", mode, capture)
		}
		if capture {
			first := rs.Chains[compile.ChainForward].Rules[0].Rule
			if !strings.Contains(first, "udp sport 53") || !strings.Contains(first, "@"+compile.SetFQDNPodsV4) {
				t.Errorf("%s: forward starts with %q, not the DNS capture", mode, first)
			}
			if rs.Chains[compile.ChainOutput] == nil || len(rs.Sets[compile.SetFQDNPodsV4].Elements) != 2 {
				t.Errorf("%s: no output capture or fqdn-pods element", mode)
			}
		}
	}

	seeds := compile.FQDNSeedElements(prog, s)
	if len(seeds[set4]) != 2 || seeds[set4][0].Addr != netip.MustParseAddr("192.0.2.1") || len(seeds["admin-web-egress-0-fqdn-v6"]) != 1 {
		t.Errorf("seeds: %+v (example.org does not match *.example.org)", seeds)
	}
	ra := compile.NewResolvedAnswers(s)
	ds := prog.ClusterPolicies[0].Egress[0].Domains
	if !ra.Resolved(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.1"), ds) || ra.Resolved(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.2"), ds) ||
		!ra.Resolved(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("192.0.2.3"), ds) {
		t.Errorf("ResolvedAnswers disagree with the patterns")
	}
}

func hasRuleText(c *compile.Chain, text string) bool {
	if c == nil {
		return false
	}
	for _, r := range c.Rules {
		if r.Rule == text {
			return true
		}
	}
	return false
}
