package compile

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Staged policies (StagedAnnotation) are written to see what they would
// do before they do it. The program of an input leaves them out, exactly
// as if they did not exist; Input.EnforceStaged builds the other program,
// with them in force. Build, the Tracker and every tool that builds from
// objects decide stagedness here and nowhere else.

// Staged reports whether an object carries StagedAnnotation set to
// "true" (any other value, or none, enforces it).
func Staged(obj metav1.Object) bool {
	return obj.GetAnnotations()[StagedAnnotation] == "true"
}

// NetworkPolicyStaged reports whether a NetworkPolicy is staged: by its
// own annotation, or because its namespace is (nsStaged, from Staged of
// the Namespace object).
func NetworkPolicyStaged(np *networkingv1.NetworkPolicy, nsStaged bool) bool {
	return nsStaged || Staged(np)
}

// enforced reports whether the build compiles a NetworkPolicy.
func (b *builder) enforced(np *networkingv1.NetworkPolicy) bool {
	return b.stagedNS == nil || !NetworkPolicyStaged(np, b.stagedNS[np.Namespace])
}

// enforcedClusterPolicy reports whether the build compiles a
// ClusterNetworkPolicy.
func (b *builder) enforcedClusterPolicy(cnp *npav1beta1.ClusterNetworkPolicy) bool {
	return b.stagedNS == nil || !Staged(cnp)
}

// enforcedClusterPolicies returns the ClusterNetworkPolicies the build
// compiles.
func (b *builder) enforcedClusterPolicies(cnps []*npav1beta1.ClusterNetworkPolicy) []*npav1beta1.ClusterNetworkPolicy {
	out := make([]*npav1beta1.ClusterNetworkPolicy, 0, len(cnps))
	for _, cnp := range cnps {
		if b.enforcedClusterPolicy(cnp) {
			out = append(out, cnp)
		}
	}
	return out
}
