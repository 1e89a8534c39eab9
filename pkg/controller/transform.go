package controller

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The informers hold every pod of the cluster, so the stored pods are most
// of the agent's memory. The transform keeps only what the compiler reads,
// and interns the strings many pods repeat (namespace, node, label keys and
// values, port names), so that 50,000 pods with a few dozen distinct labels
// hold each of those strings once. unique.Make drops a string when no pod
// uses it any more.

// intern returns the canonical copy of s.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// internLabels copies a label map with interned keys and values; the
// decoded map and its strings become garbage.
func internLabels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[intern(k)] = intern(v)
	}
	return out
}

// slimPod keeps only what policies read: identity and resourceVersion (for
// change detection and the inputs fingerprint), labels, creation and
// deletion time (which pod owns a reused IP), node, host network, named
// container ports, phase and IPs.
//
// Container ports are kept only when named: numbered rules match the packet's
// port, and only named ports resolve against the pod. The ports of the
// containers and of the restartable init containers (sidecars) are kept in
// that order, the order named ports resolve in, in one container.
func slimPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              p.Name,
			Namespace:         intern(p.Namespace),
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            internLabels(p.Labels),
			CreationTimestamp: p.CreationTimestamp,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			NodeName:    intern(p.Spec.NodeName),
			HostNetwork: p.Spec.HostNetwork,
		},
		Status: corev1.PodStatus{
			Phase:  p.Status.Phase,
			PodIP:  p.Status.PodIP,
			PodIPs: append([]corev1.PodIP(nil), p.Status.PodIPs...),
		},
	}
	if len(out.Status.PodIPs) > 0 && out.Status.PodIPs[0].IP == out.Status.PodIP {
		out.Status.PodIP = out.Status.PodIPs[0].IP // one string for both
	}
	var ports []corev1.ContainerPort
	keep := func(cs []corev1.Container, sidecars bool) {
		for _, c := range cs {
			if sidecars && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, cp := range c.Ports {
				if cp.Name != "" {
					ports = append(ports, corev1.ContainerPort{Name: intern(cp.Name), ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
				}
			}
		}
	}
	keep(p.Spec.Containers, false)
	keep(p.Spec.InitContainers, true)
	if len(ports) > 0 {
		out.Spec.Containers = []corev1.Container{{Ports: ports[:len(ports):len(ports)]}}
	}
	return out
}

func slimNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta: ns.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:            intern(ns.Name),
			UID:             ns.UID,
			ResourceVersion: ns.ResourceVersion,
			Labels:          internLabels(ns.Labels),
		},
	}
}

// slimPolicy drops bookkeeping the compiler never reads. The informer owns
// the decoded object, so it is changed in place.
func slimPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	np.ManagedFields = nil
	np.Annotations = nil
	return np
}

// transform is the informers' transform: it runs before objects are stored.
func transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return slimPod(o), nil
	case *corev1.Namespace:
		return slimNamespace(o), nil
	case *networkingv1.NetworkPolicy:
		return slimPolicy(o), nil
	}
	return obj, nil
}
