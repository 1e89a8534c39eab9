package compiletest

import (
	"fmt"
	"math/rand/v2"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ScatteredExcepts returns n distinct /32 exceptions scattered over
// 10.0.0.0/8 in a random order (seeded: the same n gives the same list),
// none of them adjacent to another, so that no two merge: the ipBlock
// 10.0.0.0/8 minus them is n+1 ranges.
func ScatteredExcepts(n int, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 0x5ca77e4ed))
	seen := make(map[uint32]bool, n)
	out := make([]string, 0, n)
	for len(out) < n {
		// Even host numbers only, below the broadcast: never adjacent.
		a := r.Uint32N(1<<23-1) * 2
		if a == 0 || seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, fmt.Sprintf("10.%d.%d.%d/32", a>>16&0xff, a>>8&0xff, a&0xff))
	}
	return out
}

// HugeExceptPolicy is the attack of a namespace user on the compiler's
// range arithmetic: a NetworkPolicy in ns selecting the pods labelled
// app=<app> and allowing ingress on TCP port from 10.0.0.0/8 except n
// scattered /32 addresses (ScatteredExcepts), plus from the pods with
// role=client of its own namespace (so that its subjects stay reachable
// from somewhere the tests can check). 16,000 exceptions are about 300 KB
// of JSON, well inside one object.
func HugeExceptPolicy(ns, name, app string, n int, port int32) *networkingv1.NetworkPolicy {
	client := Sel("role", "client")
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: Sel("app", app),
			PolicyTypes: []networkingv1.PolicyType{PIn},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{IPPeer("10.0.0.0/8", ScatteredExcepts(n, uint64(n))...), PodPeer(client)},
				Ports: []networkingv1.NetworkPolicyPort{Port(port, "TCP")},
			}},
		},
	}
}

// CostAmplificationPolicy is issue 43's attack on what a policy makes: a
// NetworkPolicy of ns whose one ingress rule has n peers, peer i
// `namespaceSelector: {}` and `podSelector` "label nope-<i> does not
// exist": each selects every pod of the cluster, so the policy says
// little (21 per peer, NetworkPolicyCost) and makes n x pods elements.
// Its subject is the pods labelled app=<app>.
func CostAmplificationPolicy(ns, name, app string, n int) *networkingv1.NetworkPolicy {
	peers := make([]networkingv1.NetworkPolicyPeer, n)
	for i := range peers {
		peers[i] = PodNSPeer(Expr(fmt.Sprintf("nope-%d", i), metav1.LabelSelectorOpDoesNotExist), Sel())
	}
	return NetPol(ns, name, Sel("app", app), Ingress(Peers(peers...)))
}
