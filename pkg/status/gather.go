package status

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

// Agents says where the agents' pods are.
type Agents struct {
	Namespace string
	// Selector is a label selector of the agents' pods.
	Selector string
}

// DefaultAgents are install.yaml's.
var DefaultAgents = Agents{Namespace: "kube-system", Selector: "app.kubernetes.io/name=nftpolicy"}

// Clients are the API clients a status client needs.
type Clients struct {
	Kube    KubeClient
	Dynamic dynamic.Interface
	// Policy reads ClusterNetworkPolicies; nil when their API is not used.
	Policy npaclient.Interface
}

// KubeClient is what this package reads of the built-in APIs. A
// kubernetes.Interface is one; the kubectl plugin builds just these two
// groups' clients, which keeps the others' code out of its binary.
type KubeClient interface {
	CoreV1() corev1client.CoreV1Interface
	NetworkingV1() networkingv1client.NetworkingV1Interface
}

// Gather lists the agents' pods and the NodeEnforcements: two requests.
func Gather(ctx context.Context, c Clients, a Agents) (*Cluster, error) {
	pods, err := c.Kube.CoreV1().Pods(a.Namespace).List(ctx, metav1.ListOptions{LabelSelector: a.Selector})
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
	podPtrs := make([]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		podPtrs[i] = &pods.Items[i]
	}
	return assemble(podPtrs, reports)
}

// assemble joins the agents' pods and the NodeEnforcements by node.
func assemble(pods []*corev1.Pod, reports []*unstructured.Unstructured) (*Cluster, error) {
	byNode := map[string]*NodeView{}
	for node, p := range AgentPodsByNode(pods) {
		byNode[node] = &NodeView{Name: node, AgentPod: p.Namespace + "/" + p.Name, AgentReady: podReady(p)}
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
func AgentPodsByNode(pods []*corev1.Pod) map[string]*corev1.Pod {
	out := map[string]*corev1.Pod{}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		if cur, ok := out[p.Spec.NodeName]; !ok || podReady(p) && !podReady(cur) {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
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
	var meta metav1.Object
	switch ref.Kind {
	case KindNetworkPolicy:
		np, e := c.Kube.NetworkingV1().NetworkPolicies(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		meta, err = np, e
	case KindClusterNetworkPolicy:
		if c.Policy == nil {
			return t, false, fmt.Errorf("no client for ClusterNetworkPolicies")
		}
		cnp, e := c.Policy.PolicyV1beta1().ClusterNetworkPolicies().Get(ctx, ref.Name, metav1.GetOptions{})
		meta, err = cnp, e
	default:
		return t, false, fmt.Errorf("kind %q: want %s or %s", ref.Kind, KindNetworkPolicy, KindClusterNetworkPolicy)
	}
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
	opts := metav1.ListOptions{Limit: 1}
	if ref.Kind == KindClusterNetworkPolicy {
		l, err := c.Policy.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, opts)
		if err != nil {
			return "", err
		}
		return l.ResourceVersion, nil
	}
	l, err := c.Kube.NetworkingV1().NetworkPolicies(ref.Namespace).List(ctx, opts)
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}
