package status

import (
	"context"
	"errors"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Agents says where the agents' pods are.
type Agents struct {
	Namespace string
	// Selector is a label selector of the agents' pods.
	Selector string
}

// DefaultAgents are install.yaml's.
var DefaultAgents = Agents{Namespace: "kube-system", Selector: "app.kubernetes.io/name=nftpolicy"}

// The resources a status client reads besides NodeEnforcements.
var (
	PodsGVR                   = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	NetworkPoliciesGVR        = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	ClusterNetworkPoliciesGVR = schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies"}
)

// Clients are the API clients a status client needs. Everything is read
// through the dynamic client: the typed clientsets link every API group's
// types and would make the kubectl plugin three times its size, for the
// handful of fields (names, versions, a pod's node and readiness) that
// status needs.
type Clients struct {
	Dynamic dynamic.Interface
}

// policies is the dynamic client of ref's kind (NetworkPolicies of its
// namespace, or ClusterNetworkPolicies).
func (c Clients) policies(ref PolicyRef) (dynamic.ResourceInterface, error) {
	switch ref.Kind {
	case KindNetworkPolicy:
		return c.Dynamic.Resource(NetworkPoliciesGVR).Namespace(ref.Namespace), nil
	case KindClusterNetworkPolicy:
		return c.Dynamic.Resource(ClusterNetworkPoliciesGVR), nil
	}
	return nil, fmt.Errorf("kind %q: want %s or %s", ref.Kind, KindNetworkPolicy, KindClusterNetworkPolicy)
}

// AgentPod is what status reads of an agent's pod.
type AgentPod struct {
	Namespace, Name string
	// Node is the pod's spec.nodeName ("" while unscheduled).
	Node string
	// Phase is status.phase (Running, Pending, ...).
	Phase string
	// Ready: the pod's Ready condition is True and it is not being deleted.
	Ready bool
}

// AgentPodOf reads a pod (as the dynamic client returns it, or a typed
// pod converted with runtime.DefaultUnstructuredConverter).
func AgentPodOf(u *unstructured.Unstructured) AgentPod {
	p := AgentPod{Namespace: u.GetNamespace(), Name: u.GetName()}
	p.Node, _, _ = unstructured.NestedString(u.Object, "spec", "nodeName")
	p.Phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
	if u.GetDeletionTimestamp() != nil {
		return p
	}
	conds, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "conditions")
	list, _ := conds.([]any)
	for _, c := range list {
		m, _ := c.(map[string]any)
		if t, _ := m["type"].(string); t == "Ready" {
			s, _ := m["status"].(string)
			p.Ready = s == "True"
			break
		}
	}
	return p
}

// Gather lists the agents' pods and the NodeEnforcements: two requests.
func Gather(ctx context.Context, c Clients, a Agents) (*Cluster, error) {
	pods, err := c.Dynamic.Resource(PodsGVR).Namespace(a.Namespace).List(ctx, metav1.ListOptions{LabelSelector: a.Selector})
	if err != nil {
		return nil, fmt.Errorf("listing the agents' pods: %w", err)
	}
	list, err := c.Dynamic.Resource(GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing NodeEnforcements (is install.yaml's CustomResourceDefinition installed?): %w", err)
	}
	reports := make([]*unstructured.Unstructured, len(list.Items))
	for i := range list.Items {
		reports[i] = &list.Items[i]
	}
	agentPods := make([]AgentPod, len(pods.Items))
	for i := range pods.Items {
		agentPods[i] = AgentPodOf(&pods.Items[i])
	}
	return assemble(agentPods, reports)
}

// assemble joins the agents' pods and the NodeEnforcements by node.
func assemble(pods []AgentPod, reports []*unstructured.Unstructured) (*Cluster, error) {
	byNode := map[string]*NodeView{}
	for node, p := range AgentPodsByNode(pods) {
		byNode[node] = &NodeView{Name: node, AgentPod: p.Namespace + "/" + p.Name, AgentReady: p.Ready}
	}
	for _, u := range reports {
		n := byNode[u.GetName()]
		if n == nil {
			continue // no agent pod: not covered
		}
		ne, err := FromUnstructured(u)
		if err != nil {
			return nil, err
		}
		n.Report = &ne.Status
	}
	c := &Cluster{Nodes: make([]NodeView, 0, len(byNode))}
	for _, n := range byNode {
		c.Nodes = append(c.Nodes, *n)
	}
	sort.Slice(c.Nodes, func(i, j int) bool { return c.Nodes[i].Name < c.Nodes[j].Name })
	return c, nil
}

// AgentPodsByNode picks each node's agent pod among pods: the first
// ready one, else the first one (during a DaemonSet update a node has two,
// and the ready one is in charge).
func AgentPodsByNode(pods []AgentPod) map[string]AgentPod {
	out := map[string]AgentPod{}
	for _, p := range pods {
		if p.Node == "" {
			continue
		}
		if cur, ok := out[p.Node]; !ok || p.Ready && !cur.Ready {
			out[p.Node] = p
		}
	}
	return out
}

// ErrNotFound is Resolve's error for a policy that does not exist (and
// whose deletion is not what the caller waits for).
var ErrNotFound = errors.New("not found")

// Resolve returns the policy's current version (deleted false), or, for
// deleted true, its deletion: the policy's last version marked deleted
// when it still exists (Wait then watches it go), else a version at or
// after the deletion (a list's).
func Resolve(ctx context.Context, c Clients, ref PolicyRef, deleted bool) (t Target, exists bool, err error) {
	t = Target{Ref: ref, Deleted: deleted}
	res, err := c.policies(ref)
	if err != nil {
		return t, false, err
	}
	meta, err := res.Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		t.ResourceVersion, t.Generation = meta.GetResourceVersion(), meta.GetGeneration()
		return t, true, nil
	case !apierrors.IsNotFound(err):
		return t, false, err
	case !deleted:
		return t, false, fmt.Errorf("%s %w", ref, ErrNotFound)
	}
	t.ResourceVersion, err = listVersion(ctx, c, ref)
	return t, false, err
}

// listVersion is the resourceVersion of a list of the policy's kind: at
// or after any deletion that happened before it.
func listVersion(ctx context.Context, c Clients, ref PolicyRef) (string, error) {
	res, err := c.policies(ref)
	if err != nil {
		return "", err
	}
	l, err := res.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return "", err
	}
	return l.GetResourceVersion(), nil
}
