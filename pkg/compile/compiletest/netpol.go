package compiletest

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// This file is a small language for writing NetworkPolicies in tests as
// one expression each, e.g.
//
//	NetPol("x", "allow-y", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(compile.NamespaceNameLabel, "y"))).On(Port(80, "TCP"))))
//
// The upstream cases (NetpolCases) and pkg/evaluate's tests are
// written in it.

// Short names for what policies in tests say most.
const (
	TCP    = compile.ProtoTCP
	UDP    = compile.ProtoUDP
	SCTP   = compile.ProtoSCTP
	PIn    = networkingv1.PolicyTypeIngress
	PEg    = networkingv1.PolicyTypeEgress
	NSName = compile.NamespaceNameLabel
)

// List is its arguments as a slice, for a table's policies.
func List(nps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return nps }

// Sel is a matchLabels selector from key, value pairs; Sel() selects
// everything.
func Sel(kv ...string) metav1.LabelSelector {
	s := metav1.LabelSelector{}
	if len(kv) > 0 {
		s.MatchLabels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.MatchLabels[kv[i]] = kv[i+1]
		}
	}
	return s
}

// Expr is a selector with one match expression.
func Expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// PodPeer is a peer with only a podSelector (pods of the policy's namespace).
func PodPeer(pod metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &pod}
}

// NSPeer is a peer with only a namespaceSelector.
func NSPeer(ns metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &ns}
}

// PodNSPeer is one peer with both selectors, which the API ANDs.
func PodNSPeer(pod, ns metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &pod, NamespaceSelector: &ns}
}

// IPPeer is an ipBlock peer.
func IPPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func protoPtr(p string) *corev1.Protocol {
	if p == "" {
		return nil
	}
	cp := corev1.Protocol(p)
	return &cp
}

// Port is a numbered port; proto "" leaves the protocol to defaulting (TCP).
func Port(n int32, proto string) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// PortRange is the ports first to last (endPort).
func PortRange(first, last int32, proto string) networkingv1.NetworkPolicyPort {
	p := Port(first, proto)
	p.EndPort = &last
	return p
}

// NamedPort is a port by name; proto "" leaves the protocol to defaulting.
func NamedPort(name, proto string) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// ProtoOnly is a port entry with a protocol and no port: every port.
func ProtoOnly(proto string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: protoPtr(proto)}
}

// Rule is an ingress or egress rule before it is given a direction: Peers
// become from or to. A nil slice is absent (all); an empty non-nil one is
// what the API gets as [].
type Rule struct {
	Peers []networkingv1.NetworkPolicyPeer
	Ports []networkingv1.NetworkPolicyPort
}

// Peers makes a rule with the given peers; Peers() has from/to absent.
func Peers(p ...networkingv1.NetworkPolicyPeer) Rule { return Rule{Peers: p} }

// On restricts the rule to ports.
func (r Rule) On(p ...networkingv1.NetworkPolicyPort) Rule { r.Ports = p; return r }

// PolicyOpt fills part of a NetworkPolicySpec.
type PolicyOpt func(*networkingv1.NetworkPolicySpec)

// Types sets spec.policyTypes; without it the API's defaulting applies.
func Types(ts ...networkingv1.PolicyType) PolicyOpt {
	return func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = append([]networkingv1.PolicyType{}, ts...) }
}

// Ingress appends ingress rules; Ingress() with no rules leaves
// spec.ingress empty.
func Ingress(rules ...Rule) PolicyOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		for _, r := range rules {
			s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{From: r.Peers, Ports: r.Ports})
		}
	}
}

// Egress appends egress rules; Egress() with no rules leaves spec.egress
// empty.
func Egress(rules ...Rule) PolicyOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		for _, r := range rules {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{To: r.Peers, Ports: r.Ports})
		}
	}
}

// NetPol is the NetworkPolicy ns/name selecting podSelector, with opts
// applied in order.
func NetPol(ns, name string, podSelector metav1.LabelSelector, opts ...PolicyOpt) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: podSelector},
	}
	for _, o := range opts {
		o(&np.Spec)
	}
	return np
}
