package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// The connection benchmark's modes and paths.
const (
	ModeControl = "control" // no table at all: the lab's bare data path
	ModeHybrid  = "hybrid"
	ModeQueue   = "queue"
	// ModeConntrack has no nftpolicy, only a forward chain that accepts
	// established connections: the cost of connection tracking alone,
	// which hybrid mode needs and the control lacks.
	ModeConntrack = "conntrack"
	// ModeHybridDenyLog is hybrid mode with the deny log on (the agent's
	// default): only drop rules change, so allowed connections must run
	// at hybrid's speed.
	ModeHybridDenyLog = "hybrid_denylog"
	// ModeHybridCNP is hybrid mode with ClusterNetworkPolicies in force
	// (cnpInput): 50 Admin and 50 Baseline policies whose subjects include
	// the bench pods, none of whose rules match the bench traffic, so every
	// connection walks the whole Admin tier before NetworkPolicy decides.
	ModeHybridCNP = "hybrid_cnp"
	// ModeHybridNoSV is hybrid mode without source-address validation
	// (--source-validation=false): hybrid_sv_vs_nosv, hybrid's rate over
	// this mode's round by round, is what the check costs connections.
	ModeHybridNoSV = "hybrid_nosv"
	// ModeHybridStaged is hybrid mode with the staged log on (the agent's
	// defaults) and a staged policy whose subjects are the bench pods
	// (stagedConnInput): every connection is between subjects of a staged
	// policy, so its first packet meets the staged log's rules and meter
	// (copied within the per-source budget, to a group no reader binds
	// here). hybrid_conn_ratio_staged is its rate against the control.
	ModeHybridStaged = "hybrid_staged"
	// ModeHybridStagedOther is hybrid mode with the staged log on and
	// staged policies whose subjects are other pods of both nodes
	// (stagedOtherConnInput), none of the bench pods: what staged policies
	// elsewhere on a node cost connections they cannot change.
	// hybrid_staged_other_vs_hybrid is its rate over hybrid's.
	ModeHybridStagedOther = "hybrid_staged_other"
	// ModeQueue2 is queue mode with two queues, the rule fanning out by
	// CPU, one reader thread each: what --queues 2 buys on two cores
	// (measure it with --workers 2; one client thread keeps one queue busy).
	ModeQueue2 = "queue_q2"
	// ModeQueueWide is queue mode with the per-source share of the queue
	// (RenderConfig.QueueSourceRate, --queue-source-rate) out of reach:
	// the decision path without that bound, beside queue mode with the
	// default share (30,000 new connections a second; one client thread
	// on an idle node opened some 14,600).
	ModeQueueWide = "queue_wide"

	PathSame  = "same" // client and server on node-1
	PathCross = "cross"
)

// queueWideSourceRate is ModeQueueWide's per-source share of the queue,
// new connections a second: beyond what one client thread opens.
const queueWideSourceRate = 1_000_000

// ConnModes and ConnPaths list them in report order.
var (
	ConnModes = []string{ModeControl, ModeConntrack, ModeHybrid, ModeHybridNoSV, ModeHybridDenyLog, ModeHybridCNP, ModeHybridStaged, ModeHybridStagedOther, ModeHybridVerify, ModeQueue, ModeQueueWide, ModeQueue2}
	ConnPaths = []string{PathSame, PathCross}
)

// connPort is the port the benchmark's servers listen on.
const connPort = 8080

// ConnConfig configures RunConn.
type ConnConfig struct {
	// Rounds of interleaved measurements: each round measures every mode on
	// every path once, the modes in a rotating order.
	Rounds int
	// Duration and MaxConns bound one measurement (one mode, one path).
	Duration time.Duration
	MaxConns int
	// Workers is the number of client threads, each with one connection in
	// flight; the server has as many accepting threads.
	Workers int
	// Timeout bounds one connection (connect and the read of its byte).
	Timeout time.Duration
	// Modes to measure besides control (default hybrid and queue).
	Modes []string
	// Reply makes the server answer each connection with one byte that
	// the client reads, from threads blocked in accept(2): the method of
	// the figures before the drain server (see server). The thread's
	// wake-up by the handshake's last ACK then runs inside the client's
	// timed connect (about 50 µs on an idle 2-vCPU VM, for the control as
	// for every mode), which inflates every latency and hides part of a
	// mode's own cost in the ratios.
	Reply bool
	// ClientExec is a binary that runs ConnClientMain when ConnClientEnv
	// is in its environment (nftbench itself): the client threads then run
	// in a process of their own, as a pod's processes do, and do not share
	// a Go runtime (its processors, scheduler and sysmon) with the
	// in-process agents' queue readers. Empty runs them in this process,
	// the method of the figures before the separate client.
	ClientExec string
	// Logf receives progress lines; nil means none.
	Logf func(format string, args ...any)
}

