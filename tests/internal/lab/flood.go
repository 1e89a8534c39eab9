package lab

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// QueueFloodConfig configures RunQueueFlood.
type QueueFloodConfig struct {
	// FailOpen runs the agents with --fail-open.
	FailOpen bool
	// Rate is the flooder's new connections per second, for Duration.
	Rate     int
	Duration time.Duration
	// Warmup is how long the flood runs before the other pods start.
	Warmup time.Duration
	// Pods is how many other new pods start during the flood (half of them
	// role=client, allowed to reach x/srv; half denied).
	Pods int
	// InformerDelay is how long the agents take to learn the new pods.
	InformerDelay time.Duration
	// ProbeTimeout bounds each probe: shorter than the second SYN
	// retransmission (3 s), so a first SYN the queue lost is a failure.
	ProbeTimeout time.Duration
}

// QueueFloodAttack is the attack of the red-team test and the benchmark:
// 3,000 new connections per second to pod-range addresses no pod holds,
// each held up to the 2 s wait for a pod that never comes (6,000 held at
// once, more than the 4,096 the kernel queue holds), for 4.5 s. Ten new
// pods start after 1.5 s and become known 0.5 s later; their probes wait
// 0.95 s: the first SYN must be held and decided (one the queue lost is
// retransmitted after 1 s, too late).
func QueueFloodAttack(failOpen bool) QueueFloodConfig {
	return QueueFloodConfig{FailOpen: failOpen, Rate: 3000, Duration: 4500 * time.Millisecond, Warmup: 1500 * time.Millisecond,
		Pods: 10, InformerDelay: 500 * time.Millisecond, ProbeTimeout: 950 * time.Millisecond}
}

// QueueFloodResult is what RunQueueFlood saw.
type QueueFloodResult struct {
	// Report holds the other pods' connections (role=client ones should
	// connect, the others not) and the flooder's own to x/victim (denied).
	*Report
	// Sent is how many connections the flooder opened.
	Sent int
	// ShareDropped is what node-1's kernel dropped over a source's share
	// of the queue (the userspace-held chain's counters), HeldDropped what
	// its evaluator dropped over a bound of held packets.
	ShareDropped, HeldDropped uint64
}

// FloodTargets is a range of node-2's pod range that no pod holds; node-1
// routes it to node-2 (RunQueueFlood adds the route), so a connection to it
// crosses node-1's forward hook as one to a pod not yet known would.
var FloodTargets = netip.MustParsePrefix("10.244.2.128/25")

// RunQueueFlood plays the queue flood: new/flooder, a known pod on node-1,
// opens cfg.Rate connections per second to addresses of the pod ranges
// that no pod holds (each one held by node-1's evaluator, waiting for a pod
// that never comes) for cfg.Duration. After cfg.Warmup, cfg.Pods new pods
// start on node-1, each connecting to x/srv at once (allowed for
// role=client, denied by their namespace's default-deny egress for the
// others), and a new pod x/victim (app=srv: only role=client may reach it),
// to which the flooder connects too. The agents learn the new pods
// cfg.InformerDelay later, in one sync.
func (l *Lab) RunQueueFlood(ctx context.Context, cfg QueueFloodConfig) (QueueFloodResult, error) {
	var res QueueFloodResult
	l.NewPodPolicies()
	l.SetPolicy(srvIngressPolicy())
	srv := PodSpec{Namespace: "x", Name: "srv", IP: PodIP(0, 0), Labels: map[string]string{"app": "srv"}, TCPPorts: []uint16{80}}
	flooder := PodSpec{Namespace: "new", Name: "flooder", IP: PodIP(0, 100), Labels: map[string]string{}}
	for _, p := range []PodSpec{srv, flooder} {
		if err := l.StartPod(p); err != nil {
			return res, err
		}
		l.Know(p)
	}
	if err := l.Publish(ctx); err != nil {
		return res, err
	}
	if err := l.routeFloodTargets(); err != nil {
		return res, err
	}

	floodCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var sent int
	floodErr := make(chan error, 1)
	go func() {
		err := l.net.InNetns(flooder.Endpoint(), func() error {
			var err error
			sent, err = floodConnects(floodCtx, cfg.Rate)
			return err
		})
		floodErr <- err
	}()
	select {
	case <-time.After(cfg.Warmup):
	case err := <-floodErr:
		return res, fmt.Errorf("flood ended early: %v", err)
	}

	var outs []Outcome
	probe := func(from PodSpec, to netip.Addr, want bool, why string) {
		o := Outcome{Index: len(outs), Src: from.IP, SrcNode: DefaultNodes[from.Node], Want: want, WantReason: why}
		o.Probe = scenario.Probe{From: scenario.Endpoint{Pod: from.Key()}, To: scenario.Endpoint{IP: to.String()}, Port: 80}
		o.ProbeReq = netlab.ProbeReq{From: from.Endpoint(), To: to, Port: 80, Proto: netlab.TCP, Timeout: cfg.ProbeTimeout}
		outs = append(outs, o)
	}
	var newPods []PodSpec
	for i := 0; i < cfg.Pods; i++ {
		p := PodSpec{Namespace: "new", Name: fmt.Sprintf("f%03d", i), IP: PodIP(0, 1+i), Labels: map[string]string{}}
		if i%2 == 0 {
			p.Labels["role"] = "client"
			probe(p, srv.IP, true, "role=client may reach x/srv")
		} else {
			probe(p, srv.IP, false, "not role=client: default-deny egress")
		}
		newPods = append(newPods, p)
	}
	victim := PodSpec{Namespace: "x", Name: "victim", IP: PodIP(0, 99), Labels: map[string]string{"app": "srv"}, TCPPorts: []uint16{80}}
	newPods = append(newPods, victim)
	probe(flooder, victim.IP, false, "x/victim admits role=client only")
	for _, p := range newPods {
		if err := l.StartPod(p); err != nil {
			return res, err
		}
	}
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i].ProbeResult = l.net.ProbeOne(ctx, outs[i].ProbeReq)
		}()
	}
	time.Sleep(cfg.InformerDelay)
	for _, p := range newPods {
		l.Know(p)
	}
	pubErr := l.Publish(ctx)
	wg.Wait()
	stop()
	if err := <-floodErr; err != nil {
		return res, fmt.Errorf("flood: %w", err)
	}
	if pubErr != nil {
		return res, pubErr
	}
	for _, o := range outs {
		if o.Err != nil {
			return res, fmt.Errorf("%v: %w", o.ProbeReq, o.Err)
		}
	}
	st, _ := l.QueueStats(DefaultNodes[0])
	res = QueueFloodResult{Report: l.report(outs), Sent: sent, ShareDropped: l.chainDropped(compile.ChainQueueHeld), HeldDropped: st.HeldDroppedSource + st.HeldDroppedFull}
	return res, nil
}

