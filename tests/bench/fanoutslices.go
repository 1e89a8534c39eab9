package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// The podslices_ figures measure the publication docs/scale-out.md
// chooses, before it is built: compact objects of pod addresses and labels
// (one per group of pods that share their labels, as a Deployment's do),
// which every agent watches instead of every Pod, while it watches its own
// node's Pods directly. The section writes them itself, as the publisher
// would; the CustomResourceDefinition is the section's, not install.yaml's.

// podSliceCRD is a custom resource of the shape the design proposes:
// the pods' shared labels once, then each pod's name and addresses.
const podSliceCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: podaddressslices.nftpolicy.io
spec:
  group: nftpolicy.io
  scope: Namespaced
  names: {kind: PodAddressSlice, listKind: PodAddressSliceList, plural: podaddressslices, singular: podaddressslice}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [pods]
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          podLabels:
            type: object
            additionalProperties: {type: string}
          pods:
            type: array
            maxItems: 100
            x-kubernetes-list-type: atomic
            items:
              type: object
              required: [name, ips]
              properties:
                name: {type: string}
                ips: {type: array, maxItems: 2, x-kubernetes-list-type: atomic, items: {type: string}}
`

var podSliceGVR = schema.GroupVersionResource{Group: "nftpolicy.io", Version: "v1alpha1", Resource: "podaddressslices"}

// podSlicePublisher is the publisher's field manager.
const podSlicePublisher = "nftpolicy-publisher"

// installPodSlices applies the CustomResourceDefinition and waits until
// it is served.
func installPodSlices(tb *cluster.ProgramTB, env *kubeenv.Env) (dynamic.Interface, error) {
	path := filepath.Join(tb.TempDir(), "podaddressslices.yaml")
	if err := os.WriteFile(path, []byte(podSliceCRD), 0o644); err != nil {
		return nil, err
	}
	if out, err := env.Kubectl(tb, "apply", "-f", path); err != nil {
		return nil, fmt.Errorf("applying the PodAddressSlice CRD: %w: %s", err, out)
	}
	if out, err := env.Kubectl(tb, "wait", "--for=condition=Established", "--timeout=60s", "crd/podaddressslices.nftpolicy.io"); err != nil {
		return nil, fmt.Errorf("waiting for the PodAddressSlice CRD: %w: %s", err, out)
	}
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 1e6, 1e6
	return dynamic.NewForConfig(rc)
}

// podSliceWatches are an agent's watches in the design: the slices
// (JSON: a custom resource), its own node's pods, and the rest as today.
func podSliceWatches(node string) []watchRequest {
	return []watchRequest{
		{path: "/apis/nftpolicy.io/v1alpha1/podaddressslices", json: true},
		{path: "/api/v1/pods", fieldSelector: "spec.nodeName=" + node},
		{path: "/api/v1/namespaces"},
		{path: "/apis/networking.k8s.io/v1/networkpolicies"},
		{path: "/api/v1/nodes"},
	}
}

// podSlice is the slice of a Deployment's pods.
func podSlice(ns, name string, pods []*corev1.Pod) *unstructured.Unstructured {
	entries := make([]any, 0, len(pods))
	for _, p := range pods {
		entries = append(entries, map[string]any{"name": p.Name, "ips": []any{p.Status.PodIP}})
	}
	labels := map[string]any{}
	for k, v := range pods[0].Labels {
		labels[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nftpolicy.io/v1alpha1", "kind": "PodAddressSlice",
		"podLabels": labels, "pods": entries,
	}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(map[string]string{"nftpolicy.io/managed-by": podSlicePublisher})
	return u
}

// createPodSlices publishes the slices of Deployments first..first+len-1.
func (fx *fanoutCluster) createPodSlices(ctx context.Context, first int, pods []*corev1.Pod) error {
	if fx.dyn == nil {
		return nil
	}
	size := fx.cfg.SliceSize
	out := make([]*unstructured.Unstructured, len(pods)/size)
	err := parallel(ctx, len(out), 16, func(d int) error {
		ns, name := fx.deployment(first + d)
		u, err := fx.dyn.Resource(podSliceGVR).Namespace(ns).Create(ctx, podSlice(ns, name, pods[d*size:(d+1)*size]),
			metav1.CreateOptions{FieldManager: podSlicePublisher})
		out[d] = u
		return err
	})
	fx.podSlices = append(fx.podSlices, out...)
	return err
}

// changePodAndSlice is a pod change in the design: the kubelet's status
// write (seen by its node's agent only) and the publisher's rewrite of the
// pod's slice with the pod's new address (seen by every agent). Both
// writes for every change: the worst case, since a change that moves no
// address or label (most of a pod's status writes) writes no slice.
func (fx *fanoutCluster) changePodAndSlice(ctx context.Context, k int) error {
	if err := fx.changePod(ctx, k); err != nil {
		return err
	}
	i := (k % fx.cfg.Pods) / fx.cfg.SliceSize
	u := fx.podSlices[i].DeepCopy()
	pods, _, _ := unstructured.NestedSlice(u.Object, "pods")
	e := pods[k%len(pods)].(map[string]any)
	ip := fanoutPodIP(k % fx.cfg.Pods)
	if e["ips"].([]any)[0] == ip {
		ip = fanoutPodIP(fanoutTargetPods + k%fx.cfg.Pods) // the replacement pod's
	}
	e["ips"] = []any{ip}
	if err := unstructured.SetNestedSlice(u.Object, pods, "pods"); err != nil {
		return err
	}
	nu, err := fx.dyn.Resource(podSliceGVR).Namespace(u.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{FieldManager: podSlicePublisher})
	if err == nil {
		fx.podSlices[i] = nu
	}
	return err
}

// podSliceBytes is one slice's size as the API server sends it (JSON).
func (fx *fanoutCluster) podSliceBytes() int {
	if len(fx.podSlices) == 0 {
		return 0
	}
	b, _ := fx.podSlices[0].MarshalJSON()
	return len(b)
}