func (c *ConnConfig) defaults() {
	if c.Rounds <= 0 {
		c.Rounds = 40
	}
	if c.Duration <= 0 {
		c.Duration = 150 * time.Millisecond
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 50000
	}
	if c.Workers <= 0 {
		c.Workers = 1
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	modes := []string{ModeControl}
	for _, m := range ConnModes[1:] {
		if len(c.Modes) == 0 || slices.Contains(c.Modes, m) {
			modes = append(modes, m)
		}
	}
	if slices.Contains(c.Modes, ModeKNP) {
		modes = append(modes, ModeKNP)
	}
	c.Modes = modes
}

// sample is one measurement: one mode, one path, one round.
type sample struct {
	mode, path string
	round      int
	ok, failed int
	reasons    map[string]int
	err        error
	elapsed    time.Duration
	lat        []time.Duration // connect latencies of successful connections
	queued     []uint64        // packets read by each node's NFQUEUE runtime
	accepted   uint64          // connections the server accepted
}

func (s *sample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ok) / s.elapsed.Seconds()
}

// RunConn measures short TCP connections (connect, read one byte, close
// with RST) between two pods on one node and across two nodes, with no
// agent (control), in hybrid mode and in queue mode, in separate labs whose
// measurements are interleaved round by round.
func RunConn(ctx context.Context, cfg ConnConfig) (*Result, error) {
	cfg.defaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("conn: needs root (network namespaces, nftables, NFQUEUE)")
	}
	variant, err := queuerule.ProbeQueueVariant(ctx)
	if err != nil {
		return nil, fmt.Errorf("probing the queue variant: %w", err)
	}
	v := variant
	labs := map[string]*connLab{}
	defer func() {
		for _, l := range labs {
			l.close()
		}
	}()
	for _, m := range cfg.Modes {
		l, err := newConnLab(ctx, m, v, cfg.Workers, cfg.Reply)
		if err != nil {
			return nil, fmt.Errorf("%s lab: %w", m, err)
		}
		labs[m] = l
	}
	// Warm-up: caches, conntrack, page faults; not counted.
	for _, m := range cfg.Modes {
		for _, p := range ConnPaths {
			w := cfg
			w.Duration = 200 * time.Millisecond
			s := labs[m].measure(p, 0, w)
			if s.err != nil {
				return nil, fmt.Errorf("%s mode, %s path: %w", m, p, s.err)
			}
			if s.ok == 0 {
				return nil, fmt.Errorf("%s mode, %s path: no connection succeeded in the warm-up (%d failed)", m, p, s.failed)
			}
		}
	}
	var samples []*sample
	for r := 1; r <= cfg.Rounds; r++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for i := range cfg.Modes {
			m := cfg.Modes[(i+r)%len(cfg.Modes)]
			for j := range ConnPaths {
				p := ConnPaths[(j+r)%len(ConnPaths)]
				s := labs[m].measure(p, r, cfg)
				if s.err != nil {
					return nil, fmt.Errorf("%s mode, %s path: %w", m, p, s.err)
				}
				if s.failed > 0 {
					cfg.Logf("conn: %s mode, %s path, round %d: %d of %d connections failed: %v", m, p, r, s.failed, s.ok+s.failed, s.reasons)
				}
				samples = append(samples, s)
			}
		}
		if r%10 == 0 || r == cfg.Rounds {
			cfg.Logf("conn: round %d/%d done", r, cfg.Rounds)
		}
	}
	res := &Result{}
	res.Set("queue_variant", string(variant))
	res.Set("conn_rounds", cfg.Rounds)
	res.Set("conn_workers", cfg.Workers)
	res.Set("conn_measure_s", cfg.Duration.Seconds())
	res.Set("conn_reply", cfg.Reply)
	res.Set("conn_client_process", cfg.ClientExec != "")
	summarizeConn(res, samples, cfg.Rounds, cfg.Modes)
	summarizeVerify(res, samplesBy(samples), cfg.Rounds, cfg.Modes, labs[ModeHybridVerify])
	return res, nil
}

