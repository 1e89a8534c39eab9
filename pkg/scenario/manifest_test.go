package scenario_test

import (
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

const manifest = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-web}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
---
---
apiVersion: v1
kind: List
items:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: other, namespace: y}
    spec: {podSelector: {}}
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: admin}
    spec:
      tier: Admin
      priority: 1
      subject: {namespaces: {}}
      ingress: [{name: no, action: Deny, from: [{namespaces: {}}]}]
`

func TestParseManifest(t *testing.T) {
	m, err := scenario.ParseManifest([]byte(manifest), "x")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, np := range m.Policies {
		got = append(got, np.Namespace+"/"+np.Name)
	}
	if strings.Join(got, " ") != "x/deny-web y/other" || len(m.ClusterNetworkPolicies) != 1 || m.ClusterNetworkPolicies[0].Name != "admin" {
		t.Errorf("policies %v, cluster policies %+v", got, m.ClusterNetworkPolicies)
	}
	for _, tc := range []struct{ doc, want string }{
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", `document 0: kind "Pod"`},
		{"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podselector: {}}\n", `unknown field "spec.podselector"`},
		{"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}, policyTypes: [Sideways]}\n", "policies[0] (x/p)"},
		{"# nothing\n", "no NetworkPolicy or ClusterNetworkPolicy"},
	} {
		if _, err := scenario.ParseManifest([]byte(tc.doc), "x"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}
