package controller

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// slimPod keeps only what policies read: identity, labels, node, host
// network, container ports, phase and IPs. Informers hold every pod of the
// cluster, so this is most of the agent's memory.
func slimPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              p.Name,
			Namespace:         p.Namespace,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            p.Labels,
			CreationTimestamp: p.CreationTimestamp,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			NodeName:    p.Spec.NodeName,
			HostNetwork: p.Spec.HostNetwork,
		},
		Status: corev1.PodStatus{
			Phase:  p.Status.Phase,
			PodIP:  p.Status.PodIP,
			PodIPs: p.Status.PodIPs,
		},
	}
	keep := func(cs []corev1.Container, sidecars bool) []corev1.Container {
		var kept []corev1.Container
		for _, c := range cs {
			if len(c.Ports) == 0 {
				continue
			}
			if sidecars && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			kept = append(kept, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
		}
		return kept
	}
	out.Spec.Containers = keep(p.Spec.Containers, false)
	out.Spec.InitContainers = keep(p.Spec.InitContainers, true)
	return out
}

func slimNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta: ns.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:            ns.Name,
			UID:             ns.UID,
			ResourceVersion: ns.ResourceVersion,
			Labels:          ns.Labels,
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

// slimNode keeps what ClusterNetworkPolicy nodes peers read: labels and
// addresses. Everything else of a Node changes with every status heartbeat.
func slimNode(n *corev1.Node) *corev1.Node {
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:            n.Name,
			UID:             n.UID,
			ResourceVersion: n.ResourceVersion,
			Labels:          n.Labels,
		},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
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
	case *corev1.Node:
		return slimNode(o), nil
	}
	return obj, nil
}
