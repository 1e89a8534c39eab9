package agent_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// OutageEnv sets how long TestControlPlaneAway keeps the API server
// stopped (a Go duration; the figure is 5m, which the faults bench
// section runs).
const outageEnv = "NFTPOLICY_OUTAGE"

const (
	// cpChangeDelay bounds the time from the agent seeing the API server
	// again to the kernel enforcing a change written while it was blind.
	cpChangeDelay = 2 * time.Second
	// cpLiveness is the agents' --liveness-timeout: short, so that an
	// agent that stopped making progress while blind would show it.
	cpLiveness = 3 * time.Second
	cpNS       = "cp"
	cpInterval = 20 * time.Millisecond
	// killedFor: how long the agent stays dead after SIGKILL.
	killedFor = 2 * time.Second
)

// TestControlPlaneAway runs one agent (hybrid mode, its periodic full sync
// an hour away) while the control plane goes away in the ways a node meets:
// the API server stopped for $NFTPOLICY_OUTAGE (10 s unless set) and
// started again; the agent cut off from a running API server (a partition)
// while a policy is written; etcd restarted; the agent's watches expired
// (etcd compacted while the agent was cut off, the API server restarted:
// 410 Gone and a relist); the agent killed with SIGKILL while pods churn.
//
// In each, a loop of new connections (an allowed and a denied flow, one
// every 20 ms each) must keep its verdicts throughout (the kernel enforces
// the last program), /healthz must answer 200 and /readyz 200 (the node
// enforces a committed program; what it has not seen is what the node's
// NodeEnforcement and `status` say), a policy written while the agent was
// blind must be enforced within cpChangeDelay of the agent seeing the API
// server again, and a relist must cost at most one full build.
func TestControlPlaneAway(t *testing.T) {
	requireRoot(t)
	outage := 10 * time.Second
	if v := os.Getenv(outageEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", outageEnv, err)
		}
		outage = d
	}
	ctx := testContext(t, 10*time.Minute+3*outage)
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1"},
		AgentArgs: []string{"--full-sync-period", "1h", "--liveness-timeout", cpLiveness.String()}})
	cp := setUpControlPlaneAway(t, ctx, c)

	t.Run("apiserver-stopped", func(t *testing.T) {
		cp.fault(t, ctx, "t1", func() time.Time {
			c.Env.StopAPIServer()
			t.Logf("API server stopped for %v", outage)
			time.Sleep(outage)
			if err := c.Env.StartAPIServer(); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			cp.denyTarget(t, ctx, "t1")
			return back
		})
	})
	t.Run("agent-cut-off", func(t *testing.T) {
		cp.fault(t, ctx, "t2", func() time.Time {
			c.Agent("node-1").HoldAPI()
			np := cp.denyTarget(t, ctx, "t2")
			// The API server is up: `status` sees the node's report,
			// which cannot have the policy.
			line := statusLine(t, ctx, c, "-n", cpNS, "np/"+np.Name)
			if !strings.Contains(line, " 0/1 ") || !strings.Contains(line, "node-1") {
				t.Errorf("status while the agent is cut off: %q, want 0/1 naming node-1", line)
			}
			t.Logf("status while the agent is cut off: %s", line)
			time.Sleep(3 * time.Second)
			c.Agent("node-1").ReleaseAPI()
			return time.Now()
		})
		// Back in touch, the node reports the policy programmed.
		code, out, errOut := nftpolicyCLI(t, ctx, c, "wait", "np/deny-t2", "-n", cpNS, "--for=programmed", "--timeout=30s")
		if code != 0 || !strings.Contains(out, "on 1/1 nodes") {
			t.Errorf("wait after the agent is back: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
		}
	})
	t.Run("etcd-restarted", func(t *testing.T) {
		cp.fault(t, ctx, "t3", func() time.Time {
			if err := c.Env.RestartEtcd(); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			cp.denyTarget(t, ctx, "t3")
			return back
		})
	})
	t.Run("relist", func(t *testing.T) { cp.relist(t, ctx) })
	t.Run("sigkill-under-churn", func(t *testing.T) {
		cp.killed(t, ctx, "t5", 0)
	})
	t.Run("crash-loop-under-churn", func(t *testing.T) {
		cp.killed(t, ctx, "t6", crashLoopKills)
	})
}

