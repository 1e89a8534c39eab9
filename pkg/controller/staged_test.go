package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

// TestTransformsKeepTheStagedAnnotation: the informers' transforms drop
// every annotation but the staged one, which decides whether a policy is
// enforced, with its value as written.
func TestTransformsKeepTheStagedAnnotation(t *testing.T) {
	for _, value := range []string{"true", "false", ""} {
		meta := func() metav1.ObjectMeta {
			m := metav1.ObjectMeta{Name: "p", Namespace: "x", Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"}}
			if value != "" {
				m.Annotations[compile.StagedAnnotation] = value
			}
			return m
		}
		var want map[string]string
		if value != "" {
			want = map[string]string{compile.StagedAnnotation: value}
		}
		np, err := slim.Transform(&networkingv1.NetworkPolicy{ObjectMeta: meta()})
		if err != nil {
			t.Fatal(err)
		}
		nsMeta := meta()
		nsMeta.Namespace = ""
		ns, err := slim.Transform(&corev1.Namespace{ObjectMeta: nsMeta})
		if err != nil {
			t.Fatal(err)
		}
		cnp, err := slimClusterPolicy(&npav1beta1.ClusterNetworkPolicy{ObjectMeta: nsMeta})
		if err != nil {
			t.Fatal(err)
		}
		for kind, obj := range map[string]metav1.Object{"NetworkPolicy": np.(metav1.Object), "Namespace": ns.(metav1.Object),
			"ClusterNetworkPolicy": cnp.(metav1.Object)} {
			if diff := cmp.Diff(want, obj.GetAnnotations()); diff != "" {
				t.Errorf("%s with %s=%q: annotations after the transform (-want +got):\n%s", kind, compile.StagedAnnotation, value, diff)
			}
			if got := compile.Staged(obj); got != (value == "true") {
				t.Errorf("%s with %s=%q: staged %v after the transform", kind, compile.StagedAnnotation, value, got)
			}
		}
	}
}
