package compile

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PodInfo is what the compiler reads of a pod, parsed once: a sixth of a
// decoded Pod's memory. The agent's informer stores pods in this form
// (pkg/slim makes them), so a cluster's pods are held once, compactly, and
// builds parse nothing. Of the pod's metadata it keeps namespace, name,
// resourceVersion, labels and the creation and deletion times (which pod
// owns a reused address); its methods in podinfo_meta.go make it an object
// the informer's store can key, without holding a whole ObjectMeta.
type PodInfo struct {
	// Key is "namespace/name"; Name is the end of it (no copy of its own).
	Key       string
	Namespace string
	Name      string
	// ResourceVersion detects changes and makes the inputs' fingerprint.
	ResourceVersion   string
	Labels            map[string]string
	CreationTimestamp metav1.Time
	DeletionTimestamp *metav1.Time
	// Annotations is nil but for a watch's bookmark (pkg/slim).
	Annotations map[string]string
	Node        string
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
		ResourceVersion: p.ResourceVersion, Labels: p.Labels,
		CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		Node:     p.Spec.NodeName,
		Eligible: eligible(p),
	}
	pi.SetKey(p.Namespace, p.Name)
	if pi.Eligible {
		pi.IPs = podIPs(p)
		if len(pi.IPs) > 0 {
			pi.Ports = containerPorts(p)
		}
	}
	return pi
}

// SetKey sets Key, Namespace and Name; Name shares Key's bytes.
func (p *PodInfo) SetKey(namespace, name string) {
	p.Key = namespace + "/" + name
	p.Namespace, p.Name = namespace, p.Key[len(namespace)+1:]
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
	if p.DeletionTimestamp != nil {
		t := *p.DeletionTimestamp
		c.DeletionTimestamp = &t
	}
	c.IPs = append([]netip.Addr(nil), p.IPs...)
	return &c
}

// takesPart reports whether the pod can be selected or matched: eligible,
// with an address.
func (p *PodInfo) takesPart() bool { return p.Eligible && len(p.IPs) > 0 }
