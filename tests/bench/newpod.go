package bench

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	ct "github.com/ti-mo/conntrack"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
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
	var flows []ct.Flow
	for _, node := range l.Nodes() {
		f, err := l.Conntrack(node)
		if err != nil {
			return nil, err
		}
		flows = append(flows, f...)
	}
	leaked, failed, delays, err := countNewPods(rep.Outcomes, flows)
	if err != nil {
		return nil, err
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

// countNewPods counts the new-pod window's outcomes: leaked are the
// denied connections that got through plus the conntrack entries (flows,
// of every node) whose source is a denied pod whose connection failed
// (packets admitted on part of the way); failed the allowed connections
// that failed; delays the connect times of the allowed ones. A harness
// problem (an outcome's Err) is returned as the error.
func countNewPods(outs []lab.Outcome, flows []ct.Flow) (leaked, failed int, delays []time.Duration, err error) {
	denied := map[netip.Addr]bool{}
	for _, o := range outs {
		switch {
		case o.Err != nil:
			return 0, 0, nil, o.Err
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
	for _, f := range flows {
		if denied[f.TupleOrig.IP.SourceAddress] {
			leaked++
		}
	}
	return leaked, failed, delays, nil
}

// NewPodWindowConfig configures RunNewPodWindow.
type NewPodWindowConfig struct {
	// Enforcer is every node's agent: nftpolicy in hybrid mode (empty) or
	// kube-network-policies.
	Enforcer cluster.Enforcer
	// Pods and InformerDelay are RunNewPod's: new pods of the workload
	// (lab.NewPodWorkload), and how long after a pod's interface is up its
	// API object is created.
	Pods          int
	InformerDelay time.Duration
	Logf          func(format string, args ...any)
}

func (c *NewPodWindowConfig) defaults() {
	if c.Pods <= 0 {
		c.Pods = 100
	}
	if c.InformerDelay <= 0 {
		c.InformerDelay = 30 * time.Millisecond
	}
	if c.Enforcer == "" {
		c.Enforcer = cluster.EnforcerNftpolicy
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// RunNewPodWindow (root, issue 30) runs RunNewPod's new-pod workload
// (lab.NewPodWorkload, lab.NewPodPolicyObjects) on the real-API lab, so
// that kube-network-policies can be the enforcer: two nodes with real
// agents, x/srv on node-1; each new pod's interface comes up and it
// connects at once, and its API object is created (and reported Running)
// InformerDelay later, so the agents learn it through their watch after
// that. Figures as RunNewPod's, prefixed knp_ for the peer:
// new_pod_leaked_packets (counted by countNewPods), new_pod_allowed_failed,
// new_pod_first_packet_delay_ms_p50/_p99.
func RunNewPodWindow(ctx context.Context, cfg NewPodWindowConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("newpod-"+cfg.Enforcer.String(), func(tb *cluster.ProgramTB, res *Result) error {
		return runNewPodWindow(ctx, tb, cfg, res)
	})
}

func runNewPodWindow(ctx context.Context, tb *cluster.ProgramTB, cfg NewPodWindowConfig, res *Result) error {
	var args []string
	if cfg.Enforcer == cluster.EnforcerNftpolicy {
		// The unknown-pod path needs the pod ranges, which a real cluster's
		// Nodes carry and the harness's do not.
		args = []string{"--pod-cidrs=" + cluster.PodRange.String()}
	}
	c := cluster.Start(tb, cluster.Config{Enforcer: cfg.Enforcer, Mode: compile.ModeHybrid, AgentArgs: args, Verbosity: 1, Logf: cfg.Logf})
	for _, ns := range []string{"x", "new"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			return err
		}
	}
	nodes := c.Nodes()
	if _, err := c.CreatePod(ctx, cluster.Pod{Namespace: "x", Name: "srv", Node: nodes[0], Labels: map[string]string{"app": "srv"},
		Ports: []corev1.ContainerPort{{ContainerPort: 80, Protocol: corev1.ProtocolTCP}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}); err != nil {
		return err
	}
	srv := c.PodIPs("x/srv")[0]
	for _, np := range lab.NewPodPolicyObjects() {
		if _, err := c.ApplyPolicy(ctx, np); err != nil {
			return err
		}
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	cfg.Logf("new pods (%s): %d, API object %v after the interface", cfg.Enforcer, cfg.Pods, cfg.InformerDelay)
	outs := make([]lab.Outcome, cfg.Pods)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range cfg.Pods {
		w := lab.NewPodWorkload(i)
		node := nodes[w.Node%len(nodes)]
		sp, err := c.StartPod(cluster.Pod{Namespace: "new", Name: w.Name, Node: node, Labels: w.Labels})
		if err != nil {
			return err
		}
		from, err := c.PodEndpoint(sp.Key())
		if err != nil {
			return err
		}
		o := lab.Outcome{Index: i, Src: c.PodIPs(sp.Key())[0], SrcNode: node, DstNode: nodes[0], Want: w.Want, WantReason: w.WantReason, Probe: w.Probe}
		proto := netlab.TCP
		if w.Probe.Protocol == "UDP" {
			proto = netlab.UDP
		}
		o.ProbeReq = netlab.ProbeReq{From: from, To: srv, Port: uint16(w.Probe.Port), Proto: proto, Timeout: lab.NewPodProbeTimeout}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.ProbeResult = c.Lab.ProbeOne(ctx, o.ProbeReq)
			outs[i] = o
		}()
		time.Sleep(cfg.InformerDelay)
		if _, err := c.PublishPod(ctx, sp); err != nil {
			return err
		}
	}
	wg.Wait()
	var flows []ct.Flow
	for _, n := range nodes {
		f, err := c.Conntrack(n)
		if err != nil {
			return err
		}
		flows = append(flows, f...)
	}
	leaked, failed, delays, err := countNewPods(outs, flows)
	if err != nil {
		return err
	}
	p := ""
	if c.Enforcer() == cluster.EnforcerKNP {
		p = "knp_"
	}
	res.Set(p+"new_pod_leaked_packets", leaked)
	res.Set(p+"new_pod_allowed_failed", failed)
	res.Set(p+"new_pod_first_packet_delay_ms_p50", millis(Percentile(delays, 50)))
	res.Set(p+"new_pod_first_packet_delay_ms_p99", millis(Percentile(delays, 99)))
	res.Set(p+"new_pod_pods", cfg.Pods)
	return nil
}
