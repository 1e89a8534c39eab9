package scenario_test

import (
	"net/netip"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// namesScenario allows egress to two name patterns only; the comments
// after the probes give their verdicts.
const namesScenario = `
pods:
  - {name: client, namespace: app, node: n1, ips: [10.1.0.1, "fd01::1"]}
  - {name: other, namespace: app, node: n1, ip: 10.1.0.2}
clusterNetworkPolicies:
  - {apiVersion: policy.networking.k8s.io/v1beta1, kind: ClusterNetworkPolicy, metadata: {name: names},
     spec: {tier: Admin, priority: 7, subject: {namespaces: {}}, egress: [
       {name: allowed-names, action: Accept, to: [{domainNames: [api.example.net, "*.cdn.example.net"]}]},
       {name: everything-else, action: Deny, to: [{networks: [0.0.0.0/0, "::/0"]}]}]}}
dnsAnswers:
  - {pod: app/client, name: api.example.net., ips: [203.0.113.1, "2001:db8::1"], ttl: 10}
  - {pod: app/client, name: cdn.example.net, ips: [203.0.113.2], ttl: 10}
  - {pod: app/other, name: img.cdn.example.net, ips: [203.0.113.3], ttl: 10}
probes:
  - {from: {pod: app/client}, to: {ip: 203.0.113.1}, port: 443}    # allowed: its answer
  - {from: {pod: app/client}, to: {ip: "2001:db8::1"}, port: 443}  # allowed: its IPv6 answer
  - {from: {pod: app/client}, to: {ip: 203.0.113.2}, port: 443}    # denied: cdn.example.net is not below itself
  - {from: {pod: app/other}, to: {ip: 203.0.113.3}, port: 443}     # allowed: its answer
  - {from: {pod: app/other}, to: {ip: 203.0.113.1}, port: 443}     # denied: another pod's answer
`

func TestDecideHonoursDNSAnswers(t *testing.T) {
	s, err := scenario.Parse([]byte(namesScenario))
	if err != nil {
		t.Fatal(err)
	}
	got := s.Decide()
	for i, want := range []bool{true, true, false, true, false} {
		if got[i].Allowed != want {
			t.Errorf("probes[%d]: %v (%s), want %v", i, got[i].Allowed, got[i].Reason(), want)
		}
	}
	// Without the answers every name peer matches nothing.
	s.DNSAnswers = nil
	for i, v := range s.Decide() {
		if v.Allowed {
			t.Errorf("without dnsAnswers, probes[%d] is allowed: %s", i, v.Reason())
		}
	}
}

// A probe whose addresses cannot be picked gets the zero verdict.
func TestDecideUnpickableProbe(t *testing.T) {
	s, err := scenario.Parse([]byte(namesScenario))
	if err != nil {
		t.Fatal(err)
	}
	s.Probes = append(s.Probes, scenario.Probe{From: scenario.Endpoint{Pod: "app/other"}, To: scenario.Endpoint{IP: "2001:db8::1"}, Port: 443})
	got := s.Decide()
	if len(got) != len(s.Probes) || got[len(got)-1] != (evaluate.Verdict{}) {
		t.Errorf("verdicts %+v", got)
	}
}

func TestFQDNSeedElements(t *testing.T) {
	s, err := scenario.Parse([]byte(namesScenario))
	if err != nil {
		t.Fatal(err)
	}
	prog := compile.Build(s.Input("n1", nil, nil))
	rules := prog.FQDNRules()
	if len(rules) != 1 {
		t.Fatalf("%d domainNames rules", len(rules))
	}
	seeds := scenario.FQDNSeedElements(prog, s)
	a := netip.MustParseAddr
	want4 := []scenario.SeedElement{{Pod: a("10.1.0.1"), Addr: a("203.0.113.1")}, {Pod: a("10.1.0.2"), Addr: a("203.0.113.3")}}
	want6 := []scenario.SeedElement{{Pod: a("fd01::1"), Addr: a("2001:db8::1")}}
	if got := seeds[rules[0].Set(true)]; !sameElements(got, want4) {
		t.Errorf("IPv4 seeds %v, want %v", got, want4)
	}
	if got := seeds[rules[0].Set(false)]; !sameElements(got, want6) {
		t.Errorf("IPv6 seeds %v, want %v", got, want6)
	}
	if len(seeds) != 2 {
		t.Errorf("seeds of %d sets: %v", len(seeds), seeds)
	}
	var none *scenario.ResolvedAnswers
	if none.Resolved(a("10.1.0.1"), a("203.0.113.1"), rules[0].Domains) {
		t.Error("nil ResolvedAnswers resolved something")
	}
}

func sameElements(a, b []scenario.SeedElement) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			found = found || x == y
		}
		if !found {
			return false
		}
	}
	return true
}