// summarizeConn turns the samples into name=value lines:
//
//	<mode>_rate_<path>          connections/s, median over rounds
//	<mode>_conn_ratio_<path>    median over rounds of rate / control's rate in the same round
//	<mode>_conn_ratio           median over rounds of the geometric mean of both paths' ratios
//	<mode>_conn_ratio_vs_conntrack  the same against the conntrack-only mode
//	<mode>_p50_us[_<path>]      connect latency percentiles (pooled over rounds; without a path: both paths)
//	<mode>_failed               failed connections
//	<mode>_accepted_per_conn    connections the server accepted per established one
//	queued_packets_per_conn[_<path>]  queue mode: packets the busiest node queued per connection
func summarizeConn(res *Result, samples []*sample, rounds int, modes []string) {
	by := samplesBy(samples)
	for _, m := range modes {
		var all []time.Duration
		failed, ok, accepted := 0, 0, uint64(0)
		for _, p := range ConnPaths {
			var rates, ratios []float64
			var lat []time.Duration
			var queued, conns float64
			for r := 1; r <= rounds; r++ {
				s, c := by[[3]any{m, p, r}], by[[3]any{ModeControl, p, r}]
				if s == nil || c == nil {
					continue
				}
				rates = append(rates, s.rate())
				if c.rate() > 0 {
					ratios = append(ratios, s.rate()/c.rate())
				}
				lat = append(lat, s.lat...)
				failed += s.failed
				ok += s.ok
				accepted += s.accepted
				var busiest uint64
				for _, q := range s.queued {
					busiest = max(busiest, q)
				}
				queued += float64(busiest)
				conns += float64(s.ok + s.failed)
			}
			all = append(all, lat...)
			res.Set(m+"_rate_"+p, round(Median(rates), 0))
			if m != ModeControl {
				res.Set(m+"_conn_ratio_"+p, round(Median(ratios), 3))
			}
			res.Set(m+"_p50_us_"+p, micros(Percentile(lat, 50)))
			res.Set(m+"_p99_us_"+p, micros(Percentile(lat, 99)))
			if m == ModeQueue && conns > 0 {
				res.Set("queued_packets_per_conn_"+p, round(queued/conns, 3))
			}
			if m == ModeQueue2 && conns > 0 {
				// Summed over the queues: the fanout splits a node's
				// connections between them.
				res.Set("queue_q2_queued_packets_per_conn_"+p, round(queued/conns, 3))
			}
		}
		if m != ModeControl {
			ratios := roundRatios(by, m, ModeControl, rounds)
			res.Set(m+"_conn_ratio", round(Median(ratios), 3))
			if len(ratios) > 0 {
				res.Set(m+"_conn_ratio_min", round(slices.Min(ratios), 3))
				res.Set(m+"_conn_ratio_max", round(slices.Max(ratios), 3))
			}
			if m != ModeConntrack && slices.Contains(modes, ModeConntrack) {
				res.Set(m+"_conn_ratio_vs_conntrack", round(Median(roundRatios(by, m, ModeConntrack, rounds)), 3))
			}
		}
		if m == ModeHybridCNP {
			res.Set("hybrid_conn_ratio_cnp", res.Float(m+"_conn_ratio"))
			if slices.Contains(modes, ModeHybrid) {
				res.Set("hybrid_cnp_vs_hybrid", round(Median(roundRatios(by, m, ModeHybrid, rounds)), 3))
			}
		}
		res.Set(m+"_p50_us", micros(Percentile(all, 50)))
		res.Set(m+"_p99_us", micros(Percentile(all, 99)))
		res.Set(m+"_failed", failed)
		if ok > 0 {
			res.Set(m+"_accepted_per_conn", round(float64(accepted)/float64(ok), 3))
		}
	}
	if slices.Contains(modes, ModeHybridDenyLog) {
		// The headline names: hybrid with the deny log against the control,
		// next to hybrid_conn_ratio, and against hybrid round by round.
		res.Set("hybrid_conn_ratio_denylog", res.Float(ModeHybridDenyLog+"_conn_ratio"))
		if slices.Contains(modes, ModeHybrid) {
			res.Set("hybrid_denylog_vs_hybrid", round(Median(roundRatios(by, ModeHybridDenyLog, ModeHybrid, rounds)), 3))
		}
	}
	if slices.Contains(modes, ModeHybridStaged) {
		res.Set("hybrid_conn_ratio_staged", res.Float(ModeHybridStaged+"_conn_ratio"))
		if slices.Contains(modes, ModeHybrid) {
			res.Set("hybrid_staged_vs_hybrid", round(Median(roundRatios(by, ModeHybridStaged, ModeHybrid, rounds)), 3))
		}
	}
	if slices.Contains(modes, ModeHybridStagedOther) {
		res.Set("hybrid_conn_ratio_staged_other", res.Float(ModeHybridStagedOther+"_conn_ratio"))
		if slices.Contains(modes, ModeHybrid) {
			res.Set("hybrid_staged_other_vs_hybrid", round(Median(roundRatios(by, ModeHybridStagedOther, ModeHybrid, rounds)), 3))
		}
	}
	if slices.Contains(modes, ModeHybridNoSV) && slices.Contains(modes, ModeHybrid) {
		// Above 1 is noise: the check only adds work.
		res.Set("hybrid_sv_vs_nosv", round(Median(roundRatios(by, ModeHybrid, ModeHybridNoSV, rounds)), 3))
	}
	if slices.Contains(modes, ModeQueue2) && slices.Contains(modes, ModeQueue) {
		res.Set("queue_q2_vs_queue", round(Median(roundRatios(by, ModeQueue2, ModeQueue, rounds)), 3))
	}
	if slices.Contains(modes, ModeKNP) {
		// Issue 30's names: nftpolicy's modes against the peer, round by round.
		for _, m := range []string{ModeHybrid, ModeQueue, ModeQueueWide} {
			if slices.Contains(modes, m) {
				res.Set(m+"_vs_knp_conn_ratio", round(Median(roundRatios(by, m, ModeKNP, rounds)), 3))
			}
		}
	}
	if slices.Contains(modes, ModeQueue) {
		q := math.Max(res.Float("queued_packets_per_conn_"+PathSame), res.Float("queued_packets_per_conn_"+PathCross))
		res.Set("queued_packets_per_conn", q)
	}
}

