package compile

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PodInfo is what the compiler reads of a pod, parsed once: a fifth of a
// decoded Pod's memory. The agent's informer stores pods in this form (its
// transform makes them), so a cluster's pods are held once, compactly, and
// builds parse nothing. ObjectMeta keeps only namespace, name,
// resourceVersion, labels and the creation and deletion times (which pod
// owns a reused address); it also makes a PodInfo an object the informer's
// store can key.
type PodInfo struct {
	metav1.ObjectMeta
	// Key is "namespace/name".
	Key  string
	Node string
	// Eligible is false for host-network pods and pods in a terminal phase:
	// policies neither select them nor match them as pods.
	Eligible bool
	// IPs are the pod's addresses, IPv4 first, each once.
	IPs []netip.Addr
	// Ports are its container ports (and restartable init containers'),
	// in the order named ports resolve in.
	Ports []ContainerPort
}

// NewPodInfo reads a pod. Labels are shared with p, not copied.
func NewPodInfo(p *corev1.Pod) *PodInfo {
	pi := &PodInfo{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, ResourceVersion: p.ResourceVersion, Labels: p.Labels,
			CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp},
		Key:      p.Namespace + "/" + p.Name,
		Node:     p.Spec.NodeName,
		Eligible: eligible(p),
	}
	if pi.Eligible {
		pi.IPs = podIPs(p)
		if len(pi.IPs) > 0 {
			pi.Ports = containerPorts(p)
		}
	}
	return pi
}

// GetObjectKind makes a PodInfo a runtime.Object, which informers and
// watch events carry; it has no kind of its own.
func (p *PodInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the PodInfo. Its labels and ports stay shared: they
// are read-only once made (see pkg/slim).
func (p *PodInfo) DeepCopyObject() runtime.Object {
	if p == nil {
		return nil
	}
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.Labels = p.Labels
	c.IPs = append([]netip.Addr(nil), p.IPs...)
	return &c
}

// takesPart reports whether the pod can be selected or matched: eligible,
// with an address.
func (p *PodInfo) takesPart() bool { return p.Eligible && len(p.IPs) > 0 }
