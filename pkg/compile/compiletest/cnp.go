package compiletest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Builders for ClusterNetworkPolicy objects, so that tables read like the
// policies they test:
//
//	CNP("no-y", "Admin", 10, NamespacesSubject(Sel("ns", "x")),
//		CNPEgress(CNPRule("no-y", "Deny", ToNamespaces(Sel("ns", "y")))))

// CNPOpt changes a ClusterNetworkPolicy's spec.
type CNPOpt func(*npav1beta1.ClusterNetworkPolicySpec)

// CNP is a ClusterNetworkPolicy of the given tier ("Admin", "Baseline") and priority.
func CNP(name, tier string, priority int32, subject npav1beta1.ClusterNetworkPolicySubject, opts ...CNPOpt) *npav1beta1.ClusterNetworkPolicy {
	p := &npav1beta1.ClusterNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: npav1beta1.ClusterNetworkPolicySpec{
			Tier: npav1beta1.Tier(tier), Priority: priority, Subject: subject,
		},
	}
	for _, o := range opts {
		o(&p.Spec)
	}
	return p
}

// NamespacesSubject selects every pod of the matching namespaces.
func NamespacesSubject(ns metav1.LabelSelector) npav1beta1.ClusterNetworkPolicySubject {
	return npav1beta1.ClusterNetworkPolicySubject{Namespaces: &ns}
}

// PodsSubject selects the matching pods of the matching namespaces.
func PodsSubject(ns, pods metav1.LabelSelector) npav1beta1.ClusterNetworkPolicySubject {
	return npav1beta1.ClusterNetworkPolicySubject{Pods: &npav1beta1.NamespacedPod{NamespaceSelector: ns, PodSelector: pods}}
}

// CRule is a rule before it is given a direction.
type CRule struct {
	Name      string
	Action    string
	Peers     []npav1beta1.ClusterNetworkPolicyEgressPeer
	Protocols []npav1beta1.ClusterNetworkPolicyProtocol
}

// CNPRule makes a rule; its peers are egress peers (ingress keeps namespaces
// and pods only).
func CNPRule(name, action string, peers ...npav1beta1.ClusterNetworkPolicyEgressPeer) CRule {
	return CRule{Name: name, Action: action, Peers: peers}
}

// On restricts the rule to protocols.
func (r CRule) On(p ...npav1beta1.ClusterNetworkPolicyProtocol) CRule { r.Protocols = p; return r }

// CNPIngress appends ingress rules.
func CNPIngress(rules ...CRule) CNPOpt {
	return func(s *npav1beta1.ClusterNetworkPolicySpec) {
		for _, r := range rules {
			ir := npav1beta1.ClusterNetworkPolicyIngressRule{Name: r.Name, Action: npav1beta1.ClusterNetworkPolicyRuleAction(r.Action), Protocols: r.Protocols}
			for _, p := range r.Peers {
				ir.From = append(ir.From, npav1beta1.ClusterNetworkPolicyIngressPeer{Namespaces: p.Namespaces, Pods: p.Pods})
			}
			s.Ingress = append(s.Ingress, ir)
		}
	}
}

// CNPEgress appends egress rules.
func CNPEgress(rules ...CRule) CNPOpt {
	return func(s *npav1beta1.ClusterNetworkPolicySpec) {
		for _, r := range rules {
			s.Egress = append(s.Egress, npav1beta1.ClusterNetworkPolicyEgressRule{Name: r.Name,
				Action: npav1beta1.ClusterNetworkPolicyRuleAction(r.Action), To: r.Peers, Protocols: r.Protocols})
		}
	}
}

// ToNamespaces is a namespaces peer.
func ToNamespaces(ns metav1.LabelSelector) npav1beta1.ClusterNetworkPolicyEgressPeer {
	return npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: &ns}
}

