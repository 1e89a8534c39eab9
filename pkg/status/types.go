package status

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The NodeEnforcement API (install.yaml declares its CustomResourceDefinition).
const (
	Group    = "nftpolicy.io"
	Version  = "v1alpha1"
	Kind     = "NodeEnforcement"
	Resource = "nodeenforcements"
)

// GVR is NodeEnforcement's group, version and resource.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// The policy kinds a NodeEnforcement reports on.
const (
	KindNetworkPolicy        = "NetworkPolicy"
	KindClusterNetworkPolicy = "ClusterNetworkPolicy"
)

// Bounds of a NodeEnforcement: it stays small (a few KiB) whatever the
// number of policies, so that a thousand nodes list in one request.
const (
	// MaxChanges is how many of its last policy changes a node reports.
	MaxChanges = 16
	// MaxProblems is how many policies with problems a node names.
	MaxProblems = 64
	// maxMessage bounds a problem's or a sync error's message.
	maxMessage = 512
)

// NodeEnforcement is one node's report of what its kernel enforces.
type NodeEnforcement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            NodeStatus `json:"status"`
}

// NodeStatus is what the node's agent last programmed. Every field is
// always written (null when empty), so that a merge patch of the whole
// status clears what is gone.
type NodeStatus struct {
	// AgentVersion is the version of the agent that wrote the status
	// (during a rollout, which nodes run which version).
	AgentVersion string `json:"agentVersion"`
	// Programmed holds, per kind, the resourceVersion through which every
	// change of that kind is in the node's kernel.
	Programmed Watermarks `json:"programmed"`
	// ProgrammedAt is when the last sync committed.
	ProgrammedAt *metav1.MicroTime `json:"programmedAt"`
	// SyncError is set while the agent's syncs fail: the kernel keeps the
	// last program that committed.
	SyncError *SyncError `json:"syncError"`
	// Changes are the node's last policy changes, oldest first.
	Changes []Change `json:"changes"`
	// Problems name the policies this node enforces fail-closed only
	// (invalid, unsupported or too large parts), at most MaxProblems;
	// ProblemsOmitted counts the others.
	Problems        []Problem `json:"problems"`
	ProblemsOmitted int       `json:"problemsOmitted"`
}

// Watermarks are resourceVersions per policy kind ("" when none seen).
type Watermarks struct {
	NetworkPolicies        string `json:"networkPolicies"`
	ClusterNetworkPolicies string `json:"clusterNetworkPolicies"`
}

// Of returns the watermark of a kind.
func (w Watermarks) Of(kind string) string {
	if kind == KindClusterNetworkPolicy {
		return w.ClusterNetworkPolicies
	}
	return w.NetworkPolicies
}

// PolicyRef names a policy; Namespace is empty for ClusterNetworkPolicies.
type PolicyRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// String is "NetworkPolicy ns/name" or "ClusterNetworkPolicy name".
func (r PolicyRef) String() string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// Change is a policy change the node programmed.
type Change struct {
	PolicyRef       `json:",inline"`
	ResourceVersion string `json:"resourceVersion"`
	Generation      int64  `json:"generation,omitempty"`
	Deleted         bool   `json:"deleted,omitempty"`
	// LatencyMicros is from the agent seeing the change to its commit.
	LatencyMicros int64            `json:"latencyMicros"`
	ProgrammedAt  metav1.MicroTime `json:"programmedAt"`
}

// Problem is a policy the node enforces fail-closed only.
type Problem struct {
	PolicyRef  `json:",inline"`
	Generation int64 `json:"generation,omitempty"`
	// Reason is the Event reason (InvalidNetworkPolicy, PolicyTooLarge...).
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// SyncError is a failing sync.
type SyncError struct {
	Since   metav1.MicroTime `json:"since"`
	Message string           `json:"message"`
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
