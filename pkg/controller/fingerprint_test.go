package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

func TestInputsFingerprint(t *testing.T) {
	meta := func(ns, name, rv string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv}
	}
	pods := []*corev1.Pod{{ObjectMeta: meta("x", "a", "10")}, {ObjectMeta: meta("x", "b", "11")}}
	nss := []*corev1.Namespace{{ObjectMeta: meta("", "x", "5")}}
	pols := []*networkingv1.NetworkPolicy{{ObjectMeta: meta("x", "deny", "12")}}
	base := InputsFingerprint(compile.Input{Pods: pods, Namespaces: nss, Policies: pols})
	if base == 0 || base >= 1<<fingerprintBits {
		t.Fatalf("fingerprint %#x: want non-zero and below 2^%d", base, fingerprintBits)
	}
	if float64(base) != float64(int64(base)) || uint64(float64(base)) != base {
		t.Fatalf("fingerprint %#x does not survive a float64 gauge", base)
	}
	reordered := InputsFingerprint(compile.Input{Pods: []*corev1.Pod{pods[1], pods[0]}, Namespaces: nss, Policies: pols, NodeName: "n1"})
	if reordered != base {
		t.Errorf("fingerprint depends on list order or node name: %#x != %#x", reordered, base)
	}
	for name, in := range map[string]compile.Input{
		"resourceVersion changed": {Pods: []*corev1.Pod{pods[0], {ObjectMeta: meta("x", "b", "13")}}, Namespaces: nss, Policies: pols},
		"pod deleted":             {Pods: pods[:1], Namespaces: nss, Policies: pols},
		"policy deleted":          {Pods: pods, Namespaces: nss},
		"kind differs":            {Pods: pods, Namespaces: nss, Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: meta("x", "b", "11")}}},
		"fields not separated":    {Pods: []*corev1.Pod{{ObjectMeta: meta("x", "a1", "0")}, pods[1]}, Namespaces: nss, Policies: pols},
	} {
		if got := InputsFingerprint(in); got == base {
			t.Errorf("%s: fingerprint unchanged (%#x)", name, got)
		}
	}
}
