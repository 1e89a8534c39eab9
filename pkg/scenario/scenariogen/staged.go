package scenariogen

import (
	"math/rand/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// StagedFraction is the share of seeds that stage some of their policies
// or namespaces (compile.StagedAnnotation).
const StagedFraction = 0.3

// stagedValues are the values the generator annotates with: mostly
// "true", which stages, and values that stage nothing.
var stagedValues = []string{"true", "true", "true", "true", "false", "True", ""}

// stagedPart annotates, for a fraction of the seeds, some NetworkPolicies,
// ClusterNetworkPolicies and namespaces with compile.StagedAnnotation. It
// draws from its own stream of the seed: seeds that draw nothing are
// unchanged byte for byte, and the others differ by annotations only.
func (g *gen) stagedPart(seed uint64) {
	st := &gen{r: rand.New(rand.NewPCG(seed, 0x73746167_65642121)), s: g.s}
	if !st.chance(StagedFraction) {
		return
	}
	annotation := func() map[string]string {
		return map[string]string{compile.StagedAnnotation: pick(st, stagedValues)}
	}
	for i := range st.s.Policies {
		if st.chance(0.35) {
			st.s.Policies[i].Annotations = annotation()
		}
	}
	for i := range st.s.ClusterNetworkPolicies {
		if st.chance(0.35) {
			st.s.ClusterNetworkPolicies[i].Annotations = annotation()
		}
	}
	for i := range st.s.Namespaces {
		if st.chance(0.2) {
			st.s.Namespaces[i].Annotations = annotation()
		}
	}
}
