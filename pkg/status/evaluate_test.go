package status

import (
	"strings"
	"testing"
	"time"
)

// TestEvaluate is the truth table of a node's verdict on a target.
func TestEvaluate(t *testing.T) {
	np := PolicyRef{Kind: KindNetworkPolicy, Namespace: "x", Name: "deny"}
	other := PolicyRef{Kind: KindNetworkPolicy, Namespace: "x", Name: "other"}
	report := func(wm string, changes ...Change) *NodeStatus {
		return &NodeStatus{Programmed: Watermarks{NetworkPolicies: wm, ClusterNetworkPolicies: "999"}, Changes: changes}
	}
	ready := func(name string, r *NodeStatus) NodeView {
		return NodeView{Name: name, AgentPod: "kube-system/nftpolicy-" + name, AgentReady: true, Report: r}
	}
	failing := report("90")
	failing.SyncError = &SyncError{Message: "nft: no space left"}
	withProblem := report("200")
	withProblem.Problems = []Problem{{PolicyRef: np, Reason: "InvalidNetworkPolicy", Message: "bad port"}}
	cases := []struct {
		name     string
		node     NodeView
		target   Target
		want     bool
		whyHas   string
		warnings int
	}{
		{"watermark at the version", ready("n", report("100")), Target{Ref: np, ResourceVersion: "100"}, true, "", 0},
		{"watermark past the version", ready("n", report("150")), Target{Ref: np, ResourceVersion: "100"}, true, "", 0},
		{"watermark before the version", ready("n", report("99")), Target{Ref: np, ResourceVersion: "100"}, false, "through resourceVersion 99", 0},
		{"longer resourceVersion is later", ready("n", report("99")), Target{Ref: np, ResourceVersion: "1000"}, false, "at 1000", 0},
		{"other kind's watermark does not count", ready("n", report("1")), Target{Ref: np, ResourceVersion: "500"}, false, "", 0},
		{"no watermark yet", ready("n", report("")), Target{Ref: np, ResourceVersion: "5"}, false, "(none yet)", 0},
		{"agent not ready", NodeView{Name: "n", AgentPod: "kube-system/a", Report: report("150")}, Target{Ref: np, ResourceVersion: "100"}, false, "not ready", 0},
		{"no report", ready("n", nil), Target{Ref: np, ResourceVersion: "100"}, false, "no NodeEnforcement", 0},
		{"failing syncs named", ready("n", failing), Target{Ref: np, ResourceVersion: "100"}, false, "no space left", 0},
		{"problem is a warning", ready("n", withProblem), Target{Ref: np, ResourceVersion: "100"}, true, "", 1},
		{"reported change of this version", ready("n", report("90", Change{PolicyRef: np, ResourceVersion: "100", LatencyMicros: 3000})), Target{Ref: np, ResourceVersion: "100"}, true, "", 0},
		{"reported change of another policy", ready("n", report("90", Change{PolicyRef: other, ResourceVersion: "100"})), Target{Ref: np, ResourceVersion: "100"}, false, "", 0},
		{"deletion reported", ready("n", report("90", Change{PolicyRef: np, ResourceVersion: "120", Deleted: true})), Target{Ref: np, ResourceVersion: "300", Deleted: true}, true, "", 0},
		{"deletion past the watermark", ready("n", report("90")), Target{Ref: np, ResourceVersion: "120", Deleted: true}, false, "the deletion is at 120", 0},
		{"deletion within the watermark", ready("n", report("130")), Target{Ref: np, ResourceVersion: "120", Deleted: true}, true, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := &Cluster{Nodes: []NodeView{c.node}}
			row := cl.Evaluate(c.target)
			if row.Done() != c.want {
				t.Fatalf("Done = %v, want %v: %+v", row.Done(), c.want, row)
			}
			if !c.want && !strings.Contains(row.Lagging[0].Why, c.whyHas) {
				t.Errorf("why = %q, want it to contain %q", row.Lagging[0].Why, c.whyHas)
			}
			if len(row.Warnings) != c.warnings {
				t.Errorf("warnings = %q, want %d", row.Warnings, c.warnings)
			}
		})
	}
}

// TestEvaluateDeletionVersion: a deletion known only by a later list
// version takes the version a node reports for it, so a node whose
// watermark passed the deletion is done even before it reports it.
func TestEvaluateDeletionVersion(t *testing.T) {
	np := PolicyRef{Kind: KindNetworkPolicy, Namespace: "x", Name: "deny"}
	cl := &Cluster{Nodes: []NodeView{
		{Name: "a", AgentPod: "p/a", AgentReady: true, Report: &NodeStatus{Programmed: Watermarks{NetworkPolicies: "120"},
			Changes: []Change{{PolicyRef: np, ResourceVersion: "120", Deleted: true, LatencyMicros: 2000}}}},
		{Name: "b", AgentPod: "p/b", AgentReady: true, Report: &NodeStatus{Programmed: Watermarks{NetworkPolicies: "125"}}},
		{Name: "c", AgentPod: "p/c", AgentReady: true, Report: &NodeStatus{Programmed: Watermarks{NetworkPolicies: "110"}}},
	}}
	row := cl.Evaluate(Target{Ref: np, ResourceVersion: "400", Deleted: true})
	if len(row.Programmed) != 2 || len(row.Lagging) != 1 || row.Lagging[0].Node != "c" {
		t.Fatalf("row = %+v, want a and b done, c lagging", row)
	}
	if row.Latency != 2*time.Millisecond {
		t.Errorf("latency = %v, want 2ms", row.Latency)
	}
}