// crashLoopKills: how many times crash-loop-under-churn kills the agent
// again during its start.
const crashLoopKills = 3

// killed kills the agent with SIGKILL while pods churn, writes the policy
// that denies target, and starts the agent again after killedFor; then
// kills it again during its start (before or during its first sync, where
// its memory peaks: a memory limit the start exceeds makes such a crash
// loop) kills times before it may run.
func (cp *controlPlaneAway) killed(t *testing.T, ctx context.Context, target string, kills int) {
	stop := cp.churn(ctx)
	cp.settle = func() { t.Logf("churn: %d pod writes", stop()) }
	cp.restarts = true
	defer func() { cp.settle, cp.restarts = nil, false }()
	a := cp.c.Agent("node-1")
	cp.fault(t, ctx, target, func() time.Time {
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
		cp.denyTarget(t, ctx, target)
		time.Sleep(killedFor)
		for i := 0; i < kills; i++ {
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
			if err := a.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	})
}

type controlPlaneAway struct {
	c    *cluster.Cluster
	tgts map[string]cluster.Flow
	loop []cluster.Flow
	// settle, if set, runs once the change is enforced, before fault
	// waits for the agent to program the API's current state.
	settle func()
	// restarts: the agent process is restarted in this fault, so /readyz
	// answers 503 until its first sync; otherwise it must answer 200
	// throughout.
	restarts bool
}

func setUpControlPlaneAway(t *testing.T, ctx context.Context, c *cluster.Cluster) *controlPlaneAway {
	if err := c.EnsureNamespace(ctx, cpNS, nil); err != nil {
		t.Fatal(err)
	}
	pods := []cluster.Pod{
		{Namespace: cpNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: cpNS, Name: "good", Labels: map[string]string{"role": "good"}, Node: "node-1"},
		{Namespace: cpNS, Name: "bad", Labels: map[string]string{"role": "bad"}, Node: "node-1"},
	}
	targets := []string{"t1", "t2", "t3", "t4", "t5", "t6"}
	for _, n := range targets {
		pods = append(pods, cluster.Pod{Namespace: cpNS, Name: n, Labels: map[string]string{"target": n}, Node: "node-1"})
	}
	mustCreatePods(t, ctx, c, pods...)
	if _, err := c.ApplyPolicy(ctx, makePolicy(cpNS, "server", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "server")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selector("role", "good")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPolicy(ctx, makePolicy(cpNS, "deny-marked", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("deny", "yes")
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	})); err != nil {
		t.Fatal(err)
	}
	m := verify(t, ctx, c, "before the faults")
	expect(t, m, "before the faults", map[[2]string]bool{{cpNS + "/good", cpNS + "/server"}: true, {cpNS + "/bad", cpNS + "/server"}: false,
		{cpNS + "/good", cpNS + "/t1"}: true})
	ep := func(key string) cluster.Flow {
		e, err := c.PodEndpoint(key)
		if err != nil {
			t.Fatal(err)
		}
		return cluster.Flow{From: e, Port: 80}
	}
	cp := &controlPlaneAway{c: c, tgts: map[string]cluster.Flow{}}
	server := c.PodIPs(cpNS + "/server")[0]
	good, bad := ep(cpNS+"/good"), ep(cpNS+"/bad")
	good.Name, good.To, good.Allowed = "good -> server", server, true
	bad.Name, bad.To, bad.Allowed = "bad -> server", server, false
	cp.loop = []cluster.Flow{good, bad}
	for _, n := range targets {
		f := ep(cpNS + "/good")
		f.Name, f.To, f.Allowed = "good -> "+n, c.PodIPs(cpNS + "/" + n)[0], false
		cp.tgts[n] = f
	}
	return cp
}

// denyTarget writes a policy that denies every connection to the target
// pod, retrying while the API server is not back.
func (cp *controlPlaneAway) denyTarget(t *testing.T, ctx context.Context, target string) *networkingv1.NetworkPolicy {
	t.Helper()
	np := makePolicy(cpNS, "deny-"+target, func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("target", target)
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got, err := cp.c.Client.NetworkingV1().NetworkPolicies(cpNS).Create(ctx, np, metav1.CreateOptions{})
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("writing %s: %v", np.Name, err)
		}
	}
}

