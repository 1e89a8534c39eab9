package cluster

import (
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// answeredScenario lets x/a reach TCP 80 of www.example.com only, which it
// resolved to y/web's address; every other pod is denied to it.
const answeredScenario = `
pods:
  - {namespace: x, name: a, ip: 10.244.1.10, node: node-1}
  - {namespace: y, name: web, ip: 10.244.2.10, node: node-2}
  - {namespace: y, name: other, ip: 10.244.2.11, node: node-2}
clusterNetworkPolicies:
  - {apiVersion: policy.networking.k8s.io/v1beta1, kind: ClusterNetworkPolicy, metadata: {name: by-name},
     spec: {tier: Admin, priority: 3, subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}, egress: [
       {name: www, action: Accept, to: [{domainNames: [www.example.com]}], protocols: [{tcp: {destinationPort: {number: 80}}}]},
       {name: pods, action: Deny, to: [{namespaces: {}}]}]}}
dnsAnswers:
  - {pod: x/a, name: www.example.com, ips: [10.244.2.10], ttl: 30}
probes:
  - {from: {pod: x/a}, to: {pod: y/web}, port: 80, protocol: TCP}
  - {from: {pod: x/a}, to: {pod: y/other}, port: 80, protocol: TCP}
  - {from: {pod: x/a}, to: {pod: y/web}, port: 81, protocol: TCP}
`

// TestScenarioCellsHonourDNSAnswers: ProbeScenario holds real packets to
// the scenario's verdicts, in which x/a reaches y/web through the name it
// resolved; an evaluator that ignored dnsAnswers would deny it.
func TestScenarioCellsHonourDNSAnswers(t *testing.T) {
	s, err := scenario.Parse([]byte(answeredScenario))
	if err != nil {
		t.Fatal(err)
	}
	cells, _, err := scenarioCells(s)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if cells[i].Eval != want {
			t.Errorf("probes[%d] %s -> %s: evaluator says %v (%s), want %v", i, cells[i].From, cells[i].To, cells[i].Eval, cells[i].Reason, want)
		}
	}
}
