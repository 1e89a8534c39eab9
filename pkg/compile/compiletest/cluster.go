// Package compiletest builds inputs for benchmarks and tests of the
// compiler and of what consumes its output: a synthetic cluster of any size
// (Cluster), a small language for writing NetworkPolicies (NetPol, Sel,
// Peers, ...), and the 48 upstream NetworkPolicy e2e cases over their x, y,
// z grid with truth tables (NetpolCases), which the evaluator tests and the
// real-packet e2e suite share. It is not internal so that tests/ can import
// it; the product must not.
package compiletest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Cluster is the synthetic cluster of the benchmarks (pkg/compile, pkg/sets): namespaces
// of 100 pods (labels app=app-<j%20>, tier=web|api|db; named ports http,
// metrics, grpc), namespace labels team and env, and policies spread over
// the namespaces: default-deny-ingress in every fourth namespace, a
// default-deny-egress with DNS and same-namespace rules in every tenth, and
// otherwise an app selector with 1-3 ingress rules mixing podSelector,
// namespaceSelector (alone and ANDed with a podSelector), ipBlock with
// except, numbered, named and ranged ports.
//
// Pods are spread over nodes node-0..node-<nodes-1>.
func Cluster(nPods, nPolicies, nodes int) compile.Input {
	const perNS = 100
	nNS := (nPods + perNS - 1) / perNS
	var in compile.Input
	tiers := []string{"web", "api", "db"}
	for i := 0; i < nNS; i++ {
		ns := fmt.Sprintf("ns-%04d", i)
		env := "prod"
		if i%2 == 1 {
			env = "dev"
		}
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{compile.NamespaceNameLabel: ns, "team": fmt.Sprintf("t%d", i%10), "env": env}}})
		for j := 0; j < perNS && i*perNS+j < nPods; j++ {
			ip := fmt.Sprintf("10.%d.%d.%d", 16+i/256, i%256, j+1)
			in.Pods = append(in.Pods, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%02d", j),
					Labels: map[string]string{"app": fmt.Sprintf("app-%d", j%20), "tier": tiers[j%3]}},
				Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", (i+j)%nodes), Containers: []corev1.Container{{Name: "main", Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080 + int32(j%5/4), Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
					{Name: "grpc", ContainerPort: 50051, Protocol: corev1.ProtocolTCP},
				}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
			})
		}
	}
	in.Policies = Policies(nNS, nPolicies)
	return in
}

// Policies returns the benchmarks' policies over namespaces ns-0000 to
// ns-<nNS-1> (see Cluster).
func Policies(nNS, nPolicies int) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	num := func(n int32, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
		p := intstr.FromInt32(n)
		return networkingv1.NetworkPolicyPort{Port: &p, Protocol: proto}
	}
	named := func(s string) networkingv1.NetworkPolicyPort {
		p := intstr.FromString(s)
		return networkingv1.NetworkPolicyPort{Port: &p}
	}
	lsel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	for k := 0; k < nPolicies; k++ {
		i, round := k%nNS, k/nNS
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%04d", i), Name: fmt.Sprintf("policy-%05d", k)}}
		switch {
		case round == 0 && i%4 == 0:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		case round == 1 && i%10 == 5:
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: lsel(compile.NamespaceNameLabel, "kube-system")}}, Ports: []networkingv1.NetworkPolicyPort{num(53, &udp), num(53, &tcp)}},
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}},
			}
		default:
			np.Spec.PodSelector = *lsel("app", fmt.Sprintf("app-%d", (round*7+i)%20))
			for r := 0; r < k%3+1; r++ {
				var rule networkingv1.NetworkPolicyIngressRule
				switch (k + r) % 4 {
				case 0:
					rule.From = []networkingv1.NetworkPolicyPeer{{PodSelector: lsel("tier", "web")}}
					rule.Ports = []networkingv1.NetworkPolicyPort{num(8080, &tcp)}
				case 1:
					rule.From = []networkingv1.NetworkPolicyPeer{{PodSelector: lsel("app", fmt.Sprintf("app-%d", (k/7)%20)), NamespaceSelector: lsel("team", fmt.Sprintf("t%d", k%10))}}
					rule.Ports = []networkingv1.NetworkPolicyPort{named("http")}
				case 2:
					rule.From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.%d.%d.0/24", 16+(i+1)/256, (i+1)%256)}}}}
					rule.Ports = []networkingv1.NetworkPolicyPort{num(9090, nil), named("metrics")}
				case 3:
					end := int32(8100)
					rng := num(8000, &tcp)
					rng.EndPort = &end
					rule.From = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: lsel("env", "prod")}, {PodSelector: lsel("tier", "api")}}
					rule.Ports = []networkingv1.NetworkPolicyPort{rng, named("grpc")}
				}
				np.Spec.Ingress = append(np.Spec.Ingress, rule)
			}
		}
		out = append(out, np)
	}
	return out
}