// fault runs the connection loop and the health checks around during,
// which makes the agent blind, writes the policy that denies target and
// returns when the agent can see the API server again; then it waits for
// the kernel to deny the target and checks what the loop and the probes
// saw.
func (cp *controlPlaneAway) fault(t *testing.T, ctx context.Context, target string, during func() time.Time) {
	t.Helper()
	a := cp.c.Agent("node-1")
	loop := cp.c.StartConnLoop(ctx, cp.loop, cpInterval, connTimeout)
	health := watchHealth(ctx, a)
	back := during()
	at, err := cp.c.WaitVerdict(ctx, cp.tgts[target], cpInterval, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	delay := at.Sub(back)
	if cp.settle != nil {
		cp.settle()
	}
	if _, err := cp.c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a probe of the agent in charge again
	probes := health()
	res := loop.Stop()
	t.Logf("connections %v; the change written while the agent was blind enforced %v after it could see the API server; health: %s",
		res.Tries, delay.Round(time.Millisecond), probes)
	for _, e := range res.Harness {
		t.Errorf("connection loop: %v", e)
	}
	for name, w := range res.Wrong {
		t.Errorf("%s: %d of %d connections against the verdict: %s", name, len(w), res.Tries[name], strings.Join(w[:min(len(w), 5)], "; "))
	}
	if delay > cpChangeDelay {
		t.Errorf("the change written while the agent was blind was enforced %v after it could see the API server, want at most %v",
			delay.Round(time.Millisecond), cpChangeDelay)
	}
	if probes.ready[http.StatusOK] == 0 || len(probes.ready) > 1 && !cp.restarts {
		t.Errorf("/readyz while the control plane was away: %v, want 200 only (the node enforces a committed program)", probes.ready)
	}
	if probes.unhealthy > 0 {
		t.Errorf("/healthz failed %d times while the agent was working: %s", probes.unhealthy, probes.lastBad)
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", a.LogTail(60))
	}
}

// healthProbes counts the answers of /healthz and /readyz.
type healthProbes struct {
	n, unhealthy int
	ready        map[int]int
	lastBad      string
}

func (h healthProbes) String() string {
	return fmt.Sprintf("%d probes, /healthz failed %d, /readyz codes %v", h.n, h.unhealthy, h.ready)
}

// watchHealth probes the agent's /healthz and /readyz every 250 ms until
// the returned function is called, which returns what they answered. While
// the agent process is not running (killed, not started again yet), was
// replaced during the probe, or is not listening yet (connection refused:
// a started process before it serves, which the kubelet's probe delay
// covers) its probes are not counted.
func watchHealth(ctx context.Context, a *cluster.Agent) func() healthProbes {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	h := healthProbes{ready: map[int]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond)
			pid := a.Pid()
			code, body, err := a.Get(ctx, a.HealthAddr, "/healthz")
			if err != nil {
				// A connection cut by the process' death: it is
				// reaped (and maybe replaced) a moment later.
				time.Sleep(100 * time.Millisecond)
			}
			if pid == 0 || a.Pid() != pid || ctx.Err() != nil || errors.Is(err, syscall.ECONNREFUSED) {
				continue // no agent, or another one by now
			}
			rc, rerr := a.Ready(ctx)
			mu.Lock()
			h.n++
			if err != nil || code != http.StatusOK {
				h.unhealthy++
				h.lastBad = fmt.Sprintf("%d %q %v", code, strings.TrimSpace(body), err)
			}
			if rerr == nil {
				h.ready[rc]++
			}
			mu.Unlock()
		}
	}()
	return func() healthProbes {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return h
	}
}

// relistPods is how many pods the relist subtest creates while the agent
// is cut off.
const relistPods = 300

