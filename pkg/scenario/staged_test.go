package scenario_test

import (
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// stagedScenario stages x/deny-all by its own annotation and every
// NetworkPolicy of y by the namespace's; z's annotation is not "true".
const stagedScenario = `
namespaces:
  - {name: x}
  - {name: y, annotations: {nftpolicy.io/staged: "true"}}
  - {name: z, labels: {env: prod}, annotations: {nftpolicy.io/staged: "false", team: a}}
pods:
  - {namespace: x, name: a, ip: 10.244.1.1}
  - {namespace: y, name: a, ip: 10.244.1.2}
  - {namespace: z, name: a, ip: 10.244.1.3}
policies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, spec: {podSelector: {}, policyTypes: [Ingress]},
     metadata: {name: deny-all, namespace: x, annotations: {nftpolicy.io/staged: "true"}}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, spec: {podSelector: {}, policyTypes: [Ingress]},
     metadata: {name: deny-all, namespace: y}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, spec: {podSelector: {}, policyTypes: [Ingress]},
     metadata: {name: deny-all, namespace: z}}
probes: [{from: {pod: z/a}, to: {pod: x/a}, port: 80}, {from: {pod: z/a}, to: {pod: y/a}, port: 80},
  {from: {pod: x/a}, to: {pod: z/a}, port: 80}]
`

// TestStagedAnnotations: namespace and policy annotations are read, reach
// the compiler's input, and decide the verdicts.
func TestStagedAnnotations(t *testing.T) {
	s, err := scenario.Parse([]byte(stagedScenario))
	if err != nil {
		t.Fatal(err)
	}
	staged := map[string]bool{}
	for _, ns := range s.Input("", nil, nil).Namespaces {
		staged[ns.Name] = compile.Staged(ns)
	}
	if !staged["y"] || staged["x"] || staged["z"] {
		t.Errorf("staged namespaces in the input: %v, want y only", staged)
	}
	for i, want := range []bool{true, true, false} {
		if got := s.Decide()[i]; got.Allowed != want {
			t.Errorf("probe %d: allowed %v (%s), want %v", i, got.Allowed, got.Reason(), want)
		}
	}
}

func TestParseRejectsBadAnnotations(t *testing.T) {
	checkRejects(t, stagedScenario, []rejectCase{
		{"namespace annotation key", "team: a}", "te am: a}", `namespaces[2]: annotations: Invalid value: "te am"`},
		{"policy annotation key", "{name: deny-all, namespace: x, annotations: {", "{name: deny-all, namespace: x, annotations: {-bad: x, ",
			`policies[0] (x/deny-all): metadata.annotations: Invalid value: "-bad"`},
		{"unknown namespace field", "annotations: {nftpolicy.io/staged: \"true\"}}", "anotations: {nftpolicy.io/staged: \"true\"}}",
			`unknown field "namespaces[1].anotations"`},
	})
}
