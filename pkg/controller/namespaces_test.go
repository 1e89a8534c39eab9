package controller

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNamespaceChangesGoThroughTheTracker relabels a namespace that a
// NetworkPolicy's peer selects by its labels: the change is a "namespaces"
// sync (the tracker's, not a rebuild), after which the table equals a full
// sync of the full build and the synced inputs' fingerprint follows.
func TestNamespaceChangesGoThroughTheTracker(t *testing.T) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "from-team-a", ResourceVersion: "1"},
		Spec: networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}},
			}},
		},
	}
	y := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "y", ResourceVersion: "1", Labels: map[string]string{"team": "b"}}}
	h := start(t, np, y,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", ResourceVersion: "1"}},
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
		testPod("y", "c", "n2", "10.0.2.1", map[string]string{"app": "client"}))
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	ctx := context.Background()
	nss := h.client.CoreV1().Namespaces()
	relabel := func(team, rv string) func() error {
		return func() error {
			y = y.DeepCopy()
			y.ResourceVersion = rv
			y.Labels = map[string]string{"team": team}
			_, err := nss.Update(ctx, y, metav1.UpdateOptions{})
			return err
		}
	}
	trackedStep(t, h, "namespaces", "namespace joins the peer", relabel("a", "2"),
		func(dump string) bool { return strings.Contains(dump, `10.0.2.1 comment "y/c"`) })
	trackedStep(t, h, "namespaces", "namespace leaves the peer", relabel("b", "3"),
		func(dump string) bool { return !strings.Contains(dump, `10.0.2.1 comment "y/c"`) })
}
