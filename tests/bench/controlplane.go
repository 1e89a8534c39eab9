package bench

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// ControlPlaneConfig configures RunControlPlane.
type ControlPlaneConfig struct {
	// Outage is how long the API server stays stopped.
	Outage time.Duration
	// Pods in the API (on fake nodes) when the watches expire.
	Pods int
	// Interval between the connections of each flow of the loop that runs
	// during the outage.
	Interval time.Duration
	Logf     func(format string, args ...any)
}

func (c *ControlPlaneConfig) defaults() {
	if c.Outage <= 0 {
		c.Outage = 5 * time.Minute
	}
	if c.Pods <= 0 {
		c.Pods = 50000
	}
	if c.Interval <= 0 {
		c.Interval = 20 * time.Millisecond
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

const cpNS = "cpaway"

// RunControlPlane measures a real agent (hybrid mode) while the control
// plane goes away, with cfg.Pods pods in the API: the API server stopped
// for cfg.Outage and started again, with a connection loop of an allowed
// and a denied flow running (apiserver_outage_admitted_denied,
// apiserver_outage_failed_allowed) and a policy written once it is back
// (apiserver_outage_change_delay_ms: from the API server ready to the
// first connection denied); then the agent's watches expired (the agent
// cut off, pods deleted, etcd compacted and the API server restarted) and
// the agent's CPU for the relist that follows (relist_cpu_s_<pods>, beside
// the first sync's, relist_first_sync_cpu_s_<pods>) and its full builds
// (relist_builds).
func RunControlPlane(ctx context.Context, cfg ControlPlaneConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("controlplane", func(tb *cluster.ProgramTB, res *Result) error { return runControlPlane(ctx, tb, cfg, res) })
}

func runControlPlane(ctx context.Context, tb *cluster.ProgramTB, cfg ControlPlaneConfig, res *Result) error {
	sc := ScaleConfig{Pods: []int{cfg.Pods}, Logf: cfg.Logf}
	sc.defaults()
	c, cs, _, err := startScaleCluster(ctx, tb, sc, cluster.EnforcerNftpolicy, compile.ModeHybrid)
	if err != nil {
		return err
	}
	if err := growScalePods(ctx, cs, 0, cfg.Pods, sc); err != nil {
		return err
	}
	flows, late, err := setUpOutageFlows(ctx, c)
	if err != nil {
		return err
	}
	agent := c.Agent("node-1")
	agent.ExtraArgs = []string{"--full-sync-period", "1h"}
	sz := sizeName(cfg.Pods)
	_, firstCPU, err := startAgentTimed(ctx, c, agent, sz, "first sync", "relist_first_sync", sc, res)
	if err != nil {
		return err
	}
	res.Set("relist_first_sync_cpu_s_"+sz, round(firstCPU, 2))
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	if err := measureOutage(ctx, c, cfg, flows, late, res); err != nil {
		return err
	}
	return measureRelist(ctx, c, cs, cfg, sz, firstCPU, res)
}

// setUpOutageFlows creates the pods of the connection loop on node-1 and
// the policy that lets only "good" reach "server"; it returns the loop's
// flows and the flow to "late", which a policy written after the outage
// denies.
func setUpOutageFlows(ctx context.Context, c *cluster.Cluster) ([]cluster.Flow, cluster.Flow, error) {
	if err := c.EnsureNamespace(ctx, cpNS, nil); err != nil {
		return nil, cluster.Flow{}, err
	}
	for _, p := range []cluster.Pod{
		{Namespace: cpNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: cpNS, Name: "late", Labels: map[string]string{"app": "late"}, Node: "node-1"},
		{Namespace: cpNS, Name: "good", Labels: map[string]string{"role": "good"}, Node: "node-1"},
		{Namespace: cpNS, Name: "bad", Labels: map[string]string{"role": "bad"}, Node: "node-1"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return nil, cluster.Flow{}, err
		}
	}
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: cpNS, Name: "server"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "good"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}}}}
	if _, err := c.ApplyPolicy(ctx, np); err != nil {
		return nil, cluster.Flow{}, err
	}
	good, err := c.PodEndpoint(cpNS + "/good")
	if err != nil {
		return nil, cluster.Flow{}, err
	}
	bad, err := c.PodEndpoint(cpNS + "/bad")
	if err != nil {
		return nil, cluster.Flow{}, err
	}
	server := c.PodIPs(cpNS + "/server")[0]
	flows := []cluster.Flow{
		{Name: "good", From: good, To: server, Port: 80, Allowed: true},
		{Name: "bad", From: bad, To: server, Port: 80, Allowed: false},
	}
	late := cluster.Flow{Name: "late", From: good, To: c.PodIPs(cpNS + "/late")[0], Port: 80, Allowed: false}
	return flows, late, nil
}