// samplesBy indexes samples by mode, path and round.
func samplesBy(samples []*sample) map[[3]any]*sample {
	by := map[[3]any]*sample{}
	for _, s := range samples {
		by[[3]any{s.mode, s.path, s.round}] = s
	}
	return by
}

// roundRatios returns, per round, the geometric mean over both paths of
// mode's rate divided by base's rate in the same round.
func roundRatios(by map[[3]any]*sample, mode, base string, rounds int) []float64 {
	var ratios []float64
	for r := 1; r <= rounds; r++ {
		g, n := 1.0, 0
		for _, p := range ConnPaths {
			s, c := by[[3]any{mode, p, r}], by[[3]any{base, p, r}]
			if s != nil && c != nil && c.rate() > 0 {
				g *= s.rate() / c.rate()
				n++
			}
		}
		if n > 0 {
			ratios = append(ratios, math.Pow(g, 1/float64(n)))
		}
	}
	return ratios
}

// connLab is one lab of the benchmark: two nodes, a client pod and a server
// on each node, enforced as mode says.
type connLab struct {
	mode    string
	lab     *netlab.Lab
	agents  []*inproc.Agent
	client  string             // client pod's namespace path
	servers map[string]*server // by path
	dst     map[string]netip.AddrPort
	// verify and stops: ModeHybridVerify's verifiers (connverify.go).
	verify *verify.Metrics
	stops  []func()
}

// The lab's pods: the client and one server on node-1, a server on node-2.
var (
	clientIP    = netip.MustParseAddr("10.244.1.10")
	sameSrvIP   = netip.MustParseAddr("10.244.1.20")
	crossSrvIP  = netip.MustParseAddr("10.244.2.20")
	benchNodes  = []string{"node-1", "node-2"}
	benchNSName = "bench"
)

// connInput is the API state every node compiles: both servers are isolated
// for ingress (allowed from the client on 8080), the client for egress
// (allowed to the servers on 8080).
func connInput(node string, nodeIPs []netip.Addr) compile.Input {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(connPort)
	pod := func(name, node string, ip netip.Addr, app string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: benchNSName, Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: connPort, Protocol: tcp}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}},
		}
	}
	sel := func(app string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	ports := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}
	return compile.Input{
		NodeName: node,
		NodeIPs:  nodeIPs,
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: benchNSName,
			Labels: map[string]string{compile.NamespaceNameLabel: benchNSName}}}},
		Pods: []*corev1.Pod{
			pod("client", "node-1", clientIP, "client"),
			pod("server-a", "node-1", sameSrvIP, "server"),
			pod("server-b", "node-2", crossSrvIP, "server"),
		},
		Policies: []*networkingv1.NetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Namespace: benchNSName, Name: "server-ingress"}, Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *sel("server"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("client")}}, Ports: ports}},
			}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: benchNSName, Name: "client-egress"}, Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *sel("client"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("server")}}, Ports: ports}},
			}},
		},
	}
}

