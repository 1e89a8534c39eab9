package bench

import (
	"flag"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/config"
)

var trackerScalePods = flag.Int("tracker-scale-pods", 150000, "pods of BenchmarkTrackerScale's cluster")

// BenchmarkTrackerScale times, in this process, what the scale section's
// cnp_sync_ms_*_denylog and namespace_sync_ms_* time in the agent: over
// the same objects (the scale section's namespaces and pods, 10,000
// NetworkPolicies, 100 ClusterNetworkPolicies, 4 pods on the agent's node)
// with the agent's default deny log, a ClusterNetworkPolicy edit through
// Tracker.ApplyClusterPolicy and a namespace label change through
// Tracker.ApplyNamespace: the tracker's part, without the transaction.
// Every edit flips back and forth; a Rebuild (the agent's program
// refresh, not timed) comes between two.
func BenchmarkTrackerScale(b *testing.B) {
	in := trackerScaleInput(*trackerScalePods)
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: config.DefaultDenyLogGroup}
	for _, what := range []string{"cnp-denylog", "namespace"} {
		b.Run(what, func(b *testing.B) {
			tr, err := compile.NewTracker(cfg)
			if err != nil {
				b.Fatal(err)
			}
			cur := in
			for b.Loop() {
				b.StopTimer()
				if _, _, err := tr.Rebuild(cur); err != nil {
					b.Fatal(err)
				}
				var f compile.Fallback
				b.StartTimer()
				if what == "namespace" {
					var ns *corev1.Namespace
					cur, ns = flipNamespace(cur)
					f = tr.ApplyNamespace(ns.Name, ns)
				} else {
					var cnp *npav1beta1.ClusterNetworkPolicy
					cur, cnp = flipClusterPolicy(cur)
					f = tr.ApplyClusterPolicy(cnp.Name, cnp)
				}
				if f != compile.NoFallback {
					b.Fatalf("%s: fallback %q", what, f)
				}
			}
		})
	}
}

// trackerScaleInput is the scale section's cluster at n pods with its
// policy scale (10,000 NetworkPolicies, 100 ClusterNetworkPolicies), as
// node-1 sees it.
func trackerScaleInput(n int) compile.Input {
	nNS := (n + podsPerNS - 1) / podsPerNS
	in := compile.Input{NodeName: "node-1", ClusterPolicies: scaleClusterPolicies(100), Policies: scalePolicies(nNS, 10000)}
	for i := range nNS {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNSName(i), Labels: scaleNSLabels(i)}})
	}
	for k := range n {
		i, j := k/podsPerNS, k%podsPerNS
		p := scalePod(i, j, 50)
		ip := scalePodIP(i, j).String()
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		in.Pods = append(in.Pods, p)
	}
	for k := range 4 {
		j := k % 20
		ip := fmt.Sprintf("10.244.0.%d", 10+k)
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: scaleNSName(k % 10), Name: fmt.Sprintf("local-%d", k),
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", j), "tier": tiers[k%3]}},
			Spec:   corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Ports: scalePorts(j)}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	return in
}

// flipNamespace returns in with the env label of the first namespace
// flipped (flipEnv), and that namespace.
func flipNamespace(in compile.Input) (compile.Input, *corev1.Namespace) {
	ns := in.Namespaces[0].DeepCopy()
	flipEnv(ns)
	in.Namespaces = append([]*corev1.Namespace{ns}, in.Namespaces[1:]...)
	return in, ns
}

// flipClusterPolicy returns in with the first ClusterNetworkPolicy's
// egress Deny rule gaining or losing a port (timeClusterPolicyChanges),
// and that policy.
func flipClusterPolicy(in compile.Input) (compile.Input, *npav1beta1.ClusterNetworkPolicy) {
	cnp := in.ClusterPolicies[0].DeepCopy()
	if cnp.Spec.Egress[0].Protocols == nil {
		cnp.Spec.Egress[0].Protocols = []npav1beta1.ClusterNetworkPolicyProtocol{ct.Proto("TCP", 9999)}
	} else {
		cnp.Spec.Egress[0].Protocols = nil
	}
	in.ClusterPolicies = append([]*npav1beta1.ClusterNetworkPolicy{cnp}, in.ClusterPolicies[1:]...)
	return in, cnp
}
