package e2e_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/e2e"
)

// TestListDisagreements forces a disagreement (real packets said allowed
// where x/a admits ingress on 81/TCP only and the probe went to 80/TCP)
// and checks the line hack/compare.sh collects: its prefix, the verdicts,
// and `nftpolicy explain`'s explanation: the deciding reason naming the
// policy and the nearest miss (the port). An agreeing run lists nothing.
func TestListDisagreements(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(81)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a-on-81"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		}}
	prog := compile.Build(ct.GridState{Pods: ct.GridPods()}.Input([]*networkingv1.NetworkPolicy{np}, nil))
	d := e2e.ExplainDisagreement(prog, "kube-network-policies", "case 99 step 1", "y/b -> x/a 80/TCP",
		ct.GridIP("y/b"), ct.GridIP("x/a"), compile.ProtoTCP, 80, false, true)

	var b strings.Builder
	if err := e2e.ListDisagreements(&b, []e2e.Disagreement{d}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("%s", out)
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, e2e.DisagreementPrefix) {
		t.Fatalf("want one line starting %q, got %q", e2e.DisagreementPrefix, out)
	}
	for _, want := range []string{
		"kube-network-policies: case 99 step 1: y/b -> x/a 80/TCP: want denied, real packets allowed",
		"explain: denied (egress allowed: ",
		"ingress denied: ",
		"x/a-on-81",
		"nearest miss: ingress ",
		": port: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the listing lacks %q", want)
		}
	}
	b.Reset()
	if err := e2e.ListDisagreements(&b, nil); err != nil || b.Len() != 0 {
		t.Errorf("no disagreement listed %q (err %v), want nothing", b.String(), err)
	}
}