// stagedConnInput is connInput with a staged policy that would isolate
// the bench pods both ways and allow what the bench does: the client and
// the servers are its subjects.
func stagedConnInput(node string, nodeIPs []netip.Addr) compile.Input {
	in := connInput(node, nodeIPs)
	np := in.Policies[0].DeepCopy()
	np.Name = "staged-all"
	np.Annotations = map[string]string{compile.StagedAnnotation: "true"}
	np.Spec.PodSelector = metav1.LabelSelector{}
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	in.Policies = append(in.Policies, np)
	return in
}

// stagedOtherConnInput is connInput with pods that are not the bench's on
// both nodes (addresses no bench connection uses) and two staged policies
// that would isolate them, one of each kind: the ruleset copies their
// first packets, and the bench pods' connections only pass the lookups
// that find they are not staged subjects.
func stagedOtherConnInput(node string, nodeIPs []netip.Addr) compile.Input {
	in := connInput(node, nodeIPs)
	for i, n := range benchNodes {
		p := in.Pods[0].DeepCopy()
		p.Name, p.Labels, p.Spec.NodeName = fmt.Sprintf("other-%d", i+1), map[string]string{"app": "other"}, n
		ip := fmt.Sprintf("10.244.%d.200", i+1)
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		in.Pods = append(in.Pods, p)
	}
	np := in.Policies[0].DeepCopy()
	np.Name = "staged-other"
	np.Annotations = map[string]string{compile.StagedAnnotation: "true"}
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	np.Spec.Ingress, np.Spec.Egress = nil, nil
	in.Policies = append(in.Policies, np)
	subject := compiletest.PodsSubject(compiletest.Sel(), compiletest.Sel("app", "other"))
	cnp := compiletest.CNP("staged-other", "Admin", 10, subject,
		compiletest.CNPEgress(compiletest.CNPRule("deny-all", "Deny", compiletest.ToNamespaces(compiletest.Sel()))))
	cnp.Annotations = map[string]string{compile.StagedAnnotation: "true"}
	in.ClusterPolicies = append(in.ClusterPolicies, cnp)
	return in
}

