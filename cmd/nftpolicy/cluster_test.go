package main

import (
	"bytes"
	"strings"
	"testing"
)

// clusterScenario exercises the scenario sections of ClusterNetworkPolicy:
// both tiers, Pass, a priority tie, nodes peers and node probe endpoints.
const clusterScenario = "testdata/cluster.yaml"

func TestEvalClusterNetworkPolicies(t *testing.T) {
	want := []string{
		// Admin Deny decides before the NetworkPolicy isolating y/b.
		`{"probe":0,"allowed":false,"ingress":false,"egress":false,"reason":"denied by ClusterNetworkPolicy admin-deny-y (Admin, priority 10) egress rule no-y"}`,
		// Admin Accept of egress (the tie at priority 10 goes to the name
		// admin-allow-dns); the destination's ingress still decides.
		`{"probe":1,"allowed":false,"ingress":false,"egress":true,"reason":"y/deny-ingress isolates y/b for ingress; no rule matched"}`,
		// Pass skips the Admin tier; NetworkPolicy allows a pod's own node.
		`{"probe":2,"allowed":true,"ingress":true,"egress":true,"reason":"traffic between a node and its own pods is always allowed; destination not isolated for ingress"}`,
		`{"probe":3,"allowed":true,"ingress":true,"egress":true,"reason":"allowed by x/allow-kubelet egress[0]; destination not isolated for ingress"}`,
		// Without a NetworkPolicy the Baseline tier decides, own node included.
		`{"probe":4,"allowed":false,"ingress":true,"egress":false,"reason":"denied by ClusterNetworkPolicy baseline (Baseline, priority 0) egress rule no-nodes"}`,
		`{"probe":5,"allowed":true,"ingress":true,"egress":true,"reason":"source not isolated for egress; traffic between a node and its own pods is always allowed"}`,
		// Another node is an ordinary address.
		`{"probe":6,"allowed":false,"ingress":false,"egress":true,"reason":"y/deny-ingress isolates y/b for ingress; no rule matched"}`,
		`{"probe":7,"allowed":false,"ingress":false,"egress":true,"reason":"denied by ClusterNetworkPolicy baseline (Baseline, priority 0) ingress rule not-from-y-to-x"}`,
		`{"probe":8,"allowed":false,"ingress":false,"egress":true,"reason":"denied by ClusterNetworkPolicy baseline (Baseline, priority 0) ingress rule not-from-y-to-x"}`,
	}
	checkEval(t, clusterScenario, want)
}

// The ruleset of node-1 knows its address from the scenario's nodes, the
// nodes peer's addresses, and decides pod-to-own-node traffic in the input hook.
func TestCompileClusterNetworkPolicies(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"compile", "--scenario", clusterScenario, "--node", "node-1"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr: %s", code, errb.String())
	}
	for _, want := range []string{
		`add element inet nftpolicy node-ips-v4 { 192.168.0.1 }`,
		`192.168.0.2 comment "node-2"`,
		`add chain inet nftpolicy admin-admin-deny-y-egress`,
		`add chain inet nftpolicy baseline-baseline-ingress`,
		`add chain inet nftpolicy input { type filter hook input`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	if errb.Len() > 0 {
		t.Errorf("stderr: %s", errb.String())
	}
}

func TestEvalRejectsInvalidClusterNetworkPolicy(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"eval", "--scenario", "testdata/cluster-invalid.yaml"}, &out, &errb)
	if code != exitBadInput {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitBadInput, errb.String())
	}
	if want := "clusterNetworkPolicies[0] (bad): spec.priority: 1001 out of range"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q lacks %q", errb.String(), want)
	}
	if out.Len() > 0 {
		t.Errorf("stdout: %s", out.String())
	}
}

// compile's bad input is exit 2 with the flag named: an unknown queue
// variant, and a node the scenario does not have (a typo would otherwise
// render a ruleset without the node's pods).
func TestCompileBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node", "node-1", "--queue-variant", "bogus"}, `--queue-variant "bogus": want native or xt-compat`},
		{[]string{"--node", "node2"}, `--node "node2": not a node of the scenario (node-1, node-2)`},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"compile", "--scenario", clusterScenario}, tc.args...), &out, &errb)
		if code != exitBadInput || !strings.Contains(errb.String(), tc.want) || out.Len() > 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %d bytes; want exit 2 and %q", tc.args, code, errb.String(), out.Len(), tc.want)
		}
	}
}
