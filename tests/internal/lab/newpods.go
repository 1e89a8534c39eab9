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

// NewPod is pod i of the new-pod workload (RunNewPods; tests/bench runs the
// same workload on the real-API lab to compare enforcers): in namespace
// "new", on DefaultNodes[Node], with Labels; it connects to the server
// with Probe's port and protocol the moment its interface is up, and Want
// says whether the policies of NewPodPolicyObjects allow it, WantReason
// why.
type NewPod struct {
	Name       string
	Node       int
	Labels     map[string]string
	Probe      scenario.Probe
	Want       bool
	WantReason string
}

// NewPodWorkload returns pod i of the workload: alternating nodes, half of
// them role=client (allowed), TCP 80 and UDP 53 alternating; the probe's
// To is left for the caller (the server's address).
func NewPodWorkload(i int) NewPod {
	p := NewPod{Name: fmt.Sprintf("p%03d", i), Node: i % 2, Labels: map[string]string{}, Want: (i/2)%2 == 0,
		WantReason: "not role=client: default-deny egress"}
	p.Probe = scenario.Probe{From: scenario.Endpoint{Pod: "new/" + p.Name}, Port: 80, Protocol: "TCP"}
	if p.Want {
		p.Labels["role"] = "client"
		p.WantReason = "role=client may reach x/srv"
	}
	if (i/4)%2 == 1 {
		p.Probe.Port, p.Probe.Protocol = 53, "UDP"
	}
	return p
}

// RunNewPods creates n pods of NewPodWorkload one after another; each
// makes one connection to srv the moment its interface is up, and the
// agents learn the pod informerDelay later (one Publish per pod). With an
// IPv6 srv the pods are dual-stack and connect over IPv6. It returns when
// every connection has succeeded or timed out.
func (l *Lab) RunNewPods(ctx context.Context, srv netip.Addr, n int, informerDelay time.Duration) (*Report, error) {
	outs := make([]Outcome, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; i < n; i++ {
		w := NewPodWorkload(i)
		p := PodSpec{Namespace: "new", Name: w.Name, Node: w.Node, IP: PodIP(w.Node, 1+i/2), Labels: w.Labels}
		src := p.IP
		if srv.Is6() {
			p.IPv6 = PodIPv6(w.Node, 1+i/2)
			src = p.IPv6
		}
		o := Outcome{Index: i, Src: src, SrcNode: DefaultNodes[p.Node], Want: w.Want, WantReason: w.WantReason, Probe: w.Probe}
		o.Probe.To = scenario.Endpoint{IP: srv.String()}
		o.ProbeReq = netlab.ProbeReq{From: p.Endpoint(), To: srv, Port: uint16(o.Probe.Port), Proto: netlabProto(o.Probe.ProbeProtocol()), Timeout: NewPodProbeTimeout}
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

// NewPodProbeTimeout bounds a new pod's connection: long enough for an
// allowed one held until its pod is programmed.
const NewPodProbeTimeout = 8 * time.Second

func ports(tcp, udp int32) []networkingv1.NetworkPolicyPort {
	t, u := corev1.ProtocolTCP, corev1.ProtocolUDP
	return []networkingv1.NetworkPolicyPort{{Protocol: &t, Port: ptrTo(intstr.FromInt32(tcp))}, {Protocol: &u, Port: ptrTo(intstr.FromInt32(udp))}}
}

func ptrTo[T any](v T) *T { return &v }

// NewPodPolicies sets the policies of NewPodPolicyObjects, which RunNewPods expects.
func (l *Lab) NewPodPolicies() {
	l.Namespace("x", nil)
	l.Namespace("new", nil)
	for _, np := range NewPodPolicyObjects() {
		l.SetPolicy(np)
	}
}

// NewPodPolicyObjects are the new-pod workload's policies: pods of
// namespace "new" may only reach x/srv (app=srv), and only with
// role=client. Only the new pod's own egress denies the others: a pod the
// agent does not know yet would be unrestricted without the unknown-pod
// path (an allow-list on x/srv's ingress would fail closed for it anyway).
func NewPodPolicyObjects() []*networkingv1.NetworkPolicy {
	return []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "default-deny-egress"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "new", Name: "clients-to-srv"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *MatchLabels("role", "client"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: MatchLabels("kubernetes.io/metadata.name", "x"), PodSelector: MatchLabels("app", "srv")}}, Ports: ports(80, 53)}}}},
	}
}