func newConnLab(ctx context.Context, mode string, variant compile.QueueVariant, workers int, reply bool) (_ *connLab, err error) {
	if mode == ModeKNP {
		return newKNPConnLab(ctx, workers, reply)
	}
	l := &connLab{mode: mode, servers: map[string]*server{}, dst: map[string]netip.AddrPort{
		PathSame:  netip.AddrPortFrom(sameSrvIP, connPort),
		PathCross: netip.AddrPortFrom(crossSrvIP, connPort),
	}}
	var specs []netlab.NodeSpec
	for _, n := range benchNodes {
		specs = append(specs, netlab.NodeSpec{Name: n})
	}
	if l.lab, err = netlab.New(netlab.Config{Prefix: netlab.RandomPrefix("npb" + mode[:1]), Nodes: specs}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	for _, p := range []netlab.PodSpec{
		{Name: "client", Node: "node-1", IPs: []netip.Addr{clientIP}},
		{Name: "server-a", Node: "node-1", IPs: []netip.Addr{sameSrvIP}},
		{Name: "server-b", Node: "node-2", IPs: []netip.Addr{crossSrvIP}},
	} {
		if err := l.lab.AddPod(p); err != nil {
			return nil, err
		}
	}
	if l.client, err = l.lab.NetnsPath(netlab.Pod("client")); err != nil {
		return nil, err
	}
	if !reply {
		// The client closes with FIN (see runClient); its ports in
		// TIME_WAIT are reused for new connections after a second.
		if out, err := l.lab.Exec(netlab.Pod("client"), "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"); err != nil {
			return nil, fmt.Errorf("client tcp_tw_reuse: %v: %s", err, out)
		}
	}
	for path, name := range map[string]string{PathSame: "server-a", PathCross: "server-b"} {
		s, err := startServer(l.lab, netlab.Pod(name), connPort, workers, reply)
		if err != nil {
			return nil, err
		}
		l.servers[path] = s
	}
	switch mode {
	case ModeControl:
		return l, nil
	case ModeConntrack:
		const table = "table inet nftbench-ct {\n\tchain forward {\n\t\ttype filter hook forward priority filter - 5; policy accept;\n\t\tct state established,related accept\n\t}\n}\n"
		for _, n := range benchNodes {
			if out, err := l.lab.NodeExecInput(n, []byte(table), "nft", "-f", "-"); err != nil {
				return nil, fmt.Errorf("conntrack table on %s: %v: %s", n, err, out)
			}
		}
		return l, nil
	}
	rcfg := compile.RenderConfig{Mode: compile.Mode(mode), QueueVariant: variant}
	input := connInput
	if mode == ModeHybridCNP {
		rcfg.Mode, input = compile.ModeHybrid, cnpInput
	}
	if mode == ModeHybridDenyLog {
		// The agent's defaults (--deny-log-group, --deny-log-kernel-rate).
		rcfg.Mode, rcfg.DenyLogGroup = compile.ModeHybrid, 100
	}
	if mode == ModeQueue2 {
		rcfg.Mode, rcfg.Queues = compile.ModeQueue, 2
	}
	if mode == ModeQueueWide {
		rcfg.Mode, rcfg.QueueSourceRate = compile.ModeQueue, queueWideSourceRate
	}
	if mode == ModeHybridStaged {
		// The agent's defaults (--staged-log-group, its kernel rates).
		rcfg.Mode, rcfg.StagedLogGroup, input = compile.ModeHybrid, 101, stagedConnInput
	}
	if mode == ModeHybridStagedOther {
		rcfg.Mode, rcfg.StagedLogGroup, input = compile.ModeHybrid, 101, stagedOtherConnInput
	}
	if mode == ModeHybridNoSV {
		rcfg.Mode, rcfg.NoSourceValidation = compile.ModeHybrid, true
	}
	if mode == ModeHybridVerify {
		verifyRender(&rcfg)
	}
	rcfg.Defaults()
	if err := rcfg.Validate(); err != nil {
		return nil, err
	}
	for _, n := range benchNodes {
		a, err := newConnAgent(ctx, l.lab, n, rcfg, input)
		if err != nil {
			return nil, err
		}
		l.agents = append(l.agents, a)
	}
	if mode == ModeHybridVerify {
		return l, l.startVerifiers(ctx)
	}
	return l, nil
}

func (l *connLab) close() {
	// The servers first: ModeKNP's stop removes their namespaces.
	for _, s := range l.servers {
		s.stop()
	}
	for _, stop := range l.stops {
		stop()
	}
	for _, a := range l.agents {
		_ = a.Close()
	}
	if l.lab != nil {
		_ = l.lab.Close()
	}
}

// measure runs cfg.Workers clients against the path's server until
// cfg.Duration has passed or cfg.MaxConns connections were made.
func (l *connLab) measure(path string, round int, cfg ConnConfig) *sample {
	s := &sample{mode: l.mode, path: path, round: round}
	before := l.queued()
	srv := l.servers[path]
	accepted := srv.accepted.Load()
	var run clientsResult
	if cfg.ClientExec != "" {
		var err error
		if run, err = execClients(cfg.ClientExec, l.client, l.dst[path], cfg); err != nil {
			s.err = err
			return s
		}
	} else {
		run = runClients(l.client, l.dst[path], cfg.Duration, cfg.MaxConns, cfg.Workers, cfg.Timeout, cfg.Reply)
	}
	s.elapsed = run.elapsed
	s.reasons = map[string]int{}
	for _, r := range run.threads {
		if r.err != nil {
			s.err = r.err
		}
		s.ok += r.ok
		s.failed += r.failed
		s.lat = append(s.lat, r.lat...)
		for k, v := range r.reasons {
			s.reasons[k] += v
		}
	}
	after := l.queued()
	for i := range after {
		s.queued = append(s.queued, after[i]-before[i])
	}
	if s.err == nil && s.ok > 0 {
		// The connections the client saw established reach the server's
		// accept queue unless the client's RST overtook its last ACK: in
		// queue mode the ACK leaves from the context that re-injected the
		// SYN (the reader's CPU), the RST from the client's, through
		// different per-CPU backlogs. None reaching it is a broken path.
		s.accepted = srv.waitAccepted(accepted+uint64(s.ok), time.Second) - accepted
		if s.accepted == 0 {
			s.err = fmt.Errorf("the server accepted none of the %d connections the client established", s.ok)
		}
	}
	return s
}

// queued returns the packets each node's NFQUEUE runtime has read.
func (l *connLab) queued() []uint64 {
	out := make([]uint64, len(l.agents))
	for i, a := range l.agents {
		if a.Runtime != nil {
			out[i] = a.Runtime.Stats().Received
		}
	}
	return out
}

type clientResult struct {
	ok, failed int
	lat        []time.Duration
	reasons    map[string]int // failed connections by error
	err        error
}

// runClient opens connections one after the other from the client pod's
// namespace: blocking connect (timed), then close. By default the close
// is a FIN, and the pod's tcp_tw_reuse lets ports in TIME_WAIT serve new
// connections a second later. An RST (SO_LINGER 0) right after connect
// can overtake the handshake's last ACK when the two leave from different
// CPUs (in queue mode the ACK leaves from the reader's, which re-injected
// the SYN), and the server then never accepts the connection: measured
// with a client process, queue_accepted_per_conn 0.99 and
// queued_packets_per_conn 0.999 with RST, 1 and 1 with FIN. A FIN carries
// the same acknowledgement, so its overtaking the ACK loses nothing. With reply the
// method of the older figures: read the server's one byte, close with
// SO_LINGER 0. It runs on an OS thread switched into the pod's namespace
// for good: the thread is never unlocked, so the Go runtime discards it
// when the goroutine ends.
func runClient(nsPath string, dst netip.AddrPort, deadline time.Time, budget *atomic.Int64, timeout time.Duration, capacity int, reply bool) (res clientResult) {
	if res.err = netlab.EnterNetnsForGood(nsPath); res.err != nil {
		return res
	}
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	linger := &unix.Linger{Onoff: 1, Linger: 0}
	res.lat = make([]time.Duration, 0, min(capacity, 1<<16))
	var buf [1]byte
	for time.Now().Before(deadline) && budget.Add(-1) >= 0 {
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			res.err = err
			return res
		}
		if reply {
			_ = unix.SetsockoptLinger(s, unix.SOL_SOCKET, unix.SO_LINGER, linger)
		}
		_ = unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv) // bounds connect
		_ = unix.SetsockoptTimeval(s, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		t0 := time.Now()
		err = connect(s, sa, timeout)
		d := time.Since(t0)
		if err == nil && reply {
			var n int
			for {
				n, err = unix.Read(s, buf[:])
				if err != unix.EINTR {
					break
				}
			}
			if err == nil && n != 1 {
				err = errors.New("no byte")
			}
		}
		unix.Close(s)
		if err != nil {
			res.failed++
			if res.reasons == nil {
				res.reasons = map[string]int{}
			}
			res.reasons[err.Error()]++
			continue
		}
		res.ok++
		res.lat = append(res.lat, d)
	}
	return res
}