// srvIngressPolicy lets only role=client pods reach app=srv pods of
// namespace x.
func srvIngressPolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "srv-from-clients"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *MatchLabels("app", "srv"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{}, PodSelector: MatchLabels("role", "client")}}}}}}
}

// chainDropped sums the drop counters of node-1's chain (0 when it cannot
// be listed, or has none).
func (l *Lab) chainDropped(chain string) uint64 {
	out, err := l.net.NodeExec(DefaultNodes[0], "nft", "list", "chain", "inet", compile.TableName, chain)
	if err != nil {
		return 0
	}
	var n uint64
	for _, m := range counterDrop.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseUint(m[1], 10, 64)
		n += v
	}
	return n
}

var counterDrop = regexp.MustCompile(`counter packets (\d+) bytes \d+ drop`)

// routeFloodTargets routes FloodTargets from node-1 to node-2.
func (l *Lab) routeFloodTargets() error {
	ips, err := l.net.IPs(netlab.Node(DefaultNodes[1]))
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if ip.Is4() {
			if out, err := l.net.NodeExec(DefaultNodes[0], "ip", "route", "replace", FloodTargets.String(), "via", ip.String()); err != nil {
				return fmt.Errorf("routing %s via %s: %v: %s", FloodTargets, ip, err, out)
			}
			return nil
		}
	}
	return fmt.Errorf("%s has no IPv4 address", DefaultNodes[1])
}

// floodConnects opens rate TCP connections per second, each to the next
// address and port of FloodTargets, until ctx ends, in the calling
// thread's network namespace: a non-blocking connect sends the SYN, and the
// socket is closed at once (no retransmission; the queued SYN stays
// queued). It returns how many it opened.
func floodConnects(ctx context.Context, rate int) (int, error) {
	const tick = 10 * time.Millisecond
	perTick := max(rate*int(tick)/int(time.Second), 1)
	base := FloodTargets.Addr().As4()
	hosts := 1 << (32 - FloodTargets.Bits())
	t := time.NewTicker(tick)
	defer t.Stop()
	n := 0
	for {
		for i := 0; i < perTick; i++ {
			a := base
			a[3] += byte(n % (hosts - 1))
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return n, err
			}
			err = unix.Connect(fd, &unix.SockaddrInet4{Addr: a, Port: 1000 + n%50000})
			unix.Close(fd)
			if err != nil && err != unix.EINPROGRESS {
				return n, fmt.Errorf("connect: %w", err)
			}
			n++
		}
		select {
		case <-ctx.Done():
			return n, nil
		case <-t.C:
		}
	}
}
