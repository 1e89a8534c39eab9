// Package slim holds the compact forms in which the agent stores API
// objects: what the compiler reads and nothing else, with what many objects
// repeat shared. Pods, most of the agent's memory, reach this form either
// from a decoded corev1.Pod (Pod, the informers' Transform) or straight
// from the API server's protobuf watch stream (NewPodClient), without a
// corev1.Pod in between.
package slim

import (
	"slices"
	"strconv"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The informers hold every pod of the cluster, so the stored pods are most
// of the agent's memory. The transform keeps only what the compiler reads,
// and interns what many pods repeat: strings (namespace, node, label keys
// and values, port names), label maps and container port lists (the
// replicas of a workload have the same), so that 50,000 pods of a few
// hundred workloads hold each of those once. unique.Make drops a string
// when no pod uses it any more; shared values are bounded by generations.
// Informer objects are read-only (client-go's contract, and the compiler
// only reads them), so pods can share maps and slices.

// sharedValues keeps one copy of equal immutable values, by a key that
// spells the value. It holds two generations of at most limit entries: a
// value not asked for during a whole generation is forgotten (pods holding
// it keep it; later pods get a new copy), so the table stays bounded while
// label sets come and go with rollouts.
type sharedValues[V any] struct {
	mu        sync.Mutex
	cur, prev map[string]V
	limit     int
}

// get returns the shared value the key spells, built by build the first
// time. The key is read, not kept: callers spell it in a scratch buffer,
// and only a key not seen before is copied.
func (s *sharedValues[V]) get(key []byte, build func() V) V {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.cur[string(key)]; ok {
		return v
	}
	v, ok := s.prev[string(key)]
	if !ok {
		v = build()
	}
	if s.cur == nil || len(s.cur) >= s.limit {
		s.prev, s.cur = s.cur, make(map[string]V)
	}
	s.cur[intern(string(key))] = v
	return v
}

// sharedLimit bounds each generation of shared label maps and port lists.
const sharedLimit = 1 << 14

var (
	sharedLabels = sharedValues[map[string]string]{limit: sharedLimit}
	sharedPorts  = sharedValues[[]compile.ContainerPort]{limit: sharedLimit}
)

// intern returns the canonical copy of s.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// internLabels returns the shared copy of a label map, with interned keys
// and values; the decoded map and its strings become garbage. Its sharing
// key is spelled in a buffer on the stack for the usual few labels: a
// pod's decoding makes as little garbage as it can (every pod of the
// cluster passes here when the agent starts).
func internLabels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	var keyBuf [16]string
	keys := keyBuf[:0]
	for k := range in {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var buf [512]byte
	key := buf[:0]
	for _, k := range keys {
		key = appendField(key, k)
		key = appendField(key, in[k])
	}
	return sharedLabels.get(key, func() map[string]string {
		out := make(map[string]string, len(in))
		for k, v := range in {
			out[intern(k)] = intern(v)
		}
		return out
	})
}

// appendField appends a length-prefixed field to a sharing key, so that
// different values never spell the same key, whatever bytes they hold.
func appendField(key []byte, s string) []byte {
	key = strconv.AppendInt(key, int64(len(s)), 10)
	key = append(key, ':')
	return append(key, s...)
}

// sharedNamedPorts returns the shared copy of a pod's named ports (nil
// when there are none): numbered rules match the packet's port, only named
// ports resolve against the pod.
func sharedNamedPorts(ports []compile.ContainerPort) []compile.ContainerPort {
	var buf [256]byte
	key := buf[:0]
	n := 0
	for _, cp := range ports {
		if cp.Name == "" {
			continue
		}
		n++
		key = appendField(key, cp.Name)
		key = strconv.AppendInt(append(key, ':'), int64(cp.Port), 10)
		key = strconv.AppendInt(append(key, ':'), int64(cp.Protocol), 10)
		key = append(key, ';')
	}
	if n == 0 {
		return nil
	}
	return sharedPorts.get(key, func() []compile.ContainerPort {
		out := make([]compile.ContainerPort, 0, n)
		for _, cp := range ports {
			if cp.Name != "" {
				out = append(out, compile.ContainerPort{Name: intern(cp.Name), Protocol: cp.Protocol, Port: cp.Port})
			}
		}
		return out
	})
}

// Pod reads a pod into what the pod store holds: a compile.PodInfo,
// what policies read and nothing else (identity and resourceVersion for
// change detection and the inputs fingerprint, labels, creation and
// deletion time, node, addresses, named ports, in the order they resolve
// in), with what many pods repeat shared. A decoded Pod is about 1.2 KB
// before its strings, maps and slices; a PodInfo 192 bytes.
func Pod(p *corev1.Pod) *compile.PodInfo {
	pi := compile.NewPodInfo(p)
	pi.Namespace = intern(p.Namespace)
	pi.Labels = internLabels(p.Labels)
	pi.Node = intern(p.Spec.NodeName)
	pi.Ports = sharedNamedPorts(pi.Ports)
	return pi
}

// Namespace keeps a namespace's name, identity, labels and the staged
// annotation.
func Namespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta: ns.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:            intern(ns.Name),
			UID:             ns.UID,
			ResourceVersion: ns.ResourceVersion,
			Labels:          internLabels(ns.Labels),
			Annotations:     KeepStaged(ns.Annotations),
		},
	}
}

// Policy drops bookkeeping the compiler never reads. The informer owns
// the decoded object, so it is changed in place.
func Policy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	np.ManagedFields = nil
	np.Annotations = KeepStaged(np.Annotations)
	return np
}

// KeepStaged keeps, of an object's annotations, the one the
// compiler reads: compile.StagedAnnotation (nil without it).
func KeepStaged(a map[string]string) map[string]string {
	v, ok := a[compile.StagedAnnotation]
	if !ok {
		return nil
	}
	return map[string]string{compile.StagedAnnotation: v}
}

// Node keeps what ClusterNetworkPolicy nodes peers read, labels and
// addresses, and the pod ranges (spec.podCIDRs) unknown pods are recognized
// by. Everything else of a Node changes with every status heartbeat.
func Node(n *corev1.Node) *corev1.Node {
	return &corev1.Node{
		Spec:     corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
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

// Transform is the informers' transform: it runs before objects are
// stored. Tools that list objects themselves (`nftpolicy explain`) use it
// to see them as the agent does. Objects already slim pass through.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return Pod(o), nil
	case *corev1.Namespace:
		return Namespace(o), nil
	case *networkingv1.NetworkPolicy:
		return Policy(o), nil
	case *corev1.Node:
		return Node(o), nil
	}
	return obj, nil
}