// ToPods is a pods peer.
func ToPods(ns, pods metav1.LabelSelector) npav1beta1.ClusterNetworkPolicyEgressPeer {
	return npav1beta1.ClusterNetworkPolicyEgressPeer{Pods: &npav1beta1.NamespacedPod{NamespaceSelector: ns, PodSelector: pods}}
}

// ToNodes is a nodes peer.
func ToNodes(nodes metav1.LabelSelector) npav1beta1.ClusterNetworkPolicyEgressPeer {
	return npav1beta1.ClusterNetworkPolicyEgressPeer{Nodes: &nodes}
}

// ToNetworks is a networks peer.
func ToNetworks(cidrs ...string) npav1beta1.ClusterNetworkPolicyEgressPeer {
	p := npav1beta1.ClusterNetworkPolicyEgressPeer{Networks: []npav1beta1.CIDR{}}
	for _, c := range cidrs {
		p.Networks = append(p.Networks, npav1beta1.CIDR(c))
	}
	return p
}

// ToDomains is a domainNames peer.
func ToDomains(names ...string) npav1beta1.ClusterNetworkPolicyEgressPeer {
	p := npav1beta1.ClusterNetworkPolicyEgressPeer{}
	for _, n := range names {
		p.DomainNames = append(p.DomainNames, npav1beta1.DomainName(n))
	}
	return p
}

// NoPeerField is a peer with no field set, as a newer API's unknown peer
// kind reads to this version.
func NoPeerField() npav1beta1.ClusterNetworkPolicyEgressPeer {
	return npav1beta1.ClusterNetworkPolicyEgressPeer{}
}

// Proto is a protocol entry: "TCP", "UDP" or "SCTP" with a port (0: none).
func Proto(proto string, port int32) npav1beta1.ClusterNetworkPolicyProtocol {
	var dp *npav1beta1.Port
	if port != 0 {
		dp = &npav1beta1.Port{Number: port}
	}
	return protoEntry(proto, dp)
}

// ProtoRange is a protocol entry with a port range.
func ProtoRange(proto string, start, end int32) npav1beta1.ClusterNetworkPolicyProtocol {
	return protoEntry(proto, &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: start, End: end}})
}

func protoEntry(proto string, dp *npav1beta1.Port) npav1beta1.ClusterNetworkPolicyProtocol {
	switch proto {
	case "UDP":
		return npav1beta1.ClusterNetworkPolicyProtocol{UDP: &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: dp}}
	case "SCTP":
		return npav1beta1.ClusterNetworkPolicyProtocol{SCTP: &npav1beta1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: dp}}
	}
	return npav1beta1.ClusterNetworkPolicyProtocol{TCP: &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: dp}}
}

// DestinationNamedPort is a destinationNamedPort entry.
func DestinationNamedPort(name string) npav1beta1.ClusterNetworkPolicyProtocol {
	return npav1beta1.ClusterNetworkPolicyProtocol{DestinationNamedPort: name}
}

// Node is a node with labels (key, value pairs) and addresses.
func Node(name string, ips []string, kv ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

// DevCNPs are an Admin policy passing traffic from env=dev namespaces to
// port 8080 (the pass skips the rest of the Admin tier) and a Baseline
// policy denying ingress to grpc (a named port) from env=dev namespaces,
// over Cluster's namespaces.
func DevCNPs() []*npav1beta1.ClusterNetworkPolicy {
	all := NamespacesSubject(Sel())
	dev := ToNamespaces(Sel("env", "dev"))
	return []*npav1beta1.ClusterNetworkPolicy{
		CNP("pass-dev-http", "Admin", 5, all,
			CNPIngress(CNPRule("dev-http", "Pass", dev).On(Proto("TCP", 8080)))),
		CNP("no-dev-grpc", "Baseline", 100, PodsSubject(Sel(), Sel()),
			CNPIngress(CNPRule("dev-grpc", "Deny", dev).On(DestinationNamedPort("grpc")))),
	}
}
