package compile_test

import (
	networkingv1 "k8s.io/api/networking/v1"

	"fmt"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// BenchmarkExceptCompile is the whole build (Build and Render, hybrid
// mode) of a small cluster with one NetworkPolicy whose ipBlock has n
// scattered /32 exceptions (compiletest.HugeExceptPolicy): the attack of a
// namespace user on the range arithmetic. hack/bench.sh reports the
// 16,000 case as except_compile_ms_16000.
func BenchmarkExceptCompile(b *testing.B) {
	for _, n := range []int{1000, 16000} {
		b.Run(fmt.Sprintf("excepts=%d", n), func(b *testing.B) {
			in := compiletest.Cluster(200, 20, 2)
			in.NodeName = "node-0"
			in.Policies = append(in.Policies, compiletest.HugeExceptPolicy("ns-0000", "huge", "app-1", n, 80))
			cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
			for b.Loop() {
				prog := compile.Build(in)
				rs, err := compile.Render(prog, cfg)
				if err != nil {
					b.Fatal(err)
				}
				renderSink = rs
			}
		})
	}
}

// BenchmarkHugePolicy is the whole build of one object grown along one
// dimension at a time, to show that none of them costs more than linear
// (times log) work: n peers with distinct podSelectors, n namespaceSelector
// peers, n numbered ports, n named ports, n rules, a ClusterNetworkPolicy
// rule with n networks, and n policies selecting the same pod.
func BenchmarkHugePolicy(b *testing.B) {
	// 3,000 selector peers or rules stay within compile.MaxPolicyCost;
	// 16,000 of them are over it (rejected, which costs only counting).
	for _, n := range []int{1000, 3000, 16000} {
		for _, dim := range []string{"pod-peers", "ns-peers", "ports", "named-ports", "rules", "cnp-networks", "policies-one-pod"} {
			b.Run(fmt.Sprintf("%s=%d", dim, n), func(b *testing.B) {
				in := compiletest.Cluster(200, 20, 2)
				in.NodeName = "node-0"
				hugeDimension(&in, dim, n)
				cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
				for b.Loop() {
					rs, err := compile.Render(compile.Build(in), cfg)
					if err != nil {
						b.Fatal(err)
					}
					renderSink = rs
				}
			})
		}
	}
}

// hugeDimension adds to in one object of size n along dim (see
// BenchmarkHugePolicy).
func hugeDimension(in *compile.Input, dim string, n int) {
	np := compiletest.NetPol("ns-0000", "huge", compiletest.Sel("app", "app-1"))
	rule := networkingv1.NetworkPolicyIngressRule{}
	switch dim {
	case "pod-peers", "ns-peers":
		for i := range n {
			sel := compiletest.Sel("app", fmt.Sprintf("app-%d", i))
			if dim == "pod-peers" {
				rule.From = append(rule.From, compiletest.PodPeer(sel))
			} else {
				rule.From = append(rule.From, compiletest.NSPeer(compiletest.Sel("team", fmt.Sprintf("t%d", i))))
			}
		}
	case "ports":
		for i := range n {
			rule.Ports = append(rule.Ports, compiletest.Port(int32(1+2*(i%30000)), "TCP"))
		}
	case "named-ports":
		for i := range n {
			rule.Ports = append(rule.Ports, compiletest.NamedPort(fmt.Sprintf("p%d", i), "TCP"))
		}
	case "rules":
		for i := range n {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
				From:  []networkingv1.NetworkPolicyPeer{compiletest.PodPeer(compiletest.Sel("app", fmt.Sprintf("app-%d", i%50)))},
				Ports: []networkingv1.NetworkPolicyPort{compiletest.Port(int32(1+i%60000), "TCP")},
			})
		}
	case "cnp-networks":
		cidrs := compiletest.ScatteredExcepts(n, 7)
		in.ClusterPolicies = append(in.ClusterPolicies, compiletest.CNP("huge", "Admin", 10,
			compiletest.NamespacesSubject(compiletest.Sel()),
			compiletest.CNPEgress(compiletest.CNPRule("deny", "Deny", compiletest.ToNetworks(cidrs...)))))
		return
	case "policies-one-pod":
		for i := range n {
			p := compiletest.NetPol("ns-0000", fmt.Sprintf("p%d", i), compiletest.Sel("app", "app-1"),
				compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", fmt.Sprintf("app-%d", i%50))))))
			in.Policies = append(in.Policies, p)
		}
		return
	}
	np.Spec.Ingress = append(np.Spec.Ingress, rule)
	in.Policies = append(in.Policies, np)
}
