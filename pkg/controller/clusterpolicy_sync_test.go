package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npafake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// TestClusterPolicyChangesGoThroughTheTracker adds, changes (rules,
// priority, tier) and deletes a ClusterNetworkPolicy and checks after each
// step what TestPolicyChangesGoThroughTheTracker checks for a
// NetworkPolicy: a "policies" sync, a table equal to a full sync of the
// full build, the fingerprint following.
func TestClusterPolicyChangesGoThroughTheTracker(t *testing.T) {
	npa := npafake.NewSimpleClientset(
		ct.CNP("other", "Admin", 10, ct.NamespacesSubject(ct.Sel()), ct.CNPEgress(ct.CNPRule("dns", "Accept", ct.ToNetworks("10.96.0.10/32")))))
	npa.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{served}
	h := startWith(t, func(c *Config) { c.PolicyClient, c.ClusterPolicyCheckPeriod = npa, time.Hour },
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
		testPod("x", "b", "n1", "10.0.1.2", map[string]string{"app": "db"}),
		testPod("y", "c", "n2", "10.0.2.1", map[string]string{"app": "client"}))
	eventually(t, "first sync with the cluster policy", func() bool {
		p := h.eval.Program()
		return p != nil && len(p.ClusterPolicies) == 1
	})
	ctx := context.Background()
	cnps := npa.PolicyV1beta1().ClusterNetworkPolicies()
	cnp := ct.CNP("web", "Admin", 10, ct.PodsSubject(ct.Sel(), ct.Sel("app", "web")),
		ct.CNPIngress(ct.CNPRule("clients", "Accept", ct.ToPods(ct.Sel(), ct.Sel("app", "client"))).On(ct.Proto("TCP", 80))))
	cnp.ResourceVersion = "1"
	update := func(change func(*npav1beta1.ClusterNetworkPolicy)) func() error {
		return func() error {
			cnp = cnp.DeepCopy()
			change(cnp)
			_, err := cnps.Update(ctx, cnp, metav1.UpdateOptions{})
			return err
		}
	}
	policyStep(t, h, "cluster policy added", func() error {
		_, err := cnps.Create(ctx, cnp, metav1.CreateOptions{})
		return err
	}, func(dump string) bool { return strings.Contains(dump, "admin-web-ingress") })
	policyStep(t, h, "cluster policy reselected", update(func(p *npav1beta1.ClusterNetworkPolicy) {
		p.ResourceVersion = "2"
		p.Spec.Subject = ct.PodsSubject(ct.Sel(), ct.Sel("app", "db"))
	}), func(dump string) bool {
		return strings.Contains(dump, "x/b") && strings.Contains(dump, "admin-web-ingress")
	})
	policyStep(t, h, "cluster policy priority tied", update(func(p *npav1beta1.ClusterNetworkPolicy) {
		p.ResourceVersion = "3"
		p.Spec.Subject = ct.NamespacesSubject(ct.Sel())
		p.Spec.Egress = []npav1beta1.ClusterNetworkPolicyEgressRule{{Name: "internal", Action: npav1beta1.ClusterNetworkPolicyRuleActionDeny,
			To: []npav1beta1.ClusterNetworkPolicyEgressPeer{ct.ToNetworks("10.0.0.0/8")}}}
	}), func(dump string) bool { return strings.Contains(dump, "other (10), web (10)") })
	policyStep(t, h, "cluster policy moved to Baseline", update(func(p *npav1beta1.ClusterNetworkPolicy) {
		p.ResourceVersion = "4"
		p.Spec.Tier = npav1beta1.BaselineTier
		p.Spec.Priority = 20
	}), func(dump string) bool { return strings.Contains(dump, "web (Baseline, priority 20) ingress") })
	policyStep(t, h, "cluster policy deleted", func() error {
		return cnps.Delete(ctx, "web", metav1.DeleteOptions{})
	}, func(dump string) bool { return !strings.Contains(dump, "baseline-web-ingress") })
	eventually(t, "program refreshed", func() bool { return len(h.eval.Program().ClusterPolicies) == 1 })
}