// connect is a blocking connect(2) that survives signals: the Go runtime
// preempts threads with SIGURG, which interrupts connect with EINTR while
// the handshake goes on; then wait for its end with poll(2).
func connect(s int, sa unix.Sockaddr, timeout time.Duration) error {
	err := unix.Connect(s, sa)
	if err != unix.EINTR {
		return err
	}
	end := time.Now().Add(timeout)
	for {
		left := time.Until(end)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(s), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		if v, err := unix.GetsockoptInt(s, unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
			return err
		} else if v != 0 {
			return unix.Errno(v)
		}
		return nil
	}
}

// server accepts on one port of a pod and closes each connection. By
// default its one thread drains the accept queue every drainInterval,
// sleeping in between: no thread waits in accept(2), so the handshake's
// last ACK wakes nobody and the client's timed connect holds only the
// kernel's path (and the policy's). With reply, its threads make blocking
// accept calls and write one byte to each connection; each connection
// then wakes one of them from within the client's connect.
type server struct {
	fd       int
	accepted atomic.Uint64
	// emptyPasses counts the drain passes that found the queue empty.
	emptyPasses atomic.Uint64
	wg          sync.WaitGroup
	stopped     atomic.Bool
}

// drainInterval is the drain server's period: at the benchmark's rates
// (up to 20,000 connections a second) a few dozen connections wait in the
// accept queue (4096 long).
const drainInterval = time.Millisecond

func startServer(lab *netlab.Lab, ep netlab.Endpoint, port, threads int, reply bool) (*server, error) {
	s := &server{fd: -1}
	err := lab.InNetns(ep, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		s.fd = fd
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			return err
		}
		if !reply {
			if err := unix.SetNonblock(fd, true); err != nil {
				return err
			}
		}
		return unix.Listen(fd, 4096)
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		return nil, fmt.Errorf("server in %v: %w", ep, err)
	}
	if !reply {
		threads = 1
	}
	for i := 0; i < threads; i++ {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if reply {
				s.answer()
			} else {
				s.drain()
			}
		}()
	}
	return s, nil
}

