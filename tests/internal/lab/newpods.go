package lab

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// RunNewPods creates n pods in namespace "new", one after another,
// alternating nodes, half of them role=client; each makes one connection
// to srv (TCP 80 or UDP 53, alternating) the moment its interface is up,
// and the agents learn the pod informerDelay later (one Publish per pod).
// With an IPv6 srv the pods are dual-stack and connect over IPv6. It
// returns when every connection has succeeded or timed out.
func (l *Lab) RunNewPods(ctx context.Context, srv netip.Addr, n int, informerDelay time.Duration) (*Report, error) {
	outs := make([]Outcome, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; i < n; i++ {
		p := PodSpec{Namespace: "new", Name: fmt.Sprintf("p%03d", i), Node: i % 2, IP: PodIP(i%2, 1+i/2), Labels: map[string]string{}}
		src := p.IP
		if srv.Is6() {
			p.IPv6 = PodIPv6(i%2, 1+i/2)
			src = p.IPv6
		}
		o := Outcome{Index: i, Src: src, SrcNode: DefaultNodes[p.Node], Want: (i/2)%2 == 0, WantReason: "not role=client: default-deny egress"}
		o.Probe = scenario.Probe{From: scenario.Endpoint{Pod: p.Key()}, To: scenario.Endpoint{IP: srv.String()}, Port: 80, Protocol: "TCP"}
		if o.Want {
			p.Labels["role"] = "client"
			o.WantReason = "role=client may reach x/srv"
		}
		if (i/4)%2 == 1 {
			o.Probe.Port, o.Probe.Protocol = 53, "UDP"
		}
		o.ProbeReq = netlab.ProbeReq{From: p.Endpoint(), To: srv, Port: uint16(o.Probe.Port), Proto: netlabProto(o.Probe.ProbeProtocol()), Timeout: 8 * time.Second}
		if err := l.StartPod(p); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.ProbeResult = l.net.ProbeOne(ctx, o.ProbeReq)
			outs[i] = o
		}()
		time.Sleep(informerDelay)
		l.Know(p)
		if err := l.Publish(ctx); err != nil {
			return nil, err
		}
	}
	wg.Wait()
	return l.report(outs), nil
}

func ports(tcp, udp int32) []networkingv1.NetworkPolicyPort {
	t, u := corev1.ProtocolTCP, corev1.ProtocolUDP
	return []networkingv1.NetworkPolicyPort{{Protocol: &t, Port: ptrTo(intstr.FromInt32(tcp))}, {Protocol: &u, Port: ptrTo(intstr.FromInt32(udp))}}
}

func ptrTo[T any](v T) *T { return &v }

// NewPodPolicies sets the policies RunNewPods expects: pods of namespace "new" may only reach x/srv, and only
// with role=client. Only the new pod's own egress denies the others: a pod
// the agent does not know yet would be unrestricted without the unknown-pod
// path (an allow-list on x/srv's ingress would fail closed for it anyway).
func (l *Lab) NewPodPolicies() {
	l.Namespace("x", nil)
	l.Namespace("new", nil)
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "default-deny-egress"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "clients-to-srv"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *MatchLabels("role", "client"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: MatchLabels("kubernetes.io/metadata.name", "x"), PodSelector: MatchLabels("app", "srv")}}, Ports: ports(80, 53)}}}})
}
