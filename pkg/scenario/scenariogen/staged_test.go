package scenariogen

import (
	"testing"

	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// TestStagedCoverage: over the seeds, policies of both APIs and tiers and
// namespaces with policies are staged, other values appear, the fraction
// holds roughly, and staging changes verdicts (some probe is decided
// otherwise than with the annotations removed).
func TestStagedCoverage(t *testing.T) {
	seen := map[string]int{}
	withStaged, changed := 0, 0
	for seed := uint64(0); seed < 300; seed++ {
		s := Generate(seed)
		stagedNS, any := map[string]bool{}, false
		note := func(kind string, a map[string]string) bool {
			v, ok := a[compile.StagedAnnotation]
			if !ok {
				return false
			}
			any = true
			if v != "true" {
				seen[kind+" other value"]++
				return false
			}
			seen[kind]++
			return true
		}
		for _, ns := range s.Namespaces {
			stagedNS[ns.Name] = note("namespace", ns.Annotations)
		}
		for _, np := range s.Policies {
			note("NetworkPolicy", np.Annotations)
			if stagedNS[np.Namespace] {
				seen["NetworkPolicy of a staged namespace"]++
			}
		}
		for _, cnp := range s.ClusterNetworkPolicies {
			note(string(cnp.Spec.Tier)+" ClusterNetworkPolicy", cnp.Annotations)
		}
		if !any {
			continue
		}
		withStaged++
		if _, err := scenario.Parse(mustYAML(t, s)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if stagingDecides(s) {
			changed++
		}
	}
	t.Logf("seeds 0-299: %d with annotations, %d of them decided otherwise without; %v", withStaged, changed, seen)
	for _, k := range []string{"namespace", "NetworkPolicy", "NetworkPolicy of a staged namespace", "NetworkPolicy other value",
		string(npav1beta1.AdminTier) + " ClusterNetworkPolicy", string(npav1beta1.BaselineTier) + " ClusterNetworkPolicy"} {
		if seen[k] == 0 {
			t.Errorf("no seed has a staged %s", k)
		}
	}
	if f := float64(withStaged) / 300; f < StagedFraction-0.1 || f > StagedFraction+0.1 {
		t.Errorf("%.2f of the seeds have staged annotations, want about %.2f", f, StagedFraction)
	}
	if changed < withStaged/3 {
		t.Errorf("staging changes verdicts in %d of %d seeds", changed, withStaged)
	}
}

// stagingDecides reports whether some probe of s is decided otherwise
// with the staged annotations removed.
func stagingDecides(s *scenario.Scenario) bool {
	bare := *s
	bare.Namespaces = append([]scenario.Namespace(nil), s.Namespaces...)
	for i := range bare.Namespaces {
		bare.Namespaces[i].Annotations = nil
	}
	bare.Policies = append(bare.Policies[:0:0], s.Policies...)
	for i := range bare.Policies {
		bare.Policies[i].Annotations = nil
	}
	bare.ClusterNetworkPolicies = append(bare.ClusterNetworkPolicies[:0:0], s.ClusterNetworkPolicies...)
	for i := range bare.ClusterNetworkPolicies {
		bare.ClusterNetworkPolicies[i].Annotations = nil
	}
	a, b := s.Decide(), bare.Decide()
	for i := range a {
		if a[i].Allowed != b[i].Allowed {
			return true
		}
	}
	return false
}
