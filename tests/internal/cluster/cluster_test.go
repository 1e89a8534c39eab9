package cluster_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}

// twoNodeScenario has a pod on each node per namespace, a named port, an ingress
// policy and an egress policy; its probes cover both nodes and both
// directions.
const twoNodeScenario = `
namespaces:
  - {name: web, labels: {team: web}}
  - {name: cli}
pods:
  - {namespace: web, name: api, labels: {app: api}, ip: 10.244.1.10, node: node-1, ports: [{name: http, port: 8080, protocol: TCP}]}
  - {namespace: web, name: db, labels: {app: db}, ip: 10.244.2.10, node: node-2, ports: [{port: 80}]}
  - {namespace: cli, name: one, labels: {app: cli}, ip: 10.244.2.20, node: node-2}
  - {namespace: cli, name: two, labels: {app: other}, ip: 10.244.1.20, node: node-1}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: api-from-cli, namespace: web}
    spec:
      podSelector: {matchLabels: {app: api}}
      ingress:
        - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: cli}}}]
          ports: [{port: http}]
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: two-egress, namespace: cli}
    spec:
      podSelector: {matchLabels: {app: other}}
      policyTypes: [Egress]
      egress:
        - to: [{namespaceSelector: {matchLabels: {team: web}}, podSelector: {matchLabels: {app: db}}}]
probes:
  - {from: {pod: cli/one}, to: {pod: web/api}, port: 8080}
  - {from: {pod: cli/two}, to: {pod: web/api}, port: 8080}
  - {from: {pod: web/db}, to: {pod: web/api}, port: 8080}
  - {from: {pod: cli/one}, to: {pod: web/api}, port: 80}
  - {from: {pod: cli/two}, to: {pod: web/db}, port: 80}
  - {from: {pod: cli/two}, to: {pod: cli/one}, port: 80}
  - {from: {pod: cli/one}, to: {pod: cli/two}, port: 80}
`

// TestScenario applies a scenario through the API to real agents and checks
// its probes, and the all-pairs matrix, against the evaluator.
func TestScenario(t *testing.T) {
	s, err := scenario.Parse([]byte(twoNodeScenario))
	if err != nil {
		t.Fatal(err)
	}
	c := cluster.Start(t, cluster.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.ApplyScenario(ctx, s); err != nil {
		t.Fatal(err)
	}
	waited, err := c.WaitProgrammed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("programmed after %v", waited)
	cells, err := c.ProbeScenario(ctx, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, false, false, false, true, false, true}
	for i, cell := range cells {
		if cell.Mismatch() {
			t.Errorf("probes[%d] %s -> %s: kernel %v (%s), eval %v (%s), err %v", i, cell.From, cell.To, cell.Kernel, cell.Detail, cell.Eval, cell.Reason, cell.Err)
		}
		if cell.Eval != want[i] {
			t.Errorf("probes[%d] %s -> %s: evaluator says %v, the scenario was written for %v: %s", i, cell.From, cell.To, cell.Eval, want[i], cell.Reason)
		}
	}
	m, err := c.Verify(ctx, cluster.ProbeOptions{Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("80/TCP:\n%s", m.Grid())
}
