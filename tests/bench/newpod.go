package bench

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// NewPodConfig configures RunNewPod.
type NewPodConfig struct {
	// Pods is how many new pods are created, one after another.
	Pods int
	// InformerDelay is how long after a pod's interface is up the agents
	// learn about it.
	InformerDelay time.Duration
	// Revocations is how many established clients are cut by a label
	// change, one per change (each with a TCP and a UDP flow).
	Revocations int
	Logf        func(format string, args ...any)
}

// RunNewPod measures the two windows the agent closes: pods that send
// before it knows them (new_pod_leaked_packets: connections the policies
// deny that got through, and new_pod_first_packet_delay_ms_p99 for the
// allowed ones) and flows a policy change denies (revocation_ms_p99: from
// the change to the flow's last record at the server).
func RunNewPod(ctx context.Context, cfg NewPodConfig) (*Result, error) {
	res := &Result{}
	l, err := lab.New(ctx, nil, lab.Config{Revoke: true})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	l.NewPodPolicies()
	srv := lab.PodSpec{Namespace: "x", Name: "srv", IP: lab.PodIP(0, 0), Labels: map[string]string{"app": "srv"},
		TCPPorts: []uint16{80}, UDPPorts: []uint16{53}}
	if err := l.StartPod(srv); err != nil {
		return nil, err
	}
	l.Know(srv)
	if err := l.Publish(ctx); err != nil {
		return nil, err
	}
	cfg.Logf("new pods: %d, informer delay %v", cfg.Pods, cfg.InformerDelay)
	rep, err := l.RunNewPods(ctx, srv.IP, cfg.Pods, cfg.InformerDelay)
	if err != nil {
		return nil, err
	}
	leaked, failed := 0, 0
	var delays []time.Duration
	denied := map[netip.Addr]bool{}
	for _, o := range rep.Outcomes {
		switch {
		case o.Err != nil:
			return nil, o.Err
		case !o.Want && o.Connected:
			leaked++
		case !o.Want:
			denied[o.Src] = true
		case o.Connected:
			delays = append(delays, o.Duration)
		default:
			failed++
		}
	}
	for _, node := range l.Nodes() {
		flows, err := l.Conntrack(node)
		if err != nil {
			return nil, err
		}
		for _, f := range flows {
			if denied[f.TupleOrig.IP.SourceAddress] {
				leaked++
			}
		}
	}
	res.Set("new_pod_leaked_packets", leaked)
	res.Set("new_pod_allowed_failed", failed)
	res.Set("new_pod_first_packet_delay_ms_p50", millis(Percentile(delays, 50)))
	res.Set("new_pod_first_packet_delay_ms_p99", millis(Percentile(delays, 99)))

	// Revocation: clients c<i> (role=client, on alternating nodes) stream to
	// x/srv, which admits role=client only; each round relabels one.
	cfg.Logf("revocation: %d label changes", cfg.Revocations)
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "srv-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *lab.MatchLabels("app", "srv"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{}, PodSelector: lab.MatchLabels("role", "client")}}}}}})
	fs, err := lab.StartFlowServer(l.Net(), srv.Endpoint(), srv.IP)
	if err != nil {
		return nil, err
	}
	defer fs.Close()
	flowCtx, stop := context.WithCancel(ctx)
	defer stop()
	var clients []lab.PodSpec
	for i := 0; i < cfg.Revocations; i++ {
		c := lab.PodSpec{Namespace: "y", Name: fmt.Sprintf("c%03d", i), Node: i % 2, IP: lab.PodIP(i%2, 200+i/2),
			Labels: map[string]string{"role": "client"}}
		if err := l.StartPod(c); err != nil {
			return nil, err
		}
		l.Know(c)
		clients = append(clients, c)
	}
	l.Namespace("y", nil)
	if err := l.Publish(ctx); err != nil {
		return nil, err
	}
	for _, c := range clients {
		if err := lab.StartFlows(flowCtx, l.Net(), c.Endpoint(), srv.IP); err != nil {
			return nil, err
		}
	}
	time.Sleep(500 * time.Millisecond)
	var stops []time.Duration
	for _, c := range clients {
		c.Labels = map[string]string{"role": "gone"}
		l.Know(c)
		changed := time.Now()
		if err := l.Publish(ctx); err != nil {
			return nil, err
		}
		time.Sleep(300 * time.Millisecond)
		for _, proto := range []string{"tcp", "udp"} {
			last, _, _ := fs.Log(proto, c.IP).Snapshot()
			stops = append(stops, max(last.Sub(changed), 0))
		}
	}
	time.Sleep(time.Second) // any flow still going would show now
	for i, c := range clients {
		last, _, _ := fs.Log("udp", c.IP).Snapshot()
		if time.Since(last) < 900*time.Millisecond {
			return nil, fmt.Errorf("client %s still flowing after revocation", clients[i].Name)
		}
	}
	res.Set("revocation_ms_p50", millis(Percentile(stops, 50)))
	res.Set("revocation_ms_p99", millis(Percentile(stops, 99)))
	return res, nil
}