// answer accepts with blocking calls and writes one byte to each
// connection, until the socket is shut down.
func (s *server) answer() {
	one := []byte{'x'}
	for {
		c, _, err := unix.Accept4(s.fd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED || err == unix.EMFILE {
			continue
		}
		if err != nil {
			return // shut down
		}
		s.accepted.Add(1)
		_, _ = unix.Write(c, one)
		unix.Close(c)
	}
}

// drain accepts and closes whatever waits in the accept queue every
// drainInterval, until stop. A connection the client already reset is
// still in the queue and counted.
func (s *server) drain() {
	ts := unix.NsecToTimespec(drainInterval.Nanoseconds())
	for !s.stopped.Load() {
		for n := 0; ; n++ {
			c, _, err := unix.Accept4(s.fd, unix.SOCK_CLOEXEC)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil { // EAGAIN: empty
				if n == 0 {
					s.emptyPasses.Add(1)
				}
				break
			}
			s.accepted.Add(1)
			unix.Close(c)
		}
		_ = unix.Nanosleep(&ts, nil)
	}
}

// waitAccepted waits until the server has accepted want connections in all,
// two drain passes found its queue empty (the missing ones will not come;
// with reply, until timeout) or timeout passed, and returns the count.
func (s *server) waitAccepted(want uint64, timeout time.Duration) uint64 {
	end := time.Now().Add(timeout)
	empty := s.emptyPasses.Load()
	for s.accepted.Load() < want && s.emptyPasses.Load() < empty+2 && time.Now().Before(end) {
		time.Sleep(drainInterval)
	}
	return s.accepted.Load()
}

func (s *server) stop() {
	// shutdown(2) wakes the threads blocked in accept; the drain thread
	// sees stopped within drainInterval.
	s.stopped.Store(true)
	_ = unix.Shutdown(s.fd, unix.SHUT_RDWR)
	s.wg.Wait()
	unix.Close(s.fd)
}

// newConnAgent starts the in-process agent of node and commits the
// benchmark's policies (connInput) there.
func newConnAgent(ctx context.Context, lab *netlab.Lab, node string, rcfg compile.RenderConfig,
	input func(node string, nodeIPs []netip.Addr) compile.Input) (_ *inproc.Agent, err error) {
	a, err := inproc.New(lab, node, rcfg, quiet)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = a.Close()
		}
	}()
	ips, err := lab.IPs(netlab.Node(node))
	if err != nil {
		return nil, err
	}
	if _, err := a.Apply(ctx, compile.Build(input(node, ips)), nil, false); err != nil {
		return nil, err
	}
	return a, nil
}

// cnpInput is connInput with ClusterNetworkPolicies in force: 50 Admin and
// 50 Baseline policies, each applying to the bench pods and to pods of its
// own namespace, with an egress and an ingress rule about that namespace
// and a port the bench does not use. None matches the bench traffic: each
// connection walks all 50 Admin policies on both sides before the
// NetworkPolicies decide, the case kube-network-policies sends to
// userspace.
func cnpInput(node string, nodeIPs []netip.Addr) compile.Input {
	in := connInput(node, nodeIPs)
	for i := range 50 {
		ns := fmt.Sprintf("team-%02d", i)
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{compile.NamespaceNameLabel: ns, "team": ns}}})
		in.Pods = append(in.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app", Labels: map[string]string{"app": "team"}},
			Spec:       corev1.PodSpec{NodeName: "node-2"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.244.9.%d", i+1)}}},
		})
		for _, tier := range []string{"Admin", "Baseline"} {
			subject := compiletest.PodsSubject(metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: compile.NamespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{benchNSName, ns}}}}, compiletest.Sel())
			team := compiletest.ToNamespaces(compiletest.Sel("team", ns))
			port := compiletest.Proto("TCP", int32(9000+i))
			in.ClusterPolicies = append(in.ClusterPolicies, compiletest.CNP(fmt.Sprintf("%s-%s", strings.ToLower(tier), ns), tier, int32(i), subject,
				compiletest.CNPEgress(compiletest.CNPRule("no-"+ns, "Deny", team).On(port)),
				compiletest.CNPIngress(compiletest.CNPRule("from-"+ns, "Deny", team).On(port))))
		}
	}
	return in
}