// measureOutage stops the API server for cfg.Outage with the connection
// loop running, starts it again, writes a policy that denies "late" and
// times its enforcement.
func measureOutage(ctx context.Context, c *cluster.Cluster, cfg ControlPlaneConfig, flows []cluster.Flow, late cluster.Flow, res *Result) error {
	loop := c.StartConnLoop(ctx, flows, cfg.Interval, 900*time.Millisecond)
	c.Env.StopAPIServer()
	cfg.Logf("controlplane: API server stopped for %v", cfg.Outage)
	time.Sleep(cfg.Outage)
	if err := c.Env.StartAPIServer(); err != nil {
		loop.Stop()
		return err
	}
	back := time.Now()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: cpNS, Name: "late"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "late"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if err := retryWrite(ctx, func() error { _, err := c.ApplyPolicy(ctx, np); return err }); err != nil {
		loop.Stop()
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	at, err := c.WaitVerdict(wctx, late, 10*time.Millisecond, 250*time.Millisecond)
	cancel()
	r := loop.Stop()
	if err != nil {
		return err
	}
	if len(r.Harness) > 0 {
		return fmt.Errorf("connection loop: %v", r.Harness[0])
	}
	delay := at.Sub(back)
	cfg.Logf("controlplane: outage of %v: %d connections of each flow; %d denied admitted, %d allowed failed; the policy written at the API server's return enforced after %v",
		cfg.Outage, r.Tries["bad"], len(r.Wrong["bad"]), len(r.Wrong["good"]), delay.Round(time.Millisecond))
	res.Set("apiserver_outage_s", cfg.Outage.Seconds())
	res.Set("apiserver_outage_connections", r.Tries["bad"]+r.Tries["good"])
	res.Set("apiserver_outage_admitted_denied", len(r.Wrong["bad"]))
	res.Set("apiserver_outage_failed_allowed", len(r.Wrong["good"]))
	res.Set("apiserver_outage_change_delay_ms", millis(delay))
	return nil
}

// retryWrite retries an API write for up to a minute (the API server just
// started may refuse requests briefly).
func retryWrite(ctx context.Context, write func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := write()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// relistPodsRead is the pod count of the pod store's line after it read
// every pod: from a watch's initial events, or listed when the API server
// (just restarted) refused those.
var relistPodsRead = regexp.MustCompile(`"(?:Pods read from a watch's initial events|Pods listed)".* pods=(\d+) `)

// measureRelist cuts the agent off, deletes a namespace's pods, compacts
// etcd and restarts the API server, then lets the agent back and measures
// its CPU from then until it has read every pod again and programmed the
// result.
func measureRelist(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, cfg ControlPlaneConfig, sz string, firstCPU float64, res *Result) error {
	agent := c.Agent("node-1")
	agent.HoldAPI()
	if err := cs.CoreV1().Pods(scaleNSName(0)).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		agent.ReleaseAPI()
		return err
	}
	rev, err := c.Env.CompactEtcd(ctx)
	if err != nil {
		agent.ReleaseAPI()
		return err
	}
	c.Env.StopAPIServer()
	if err := c.Env.StartAPIServer(); err != nil {
		agent.ReleaseAPI()
		return err
	}
	if _, err := settleAPIServer(ctx, c); err != nil {
		agent.ReleaseAPI()
		return err
	}
	reads := len(relistPodsRead.FindAllString(agent.LogTail(math.MaxInt), -1))
	m0, err := agent.Metrics(ctx)
	if err != nil {
		agent.ReleaseAPI()
		return err
	}
	cpu0, err := procCPU(agent.Pid())
	if err != nil {
		agent.ReleaseAPI()
		return err
	}
	t0 := time.Now()
	agent.ReleaseAPI()
	cfg.Logf("controlplane: etcd compacted at revision %d, API server restarted; the agent let back", rev)
	var line string
	for line == "" {
		if time.Since(t0) > 5*time.Minute || ctx.Err() != nil {
			return fmt.Errorf("the agent did not read every pod again (%v); log tail:\n%s", ctx.Err(), agent.LogTail(30))
		}
		time.Sleep(50 * time.Millisecond)
		if all := relistPodsRead.FindAllString(agent.LogTail(math.MaxInt), -1); len(all) > reads {
			line = all[len(all)-1]
		}
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	builds := func(m map[string]float64) float64 {
		return m[`nftpolicy_sync_duration_seconds_count{kind="full"}`] + m[`nftpolicy_sync_duration_seconds_count{kind="incremental"}`]
	}
	// The program's rebuild after the pod changes applied follows them
	// (within a second); a second rebuild would come later still.
	var m1 map[string]float64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if m1, err = agent.Metrics(ctx); err != nil {
			return err
		}
		if builds(m1) > builds(m0) {
			time.Sleep(time.Second)
			break
		}
	}
	cpu1, err := procCPU(agent.Pid())
	if err != nil {
		return err
	}
	if m1, err = agent.Metrics(ctx); err != nil {
		return err
	}
	n := 0
	if sm := relistPodsRead.FindStringSubmatch(line); sm != nil {
		n, _ = strconv.Atoi(sm[1])
	}
	cfg.Logf("controlplane: relist of %d pods: agent CPU %.2f s (first sync %.2f s), %v full builds; %s",
		n, cpu1-cpu0, firstCPU, builds(m1)-builds(m0), strings.TrimSpace(line))
	res.Set("relist_pods", n)
	res.Set("relist_cpu_s_"+sz, round(cpu1-cpu0, 2))
	res.Set("relist_builds", builds(m1)-builds(m0))
	return nil
}
