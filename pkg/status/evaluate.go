package status

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// NodeView is one node the agents' DaemonSet covers (it has an agent pod).
type NodeView struct {
	Name string
	// AgentPod is the agent's pod (namespace/name); AgentReady whether it
	// is Ready (during an update, whether one of the node's is).
	AgentPod   string
	AgentReady bool
	// Report is the node's NodeEnforcement status; nil when it has none.
	Report *NodeStatus
}

// Cluster is the nodes, sorted by name.
type Cluster struct {
	Nodes []NodeView
}

// Target is the version of a policy a client asks about.
type Target struct {
	Ref PolicyRef `json:"policy"`
	// ResourceVersion is the policy's; for a deletion, the deletion's, or
	// when unknown any later one (a list's).
	ResourceVersion string `json:"resourceVersion"`
	Generation      int64  `json:"generation,omitempty"`
	Deleted         bool   `json:"deleted,omitempty"`
}

// Lag is a node that does not enforce the target yet, and why.
type Lag struct {
	Node string `json:"node"`
	Why  string `json:"why"`
}

// Row is a policy's state across the nodes.
type Row struct {
	Target     `json:"target"`
	Nodes      int      `json:"nodes"`
	Programmed []string `json:"programmed"`
	Lagging    []Lag    `json:"lagging"`
	// Latency is the longest change-to-enforced latency the nodes report
	// for this version (0: none reports it any more).
	Latency  time.Duration `json:"latencyNanoseconds"`
	Warnings []string      `json:"warnings"`
}

// Done reports whether every covered node enforces the target.
func (r Row) Done() bool { return r.Nodes > 0 && len(r.Lagging) == 0 }

// Evaluate decides, for each node, whether it enforces the target.
func (c *Cluster) Evaluate(t Target) Row {
	if t.Deleted {
		t.ResourceVersion = c.deletionVersion(t)
	}
	row := Row{Target: t, Nodes: len(c.Nodes)}
	warnings := map[string][]string{}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		ok, why, latency := n.enforces(t)
		if !ok {
			row.Lagging = append(row.Lagging, Lag{Node: n.Name, Why: why})
			continue
		}
		row.Programmed = append(row.Programmed, n.Name)
		row.Latency = max(row.Latency, latency)
		if t.Deleted {
			continue
		}
		for _, p := range n.Report.Problems {
			if p.PolicyRef == t.Ref {
				w := p.Reason + ": " + p.Message
				warnings[w] = append(warnings[w], n.Name)
			}
		}
	}
	for w, nodes := range warnings {
		row.Warnings = append(row.Warnings, fmt.Sprintf("%s (%s)", w, nodeList(nodes)))
	}
	sort.Strings(row.Warnings)
	return row
}

// deletionVersion is the deletion's resourceVersion as a node reports it,
// else t's.
func (c *Cluster) deletionVersion(t Target) string {
	for _, n := range c.Nodes {
		if n.Report == nil {
			continue
		}
		for _, ch := range n.Report.Changes {
			if ch.Deleted && ch.PolicyRef == t.Ref && compareRV(ch.ResourceVersion, t.ResourceVersion) < 0 {
				return ch.ResourceVersion
			}
		}
	}
	return t.ResourceVersion
}

// enforces decides one node, with the latency it reports for the target.
func (n *NodeView) enforces(t Target) (bool, string, time.Duration) {
	switch {
	case n.AgentPod == "":
		return false, "no agent pod", 0
	case !n.AgentReady:
		return false, "agent pod " + n.AgentPod + " is not ready: the kernel keeps the program it had", 0
	case n.Report == nil:
		return false, "no NodeEnforcement yet (the agent has not committed its first sync)", 0
	}
	r := n.Report
	var latency time.Duration
	reported := false
	for _, ch := range r.Changes {
		if ch.PolicyRef == t.Ref && ch.Deleted == t.Deleted && (t.Deleted || ch.ResourceVersion == t.ResourceVersion) {
			reported, latency = true, time.Duration(ch.LatencyMicros)*time.Microsecond
		}
	}
	wm := r.Programmed.Of(t.Ref.Kind)
	if reported || compareRV(wm, t.ResourceVersion) >= 0 {
		return true, "", latency
	}
	what := "version"
	if t.Deleted {
		what = "deletion"
	}
	why := fmt.Sprintf("programs %ss through resourceVersion %s; the %s is at %s", t.Ref.Kind, orNone(wm), what, t.ResourceVersion)
	if e := r.SyncError; e != nil {
		why += fmt.Sprintf("; syncs failing since %s: %s", e.Since.UTC().Format(time.RFC3339), e.Message)
	}
	return false, why, 0
}

// compareRV compares resourceVersions; "" and malformed ones come first.
func compareRV(a, b string) int {
	if a == b {
		return 0
	}
	c, err := resourceversion.CompareResourceVersion(a, b)
	if err != nil {
		_, errA := resourceversion.CompareResourceVersion(a, a)
		if errA != nil {
			return -1
		}
		return 1
	}
	return c
}

func orNone(s string) string {
	if s == "" {
		return "(none yet)"
	}
	return s
}

// nodeList names up to three nodes and counts the rest.
func nodeList(nodes []string) string {
	sort.Strings(nodes)
	if len(nodes) <= 3 {
		return strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(nodes[:3], ", "), len(nodes)-3)
}
