package compile_test

import (
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
)

// clusterSpecs are the ClusterNetworkPolicy specs of a seed's scenario and
// of the next scenarios that have some: half the seeds draw none, and
// every world needs specs to add policies with.
func clusterSpecs(seed uint64, node string) []npav1beta1.ClusterNetworkPolicySpec {
	var out []npav1beta1.ClusterNetworkPolicySpec
	for k := uint64(0); k < 20 && len(out) < 6; k++ {
		for _, cnp := range scenariogen.Generate(seed+2000*k).Input(node, nil, nil).ClusterPolicies {
			out = append(out, cnp.Spec)
		}
	}
	return out
}

// clusterEvent adds, changes or deletes one ClusterNetworkPolicy (a new
// object for every change, as an informer delivers it) and returns its
// name, its previous and new state.
func (w *world) clusterEvent() (name string, old, cur *npav1beta1.ClusterNetworkPolicy, what string) {
	cnps := w.in.ClusterPolicies
	x := w.r.IntN(11)
	if len(cnps) == 0 || x < 3 {
		w.next++
		cnp := &npav1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("added-%d", w.next)},
			Spec: *w.cnpSpecs[w.r.IntN(len(w.cnpSpecs))].DeepCopy()}
		if w.r.IntN(4) == 0 {
			cnp.Annotations = stagedAnnotation(true)
		}
		if len(cnps) > 0 && w.r.IntN(2) == 0 {
			// A name that extends another's: chains are ordered by name,
			// and precedence ties are broken by name.
			n := cnps[w.r.IntN(len(cnps))].Name + []string{"-a", "0", "a"}[w.r.IntN(3)]
			if !slices.ContainsFunc(cnps, func(p *npav1beta1.ClusterNetworkPolicy) bool { return p.Name == n }) {
				cnp.Name = n
			}
		}
		w.in.ClusterPolicies = append(cnps[:len(cnps):len(cnps)], cnp)
		return cnp.Name, nil, cnp, "cluster policy added"
	}
	i := w.r.IntN(len(cnps))
	old = cnps[i]
	if x < 5 {
		w.in.ClusterPolicies = append(cnps[:i:i], cnps[i+1:]...)
		return old.Name, old, nil, "cluster policy deleted"
	}
	cur = old.DeepCopy()
	switch x {
	case 5:
		cur.Spec = *w.cnpSpecs[w.r.IntN(len(w.cnpSpecs))].DeepCopy()
		what = "cluster policy rewritten"
	case 6:
		// Another policy's priority: ties.
		cur.Spec.Priority = cnps[w.r.IntN(len(cnps))].Spec.Priority
		what = "cluster policy priority changed"
	case 7:
		cur.Spec.Tier = []npav1beta1.Tier{npav1beta1.AdminTier, npav1beta1.BaselineTier}[w.r.IntN(2)]
		what = "cluster policy tier changed"
	case 8:
		cur.Spec.Subject = *w.cnpSpecs[w.r.IntN(len(w.cnpSpecs))].Subject.DeepCopy()
		what = "cluster policy subject changed"
	case 10:
		cur.Annotations = stagedAnnotation(!compile.Staged(cur))
		what = "cluster policy staged toggled"
	default:
		if len(cur.Spec.Ingress) > 0 {
			cur.Spec.Ingress = cur.Spec.Ingress[1:]
		}
		if len(cur.Spec.Egress) > 0 {
			cur.Spec.Egress = cur.Spec.Egress[:len(cur.Spec.Egress)-1]
		}
		what = "cluster policy rules dropped"
	}
	w.in.ClusterPolicies = append(append(cnps[:i:i], cur), cnps[i+1:]...)
	return cur.Name, old, cur, what
}

// domainPeers reports whether a ClusterNetworkPolicy has domainNames
// peers, which the tracker leaves to the full build.
func domainPeers(cnp *npav1beta1.ClusterNetworkPolicy) bool {
	if cnp == nil {
		return false
	}
	for _, r := range cnp.Spec.Egress {
		for _, p := range r.To {
			if p.DomainNames != nil {
				return true
			}
		}
	}
	return false
}

// enforcedCNP is cnp, or nil when the world's program leaves it out
// (staged): the tracker knows only the policies in force.
func (w *world) enforcedCNP(cnp *npav1beta1.ClusterNetworkPolicy) *npav1beta1.ClusterNetworkPolicy {
	if cnp != nil && compile.Staged(cnp) && !w.in.EnforceStaged {
		return nil
	}
	return cnp
}

// policyFallback is why ApplyPolicy leaves a NetworkPolicy change to a
// rebuild in a mode: only in queue mode.
func policyFallback(mode compile.Mode) compile.Fallback {
	if mode == compile.ModeQueue {
		return compile.FallbackQueueMode
	}
	return compile.NoFallback
}

// clusterFallback is why ApplyClusterPolicy leaves a change from old to
// cnp to a rebuild: queue mode, or domainNames peers before or after.
func clusterFallback(mode compile.Mode, cfg compile.RenderConfig, old, cnp *npav1beta1.ClusterNetworkPolicy) compile.Fallback {
	switch {
	case mode == compile.ModeQueue:
		return compile.FallbackQueueMode
	case domainPeers(old) || domainPeers(cnp):
		return compile.FallbackDomainNames
	}
	return compile.NoFallback
}
