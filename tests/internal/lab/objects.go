package lab

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// The object methods below let a test edit the API objects the agents see
// directly, instead of applying a scenario: a pod's network namespace can
// come up before the agents know the pod, as when a CNI wires a pod faster
// than the informer delivers it, and each Publish plays one sync (compile,
// commit, publish, connection revocation) on every node.

// PodCIDR is the IPv4 pod range of the lab's i-th node (node-(i+1) of
// DefaultNodes), 10.244.(i+1).0/24.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
}

// PodCIDRv6 is the IPv6 pod range of the lab's i-th node,
// fd00:10:244:(i+1)::/64: the nodes are dual-stack, as the scenarios'
// pod addresses are.
func PodCIDRv6(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44, 0, byte(i + 1)}), 64)
}

// PodIP is the n-th address (n < 250) of node-(i+1)'s IPv4 pod range.
func PodIP(i, n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), byte(n + 2)}) }

// PodIPv6 is the n-th address of node-(i+1)'s IPv6 pod range, the
// counterpart of PodIP(i, n) for a dual-stack pod.
func PodIPv6(i, n int) netip.Addr {
	a := PodCIDRv6(i).Addr().As16()
	a[14], a[15] = byte((n+2)>>8), byte(n+2)
	return netip.AddrFrom16(a)
}

// objects are the API objects Publish compiles.
type objects struct {
	namespaces map[string]*corev1.Namespace
	pods       map[string]*corev1.Pod
	policies   map[string]*networkingv1.NetworkPolicy
	nodes      []*corev1.Node
}

func newObjects() objects {
	return objects{namespaces: map[string]*corev1.Namespace{}, pods: map[string]*corev1.Pod{},
		policies: map[string]*networkingv1.NetworkPolicy{}}
}

func (o *objects) addNode(name string, cidrs []netip.Prefix, ips []netip.Addr) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, c := range cidrs {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
	}
	for _, ip := range ips {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	o.nodes = append(o.nodes, node)
}

// Namespace adds or relabels a namespace (not published).
func (l *Lab) Namespace(name string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.objects.namespaces[name] = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// PodSpec is a pod whose API object the test writes.
type PodSpec struct {
	Namespace, Name string
	// Node indexes DefaultNodes.
	Node int
	IP   netip.Addr
	// IPv6, when valid, is the pod's second address: the pod is
	// dual-stack (IPv4 first in podIPs, as a CNI lists them).
	IPv6     netip.Addr
	Labels   map[string]string
	TCPPorts []uint16
	UDPPorts []uint16
}

// IPs are the pod's addresses, IPv4 first.
func (p PodSpec) IPs() []netip.Addr {
	if p.IPv6.IsValid() {
		return []netip.Addr{p.IP, p.IPv6}
	}
	return []netip.Addr{p.IP}
}

// Key is the pod's "namespace/name".
func (p PodSpec) Key() string { return p.Namespace + "/" + p.Name }

// Endpoint is the pod's netlab endpoint, for probes (once started).
func (p PodSpec) Endpoint() netlab.Endpoint { return netlab.Pod(p.Namespace + "." + p.Name) }

// StartPod wires the pod's namespace and servers: from here on it sends
// and receives, while the agents do not know it until Know and Publish.
func (l *Lab) StartPod(p PodSpec) error {
	lp := &labPod{name: p.Endpoint().Name, node: DefaultNodes[p.Node], ips: p.IPs(), tcp: p.TCPPorts, udp: p.UDPPorts}
	if err := l.net.AddPod(netlab.PodSpec{Name: lp.name, Node: lp.node, IPs: lp.ips, TCPPorts: lp.tcp, UDPPorts: lp.udp}); err != nil {
		return fmt.Errorf("pod %s: %w", p.Key(), err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods[p.Key()] = lp
	return nil
}

// Know adds (or updates) the pod's API object (not published).
func (l *Lab) Know(p PodSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: maps.Clone(p.Labels),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec:   corev1.PodSpec{NodeName: DefaultNodes[p.Node]},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.IP.String()},
	}
	for _, ip := range p.IPs() {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	l.objects.pods[p.Key()] = pod
}

// SetPolicy adds or replaces a NetworkPolicy (not published).
func (l *Lab) SetPolicy(np *networkingv1.NetworkPolicy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.objects.policies[np.Namespace+"/"+np.Name] = np
}

// DeletePolicy removes a NetworkPolicy (not published).
func (l *Lab) DeletePolicy(namespace, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.objects.policies, namespace+"/"+name)
}

// Input is the node's compile input from the current objects.
func (l *Lab) Input(node string) compile.Input {
	l.mu.Lock()
	defer l.mu.Unlock()
	in := compile.Input{NodeName: node, NodeIPs: l.nodeIPs[node], Nodes: l.objects.nodes}
	for _, k := range slices.Sorted(maps.Keys(l.objects.namespaces)) {
		in.Namespaces = append(in.Namespaces, l.objects.namespaces[k])
	}
	for _, k := range slices.Sorted(maps.Keys(l.objects.pods)) {
		in.Pods = append(in.Pods, l.objects.pods[k])
	}
	for _, k := range slices.Sorted(maps.Keys(l.objects.policies)) {
		in.Policies = append(in.Policies, l.objects.policies[k])
	}
	return in
}

// Publish plays one sync of the current objects on every node: build,
// commit, publish, revoke (Config.Revoke).
func (l *Lab) Publish(ctx context.Context) error {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	for _, n := range l.nodes {
		if _, err := l.agents[n].Apply(ctx, compile.Build(l.Input(n)), nil, false); err != nil {
			return err
		}
	}
	return nil
}

// MatchLabels is a label selector matching the given key, value pairs.
func MatchLabels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}
