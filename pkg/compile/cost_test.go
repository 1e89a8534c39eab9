package compile_test

import (
	"fmt"
	"testing"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestLargestCRDClusterPolicyIsWithinTheBound: the largest
// ClusterNetworkPolicy the CRD's limits admit (25 rules each way of 25
// peers and 25 protocols; pods peers with a label in each selector, and
// networks peers of 25 CIDRs) is compiled, not rejected.
func TestLargestCRDClusterPolicyIsWithinTheBound(t *testing.T) {
	var ingress, egress []ct.CRule
	for i := range compile.MaxClusterRules {
		in, out := ct.CNPRule(fmt.Sprintf("in-%d", i), "Accept"), ct.CNPRule(fmt.Sprintf("out-%d", i), "Deny")
		for j := range compile.MaxClusterPeersOrPorts {
			pods := ct.ToPods(ct.Sel("ns", fmt.Sprint(j)), ct.Sel("app", fmt.Sprint(j)))
			in.Peers = append(in.Peers, pods)
			if i%2 == 0 {
				out.Peers = append(out.Peers, pods)
			} else {
				out.Peers = append(out.Peers, ct.ToNetworks(ct.ScatteredExcepts(25, uint64(j))...))
			}
			in.Protocols = append(in.Protocols, ct.Proto("TCP", int32(j+1)))
			out.Protocols = append(out.Protocols, ct.Proto("UDP", int32(j+1)))
		}
		ingress, egress = append(ingress, in), append(egress, out)
	}
	cnp := ct.CNP("largest", "Admin", 1, ct.PodsSubject(ct.Sel("ns", "x"), ct.Sel("app", "y")), ct.CNPIngress(ingress...), ct.CNPEgress(egress...))
	cost := compile.ClusterPolicyCost(cnp)
	t.Logf("cost %d, bound %d", cost, compile.MaxPolicyCost)
	if cost > compile.MaxPolicyCost {
		t.Errorf("the largest ClusterNetworkPolicy the CRD admits costs %d, over the bound %d", cost, compile.MaxPolicyCost)
	}
	p := compile.Build(compile.Input{ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{cnp}})
	if p.ClusterPolicies[0].Rejected {
		t.Errorf("rejected: %v", p.ClusterPolicies[0].Problems)
	}
}
