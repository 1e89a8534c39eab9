package compile_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/knftables"
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

// TestTrackerRejectsAsBuild: a policy over the bound applied alone through
// the Tracker (the agent's path for one policy change) gives the ruleset a
// full build gives, for both kinds, added and then made small again.
func TestTrackerRejectsAsBuild(t *testing.T) {
	in := ct.Cluster(300, 10, 2)
	in.NodeName = "node-0"
	huge := ct.HugeExceptPolicy("ns-0000", "huge", "app-1", compile.MaxPolicyCost, 80)
	small := ct.HugeExceptPolicy("ns-0000", "huge", "app-1", 10, 80)
	hugeCNP := ct.CNP("huge", "Admin", 5, ct.NamespacesSubject(ct.Sel("team", "t1")), ct.CNPEgress(
		ct.CNPRule("accept", "Accept", ct.ToNetworks(ct.ScatteredExcepts(compile.MaxPolicyCost, 2)...)),
		ct.CNPRule("deny", "Deny", ct.ToNetworks("192.0.2.0/24"))))
	smallCNP := ct.CNP("huge", "Admin", 5, ct.NamespacesSubject(ct.Sel("team", "t1")), ct.CNPEgress(
		ct.CNPRule("accept", "Accept", ct.ToNetworks("198.51.100.0/24")),
		ct.CNPRule("deny", "Deny", ct.ToNetworks("192.0.2.0/24"))))
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	base := in.Policies
	for _, step := range []struct {
		name string
		np   *networkingv1.NetworkPolicy
		cnp  *npav1beta1.ClusterNetworkPolicy
	}{{"huge policy", huge, nil}, {"huge ClusterNetworkPolicy", huge, hugeCNP}, {"both small again", small, smallCNP}} {
		if f := tr.ApplyPolicy("ns-0000/huge", step.np); f != compile.NoFallback {
			t.Fatalf("%s: NetworkPolicy not tracked: %s", step.name, f)
		}
		if f := tr.ApplyClusterPolicy("huge", step.cnp); f != compile.NoFallback {
			t.Fatalf("%s: ClusterNetworkPolicy not tracked: %s", step.name, f)
		}
		in.Policies = append(slices.Clone(base), step.np)
		in.ClusterPolicies = nil
		if step.cnp != nil {
			in.ClusterPolicies = []*npav1beta1.ClusterNetworkPolicy{step.cnp}
		}
		var got strings.Builder
		tx := knftables.NewFake(knftables.InetFamily, compile.TableName).NewTransaction()
		tr.Ruleset().AddTo(tx)
		got.WriteString(tx.String())
		if want := renderText(t, compile.Build(in), cfg); got.String() != want {
			t.Errorf("%s: the tracker's ruleset differs from a full build's", step.name)
		}
	}
}
