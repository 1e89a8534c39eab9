package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ct "github.com/ti-mo/conntrack"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack/conntracktest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

const (
	srvIP = "10.244.1.10" // x/srv, on n1 (this node)
	c1IP  = "10.244.2.10" // y/c1, role=client, on n2
	c2IP  = "10.244.2.11" // y/c2, role=server, on n2
)

// previewInput: x/srv with x/allow admitting role=client pods.
func previewInput() compile.Input {
	pod := func(ns, name, ip, node, role string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"role": role}},
			Spec:   corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "allow"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}, NamespaceSelector: &metav1.LabelSelector{}}}}}}}
	return compile.Input{NodeName: "n1",
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, {ObjectMeta: metav1.ObjectMeta{Name: "y"}}},
		Pods:       []*corev1.Pod{pod("x", "srv", srvIP, "n1", ""), pod("y", "c1", c1IP, "n2", "client"), pod("y", "c2", c2IP, "n2", "server")},
		Policies:   []*networkingv1.NetworkPolicy{allow}}
}

const allowServers = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: server}}}]}]
`

// TestPreviewServer asks an agent's preview server over its socket: a
// changed policy (replaced by namespace/name) cuts y/c1's connection and
// its ping (a protocol without ports, listed by addresses) and allows
// y/c2's, the deletion of the policy allows y/c2's and names a
// policy that does not exist, a staged version of the policy stops
// enforcing it (and is named), the listing is capped, nothing is deleted
// and nothing of the agent's inputs changes; the socket is mode 0600.
func TestPreviewServer(t *testing.T) {
	in := previewInput()
	cur := compile.Build(in)
	table := &conntracktest.Table{Flows: []ct.Flow{
		conntracktest.TCP(c1IP, srvIP, 40001, 80),
		conntracktest.TCP(c2IP, srvIP, 40002, 80),
		conntracktest.Echo(c1IP, srvIP, 7),
	}}
	eval := &evaluate.Evaluator{}
	eval.Swap(cur)
	socket := filepath.Join(t.TempDir(), "agent", "preview.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := previewServerOptions{socket: socket}
	o.start(ctx, &previewServer{node: "n1", snapshot: func() (compile.Input, error) { return in, nil },
		current: func() *compile.Program { return cur }, eval: eval, revoke: true, afterBuild: func() {},
		table: func() (conntrack.Table, func(), error) { return table, func() {}, nil }})
	fi, err := os.Stat(socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, mode %v", err, fi.Mode())
	}

	for _, tc := range []struct {
		name     string
		req      previewRequest
		want     string
		wantRows int
	}{
		{"changed", previewRequest{Manifest: allowServers, Namespace: "x"}, `node n1: 2 would cut, 1 would allow (pod addresses affected: 1, conntrack entries read: 3, X)
  would cut    ICMP 10.244.2.10 -> 10.244.1.10  x/allow: x/allow isolates x/srv for ingress; no rule matched
  would cut    TCP 10.244.2.10:40001 -> 10.244.1.10:80  x/allow: x/allow isolates x/srv for ingress; no rule matched
  would allow  TCP 10.244.2.11:40002 -> 10.244.1.10:80  allowed by x/allow ingress[0]
`, 3},
		{"deleted", previewRequest{Manifest: allowServers + "---\n" + strings.Replace(allowServers, "name: allow", "name: missing", 1), Namespace: "x", Delete: true},
			`node n1: 0 would cut, 1 would allow (pod addresses affected: 1, conntrack entries read: 3, X)
  would allow  TCP 10.244.2.11:40002 -> 10.244.1.10:80  destination not isolated for ingress
  warning: networkpolicy x/missing: not found; nothing to delete
`, 1},
		{"staged", previewRequest{Manifest: strings.Replace(allowServers, "metadata: {name: allow}", "metadata: {name: allow, annotations: {nftpolicy.io/staged: \"true\"}}", 1), Namespace: "x"},
			`node n1: 0 would cut, 1 would allow (pod addresses affected: 1, conntrack entries read: 3, X)
  would allow  TCP 10.244.2.11:40002 -> 10.244.1.10:80  destination not isolated for ingress
  warning: networkpolicy x/allow is staged (nftpolicy.io/staged): logged, not enforced (an enforced version it replaces stops being enforced)
`, 1},
		{"capped", previewRequest{Manifest: allowServers, Namespace: "x", MaxFlows: 1}, `node n1: 2 would cut, 1 would allow (pod addresses affected: 1, conntrack entries read: 3, X)
  would cut    TCP 10.244.2.10:40001 -> 10.244.1.10:80  x/allow: x/allow isolates x/srv for ingress; no rule matched
  and 2 more
`, 1},
	} {
		res, err := askPreview(ctx, socket, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		res.DurationSeconds = 0
		var out bytes.Buffer
		if err := printPreview(&out, []PreviewResult{*res}, "text"); err != nil {
			t.Fatal(err)
		}
		if got := strings.Replace(out.String(), ", 0s)", ", X)", 1); got != tc.want || len(res.Flows) != tc.wantRows {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
	if len(table.Deleted) != 0 {
		t.Errorf("preview deleted %v", table.Deleted)
	}
	if len(in.Policies) != 1 || in.Policies[0].Spec.Ingress[0].From[0].PodSelector.MatchLabels["role"] != "client" {
		t.Errorf("the agent's inputs changed: %+v", in.Policies)
	}
	if _, err := askPreview(ctx, socket, previewRequest{Manifest: "kind: Pod\n", Namespace: "x"}); err == nil || !strings.Contains(err.Error(), `kind "Pod"`) {
		t.Errorf("a Pod manifest: %v", err)
	}
}
