package status

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// pod is a pod as the API server sends it (the dynamic client's form).
func pod(name, node string, labels map[string]any, deleting bool, conditions ...any) *unstructured.Unstructured {
	meta := map[string]any{"namespace": "kube-system", "name": name, "labels": labels}
	if deleting {
		meta["deletionTimestamp"] = "2026-01-02T03:04:05Z"
	}
	obj := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta,
		"spec": map[string]any{"nodeName": node}, "status": map[string]any{"phase": "Running", "conditions": conditions}}
	return &unstructured.Unstructured{Object: obj}
}

func cond(typ, status string) any { return map[string]any{"type": typ, "status": status} }

func fakeClients(objs ...runtime.Object) Clients {
	kinds := map[schema.GroupVersionResource]string{GVR: Kind + "List", PodsGVR: "PodList",
		NetworkPoliciesGVR: "NetworkPolicyList", ClusterNetworkPoliciesGVR: "ClusterNetworkPolicyList"}
	return Clients{Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds, objs...)}
}

// Gather reads the agents' pods through the dynamic client: a node's
// agent is ready only when its pod's Ready condition is True and it is not
// being deleted; of two pods on a node (a DaemonSet update) the ready one
// counts; pods of other labels and unscheduled pods are not agents.
func TestGatherAgentPods(t *testing.T) {
	agent := map[string]any{"app.kubernetes.io/name": "nftpolicy"}
	c := fakeClients(
		pod("old", "node-1", agent, false, cond("Ready", "False")),
		pod("new", "node-1", agent, false, cond("PodScheduled", "True"), cond("Ready", "True")),
		pod("going", "node-2", agent, true, cond("Ready", "True")),
		pod("starting", "node-3", agent, false),
		pod("pending", "", agent, false, cond("Ready", "True")),
		pod("other", "node-4", map[string]any{"app": "other"}, false, cond("Ready", "True")),
	)
	cl, err := Gather(context.Background(), c, DefaultAgents)
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeView{
		{Name: "node-1", AgentPod: "kube-system/new", AgentReady: true},
		{Name: "node-2", AgentPod: "kube-system/going"},
		{Name: "node-3", AgentPod: "kube-system/starting"},
	}
	if diff := cmp.Diff(want, cl.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
}

// Resolve reads a NetworkPolicy's or a ClusterNetworkPolicy's version
// through the dynamic client; a policy that does not exist is ErrNotFound.
func TestResolveDynamic(t *testing.T) {
	np := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": map[string]any{"namespace": "x", "name": "web", "resourceVersion": "41", "generation": int64(3)}}}
	cnp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "base", "resourceVersion": "52", "generation": int64(2)}}}
	c := fakeClients(np, cnp)
	ctx := context.Background()
	for _, tc := range []struct {
		ref        PolicyRef
		rv         string
		generation int64
	}{
		{PolicyRef{Kind: KindNetworkPolicy, Namespace: "x", Name: "web"}, "41", 3},
		{PolicyRef{Kind: KindClusterNetworkPolicy, Name: "base"}, "52", 2},
	} {
		got, exists, err := Resolve(ctx, c, tc.ref, false)
		if err != nil || !exists || got.ResourceVersion != tc.rv || got.Generation != tc.generation {
			t.Errorf("%s: %+v exists %v err %v, want resourceVersion %s generation %d", tc.ref, got, exists, err, tc.rv, tc.generation)
		}
	}
	if _, _, err := Resolve(ctx, c, PolicyRef{Kind: KindNetworkPolicy, Namespace: "y", Name: "web"}, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("y/web: %v, want ErrNotFound", err)
	}
	if _, _, err := Resolve(ctx, c, PolicyRef{Kind: "Pod", Name: "web"}, false); err == nil {
		t.Error("kind Pod: no error")
	}
}