// relist cuts the agent off, creates pods, labels t4 so that the policy
// deny-marked selects it, compacts etcd and restarts the API server (its
// watch cache starts after the compaction): the agent's watches come back
// to a resourceVersion that is gone (410 Gone for a watch resumed from it)
// and read everything anew. Only pods changed, so the relist must cost at
// most one full build (the program's rebuild after the pod changes the
// tracker applied); the policies' and namespaces' relists, unchanged,
// none.
func (cp *controlPlaneAway) relist(t *testing.T, ctx context.Context) {
	c := cp.c
	a := c.Agent("node-1")
	var before map[string]float64
	cp.fault(t, ctx, "t4", func() time.Time {
		a.HoldAPI()
		if err := createAPIPods(ctx, c, "relist", 0, relistPods); err != nil {
			t.Fatal(err)
		}
		if err := c.LabelPod(ctx, cpNS, "t4", map[string]string{"deny": "yes"}); err != nil {
			t.Fatal(err)
		}
		rev, err := c.Env.CompactEtcd(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Env.StopAPIServer()
		if err := c.Env.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		t.Logf("etcd compacted at revision %d, API server restarted", rev)
		if before, err = a.Metrics(ctx); err != nil {
			t.Fatal(err)
		}
		a.ReleaseAPI()
		return time.Now()
	})
	// Changes come on their own after the relists: wait for the program's
	// rebuild that follows pod changes before counting.
	time.Sleep(2 * time.Second)
	after, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var read string
	if lines := podsRead.FindAllString(a.LogTail(400), -1); len(lines) > 0 {
		read = lines[len(lines)-1]
	}
	if m := podsRead.FindStringSubmatch(read); m == nil || m[1] != strconv.Itoa(len(all.Items)) {
		t.Errorf("the agent's last read of every pod was not a relist of the %d pods: %q", len(all.Items), read)
	}
	builds := func(m map[string]float64) float64 {
		return m[`nftpolicy_sync_duration_seconds_count{kind="full"}`] + m[`nftpolicy_sync_duration_seconds_count{kind="incremental"}`]
	}
	n := builds(after) - builds(before)
	t.Logf("the relist of %d pods cost %v full builds; %s", len(all.Items), n, read)
	if n > 1 {
		t.Errorf("the relist cost %v full builds, want at most 1; agent log:\n%s", n, a.LogTail(80))
	}
}

// podsRead is the pod count of the pod store's log line after it read
// every pod: from a watch's initial events, or listed when the API server
// (just restarted) refused those.
var podsRead = regexp.MustCompile(`"(?:Pods read from a watch's initial events|Pods listed)".* pods=(\d+) `)

// createAPIPods creates pods prefix-<from..to-1> in the cp namespace as API
// objects only, on a node of no lab (running, with an address outside the
// lab's), as a large cluster's other nodes have them.
func createAPIPods(ctx context.Context, c *cluster.Cluster, prefix string, from, to int) error {
	for i := from; i < to; i++ {
		if err := createAPIPod(ctx, c, fmt.Sprintf("%s-%d", prefix, i), i); err != nil {
			return err
		}
	}
	return nil
}

func createAPIPod(ctx context.Context, c *cluster.Cluster, name string, i int) error {
	no := false
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: cpNS, Name: name, Labels: map[string]string{"role": "other"}},
		Spec: corev1.PodSpec{NodeName: "elsewhere", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}}}
	obj, err := c.Client.CoreV1().Pods(cpNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating pod %s: %w", name, err)
	}
	ip := fmt.Sprintf("10.99.%d.%d", i/250, i%250+1)
	now := metav1.Now()
	obj.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now}
	if _, err := c.Client.CoreV1().Pods(cpNS).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the status of pod %s: %w", name, err)
	}
	return nil
}

// churn creates and deletes API-only pods until the returned stop, which
// returns how many writes it made.
func (cp *controlPlaneAway) churn(ctx context.Context) func() int {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("churn-%d", i%50)
			if i >= 50 {
				if err := cp.c.Client.CoreV1().Pods(cpNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err == nil {
					n++
				}
			}
			if createAPIPod(ctx, cp.c, name, 1000+i%50) == nil {
				n++
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() int { cancel(); return <-done }
}
