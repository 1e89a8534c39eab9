package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// DelayConfig configures RunDelay.
type DelayConfig struct {
	// Cycles of five changes: policy create, update, update, delete, and a
	// new pod becoming enforced.
	Cycles int
	// Interval between probe launches.
	Interval time.Duration
	// ProbeTimeout: a probe without an answer by then observed a drop.
	ProbeTimeout time.Duration
	// Mode of the agent.
	Mode string
	Logf func(format string, args ...any)
}

func (c *DelayConfig) defaults() {
	if c.Cycles <= 0 {
		c.Cycles = 5
	}
	if c.Interval <= 0 {
		c.Interval = 2 * time.Millisecond
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 250 * time.Millisecond
	}
	if c.Mode == "" {
		c.Mode = string(compile.ModeHybrid)
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// The kinds of change, in cycle order.
var delayKinds = []string{"create", "update", "delete", "pod"}

// RunDelay measures the programming delay of a real agent process: from
// the start of the API write to the SYN of the first connection that
// observes the new verdict, probing every Interval, over Cycles x 5 changes.
func RunDelay(ctx context.Context, cfg DelayConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("delay", func(tb *cluster.ProgramTB, res *Result) error { return runDelay(ctx, tb, cfg, res) })
}

// runInProgramTB runs a section that needs root and the cluster harness:
// fn gets a ProgramTB logging to stderr (the harness's cleanups run when it
// returns) and fills in the Result.
func runInProgramTB(name string, fn func(tb *cluster.ProgramTB, res *Result) error) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New(name + ": needs root")
	}
	res := &Result{}
	var runErr error
	tb := cluster.NewProgramTB(name)
	tb.Out = os.Stderr
	err := tb.Run(func(tb *cluster.ProgramTB) { runErr = fn(tb, res) })
	if runErr != nil {
		return nil, runErr
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

const delayNS = "delay"

func runDelay(ctx context.Context, tb *cluster.ProgramTB, cfg DelayConfig, res *Result) error {
	c := cluster.Start(tb, cluster.Config{Nodes: []string{"node-1"}, Mode: compile.Mode(cfg.Mode), Verbosity: 1, Logf: cfg.Logf})
	if err := c.EnsureNamespace(ctx, delayNS, nil); err != nil {
		return err
	}
	for _, p := range []cluster.Pod{
		{Namespace: delayNS, Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		{Namespace: delayNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return err
		}
	}
	// Isolates the pods the "pod" changes create; selects nothing before.
	if _, err := c.ApplyPolicy(ctx, policy("deny-new", "newserver", false)); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	from, err := c.PodEndpoint(delayNS + "/client")
	if err != nil {
		return err
	}
	serverIP := c.PodIPs(delayNS + "/server")[0]
	pr := &prober{lab: c.Lab, from: from, interval: cfg.Interval, timeout: cfg.ProbeTimeout}
	api := c.Client
	pols := api.NetworkingV1().NetworkPolicies(delayNS)

	byKind := map[string][]time.Duration{}
	var all, afterWrite []time.Duration
	record := func(kind string, d time.Duration, err error) error {
		if err != nil {
			return fmt.Errorf("%s change: %w", kind, err)
		}
		byKind[kind] = append(byKind[kind], d)
		all = append(all, d)
		// What is left once the API server answered: the agent's sync,
		// the kernel and the probes' resolution (the watch event often
		// reaches the agent before the answer reaches the client).
		afterWrite = append(afterWrite, d-pr.writes[len(pr.writes)-1])
		// Every change is in force before the next one.
		if _, err := c.WaitProgrammed(ctx); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	for cyc := 0; cyc < cfg.Cycles; cyc++ {
		var cur *networkingv1.NetworkPolicy
		// create: allowed -> denied
		d, err := pr.measure(ctx, serverIP, false, func() (err error) {
			cur, err = pols.Create(ctx, policy("deny", "server", false), metav1.CreateOptions{})
			return err
		})
		if err := record("create", d, err); err != nil {
			return err
		}
		// update: denied -> allowed (a rule admits the client) ...
		d, err = pr.measure(ctx, serverIP, true, func() (err error) {
			next := cur.DeepCopy()
			next.Spec = policy("deny", "server", true).Spec
			cur, err = pols.Update(ctx, next, metav1.UpdateOptions{})
			return err
		})
		if err := record("update", d, err); err != nil {
			return err
		}
		// ... and back: allowed -> denied
		d, err = pr.measure(ctx, serverIP, false, func() (err error) {
			next := cur.DeepCopy()
			next.Spec = policy("deny", "server", false).Spec
			cur, err = pols.Update(ctx, next, metav1.UpdateOptions{})
			return err
		})
		if err := record("update", d, err); err != nil {
			return err
		}
		// delete: denied -> allowed
		d, err = pr.measure(ctx, serverIP, true, func() error {
			return pols.Delete(ctx, "deny", metav1.DeleteOptions{})
		})
		if err := record("delete", d, err); err != nil {
			return err
		}
		// pod: a new pod, reachable before the API knows it, is isolated by
		// deny-new once its status (with its IP) is written.
		d, err = newPodChange(ctx, c, api, pr, cyc)
		if err := record("pod", d, err); err != nil {
			return err
		}
		cfg.Logf("delay: cycle %d/%d: last %v", cyc+1, cfg.Cycles, all[len(all)-5:])
	}
	res.Set("program_delay_changes", len(all))
	res.Set("program_delay_p50_ms", millis(Percentile(all, 50)))
	res.Set("program_delay_p99_ms", millis(Percentile(all, 99)))
	res.Set("program_delay_max_ms", millis(Percentile(all, 100)))
	for _, k := range delayKinds {
		res.Set("program_delay_p50_ms_"+k, millis(Percentile(byKind[k], 50)))
		res.Set("program_delay_max_ms_"+k, millis(Percentile(byKind[k], 100)))
	}
	res.Set("program_delay_api_write_p50_ms", millis(Percentile(pr.writes, 50)))
	res.Set("program_delay_after_write_p50_ms", millis(Percentile(afterWrite, 50)))
	res.Set("program_delay_probe_interval_ms", millis(cfg.Interval))
	if m, err := c.Agent("node-1").Metrics(ctx); err == nil {
		const cnt, sum = `nftpolicy_sync_duration_seconds_count{kind="incremental"}`, `nftpolicy_sync_duration_seconds_sum{kind="incremental"}`
		if m[cnt] > 0 {
			res.Set("program_delay_agent_sync_mean_ms", round(m[sum]/m[cnt]*1000, 2))
		}
		// NetworkPolicy changes through the tracker (the "incremental"
		// syncs above are then the program refreshes that follow them).
		const pcnt, psum = `nftpolicy_sync_duration_seconds_count{kind="policies"}`, `nftpolicy_sync_duration_seconds_sum{kind="policies"}`
		if m[pcnt] > 0 {
			res.Set("program_delay_agent_policy_sync_mean_ms", round(m[psum]/m[pcnt]*1000, 2))
		}
	}
	return nil
}

// newPodChange creates a lab pod, then its API object, and measures from
// the status write (the kubelet's report of the pod's IP) to the first
// denied probe; then deletes the pod again.
func newPodChange(ctx context.Context, c *cluster.Cluster, api kubernetes.Interface, pr *prober, cyc int) (time.Duration, error) {
	name := fmt.Sprintf("new-%d", cyc)
	ip := netip.AddrFrom4([4]byte{10, 244, 1, byte(200 + cyc%50)})
	if err := c.Lab.AddPod(netlab.PodSpec{Name: name, Node: "node-1", IPs: []netip.Addr{ip}, TCPPorts: []uint16{80}}); err != nil {
		return 0, err
	}
	defer c.Lab.RemovePod(name)
	no := false
	obj, err := api.CoreV1().Pods(delayNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: delayNS, Name: name, Labels: map[string]string{"app": "newserver"}},
		Spec: corev1.PodSpec{NodeName: "node-1", AutomountServiceAccountToken: &no, Containers: []corev1.Container{{
			Name: "main", Image: "registry.k8s.io/pause:3.10",
			Ports: []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	defer func() {
		zero := int64(0)
		_ = api.CoreV1().Pods(delayNS).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}()
	// Not enforced yet: the pod has no IP in the API.
	if ok, err := pr.lab.Probe(ctx, pr.from, ip, 80, netlab.TCP, time.Second); err != nil || !ok {
		return 0, fmt.Errorf("new pod %s not reachable before it is enforced (err %v)", ip, err)
	}
	now := metav1.Now()
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}, StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
	return pr.measure(ctx, ip, false, func() error {
		_, err := api.CoreV1().Pods(delayNS).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		return err
	})
}

// policy selects app=<app> and isolates it for ingress; with allow, its rule
// admits the client on 80/TCP.
func policy(name, app string, allow bool) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: delayNS, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if allow {
		tcp := corev1.ProtocolTCP
		port := intstr.FromInt32(80)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		}}
	}
	return np
}

// prober launches a connection every interval and finds when the verdict
// flipped.
type prober struct {
	lab      *netlab.Lab
	from     netlab.Endpoint
	interval time.Duration
	timeout  time.Duration
	// writes are how long each API write took (the part of the delay
	// before the agent can know of the change).
	writes []time.Duration
}

type probeObs struct {
	start time.Time
	ok    bool
	err   error
}

// measure probes to:80 from before write until a probe observes want
// (connected, or dropped: no answer within the timeout), waits for the
// probes still in flight, and returns the time from the start of write to
// the SYN of the earliest probe that observed want.
func (p *prober) measure(ctx context.Context, to netip.Addr, want bool, write func() error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	obs := make(chan probeObs, 1024)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	launch := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			launched := time.Now()
			r := p.lab.ProbeOne(ctx, netlab.ProbeReq{From: p.from, To: to, Port: 80, Proto: netlab.TCP, Timeout: p.timeout})
			// The verdict a probe observes is the one in force when its
			// SYN left, not when it was launched.
			start := r.Sent
			if start.IsZero() {
				start = launched
			}
			o := probeObs{start: start, ok: r.Connected, err: r.Err}
			if !r.Connected && r.Err == nil && r.Reason != "timeout" {
				o.err = fmt.Errorf("probe failed: %s", r.Reason)
			}
			obs <- o
		}()
	}
	var launcher sync.WaitGroup
	launcher.Add(1)
	go func() {
		defer launcher.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			launch()
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	time.Sleep(3 * p.interval) // probes of the old verdict first
	t0 := time.Now()
	werr := write()
	p.writes = append(p.writes, time.Since(t0))
	var seen []probeObs
	var flipped bool
	collect := func(o probeObs) {
		seen = append(seen, o)
		if o.err == nil && o.ok == want && !o.start.Before(t0) {
			flipped = true
		}
	}
	for werr == nil && !flipped && ctx.Err() == nil {
		select {
		case o := <-obs:
			collect(o)
		case <-ctx.Done():
		}
	}
	close(stop)
	launcher.Wait()
	go func() { wg.Wait(); close(obs) }()
	for o := range obs {
		collect(o)
	}
	if werr != nil {
		return 0, werr
	}
	if !flipped {
		return 0, fmt.Errorf("no probe observed the new verdict (%v) within 15s", want)
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i].start.Before(seen[j].start) })
	for _, o := range seen {
		if o.err != nil {
			return 0, o.err
		}
		if o.ok == want && !o.start.Before(t0) {
			return o.start.Sub(t0), nil
		}
	}
	return 0, errors.New("unreachable")
}
