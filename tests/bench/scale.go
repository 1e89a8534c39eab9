package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// ScaleConfig configures RunScale.
type ScaleConfig struct {
	// Pods are the pod counts to measure at, increasing: pods are added
	// between sizes and the agent restarted.
	Pods []int
	// Policies in the API (spread over the pods' namespaces).
	Policies int
	// LocalPods are real (netlab) pods on the agent's node, selected by
	// some of the policies.
	LocalPods int
	// Incremental is the number of one-pod label changes timed per size.
	Incremental int
	// Settle is the idle time over which CPU use is measured before RSS is read.
	Settle time.Duration
	// Parallel is the number of concurrent API writes while creating pods.
	Parallel int
	// FakeNodes the pods are spread over (they are not in the lab).
	FakeNodes int
	// HeapProfile, when set, is where a heap profile of the agent's
	// controller, run in this process at the last size, is written.
	HeapProfile string
	// StartupCPUProfile, when set, is where a CPU profile of that
	// in-process controller, from its start to its first committed sync,
	// is written (the agent's start: lists, decoding, build, kernel).
	StartupCPUProfile string
	// PolicyScale, when set, adds the policies-at-scale measurement
	// after the last size, over its pods.
	PolicyScale PolicyScale
	Logf        func(format string, args ...any)
}

func (c *ScaleConfig) defaults() {
	if len(c.Pods) == 0 {
		c.Pods = []int{1000, 10000, 50000, 100000, 150000}
	}
	if c.Policies <= 0 {
		c.Policies = 1000
	}
	if c.LocalPods <= 0 {
		c.LocalPods = 4
	}
	if c.Incremental <= 0 {
		c.Incremental = 10
	}
	if c.Settle <= 0 {
		c.Settle = 10 * time.Second
	}
	if c.Parallel <= 0 {
		c.Parallel = 48
	}
	if c.FakeNodes <= 0 {
		c.FakeNodes = 50
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// sizeName is "10k" for 10000.
func sizeName(n int) string {
	if n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// RunScale starts a real API server and one real agent process (a node of
// the lab, with a few local pods), fills the API with pods on fake nodes
// and policies, and measures at each size the agent's startup, full sync,
// one-pod incremental syncs (from its nftpolicy_sync_duration_seconds
// histogram), CPU and RSS; with cfg.PolicyScale, then the policies at
// scale over the last size's pods. On an error, the figures measured
// before it are returned with it.
func RunScale(ctx context.Context, cfg ScaleConfig) (*Result, error) {
	cfg.defaults()
	if !slices.IsSorted(cfg.Pods) {
		return nil, errors.New("scale: pod counts must increase")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("scale: needs root")
	}
	res := &Result{}
	var runErr error
	tb := cluster.NewProgramTB("scale")
	tb.Out = os.Stderr
	err := tb.Run(func(tb *cluster.ProgramTB) {
		runErr = runScale(ctx, tb, cfg, res)
	})
	// What was measured before an error is kept: a failure in the
	// policy-scale step, after an hour of sizes, must not lose them.
	deriveScale(res, cfg.Pods)
	return res, errors.Join(runErr, err)
}

// deriveScale adds the figures computed from several sizes: how flat the
// one-pod sync is (100k against 10k), and the resident memory each pod
// adds at the margin, from 10k pods to the largest size (the issue's
// rss_marginal_kib_per_pod: the agent's fixed cost is left out).
func deriveScale(res *Result, pods []int) {
	if a, b := res.Float("incr_sync_ms_10k"), res.Float("incr_sync_ms_100k"); a > 0 && b > 0 {
		res.Set("incr_sync_flatness_100k_vs_10k", round(b/a, 2))
	}
	const base = 10000
	if len(pods) == 0 || pods[len(pods)-1] <= base {
		return
	}
	top := pods[len(pods)-1]
	lo, hi := res.Float("rss_mb_"+sizeName(base)), res.Float("rss_mb_"+sizeName(top))
	if math.IsNaN(lo) || math.IsNaN(hi) {
		return
	}
	res.Set("rss_marginal_kib_per_pod", round((hi-lo)*1024/float64(top-base), 3))
}

func runScale(ctx context.Context, tb *cluster.ProgramTB, cfg ScaleConfig, res *Result) error {
	c, cs, pols, err := startScaleCluster(ctx, tb, cfg, cluster.EnforcerNftpolicy, "")
	if err != nil {
		return err
	}
	res.Set("scale_policies", len(pols))
	res.Set("scale_local_pods", cfg.LocalPods)

	agent := c.Agent("node-1")
	if err := eachScaleSize(ctx, cs, agent, cfg, func(n int) error { return measureSize(ctx, c, cs, agent, n, cfg, res) }); err != nil {
		return err
	}
	if cfg.HeapProfile != "" || cfg.StartupCPUProfile != "" {
		if err := inProcessProfiles(ctx, c, cfg.HeapProfile, cfg.StartupCPUProfile, cfg.Logf); err != nil {
			return err
		}
	}
	have := cfg.Pods[len(cfg.Pods)-1] // every size's pods are in the API
	if cfg.PolicyScale.Policies > 0 {
		if err := measurePolicyScale(ctx, c, cs, agent, have, pols, cfg, res); err != nil {
			return fmt.Errorf("policy scale: %w", err)
		}
	}
	if err := measureQueueMode(ctx, c, cs, agent, have, cfg, res); err != nil {
		return fmt.Errorf("queue mode: %w", err)
	}
	return nil
}

// startScaleCluster starts the cluster RunScale and RunRSS measure in: one
// lab node (node-1) whose agent, of enforcer, is not started, every
// namespace of the largest size (mode: nftpolicy's, empty for hybrid),
// cfg.Policies NetworkPolicies spread over the namespaces of the smallest size (so that growing the cluster adds
// pods, not policies) and cfg.LocalPods real pods on node-1 that some of
// them select. It returns the client, which writes fast (protobuf, no
// rate limit), and the policies it created.
func startScaleCluster(ctx context.Context, tb *cluster.ProgramTB, cfg ScaleConfig, enforcer cluster.Enforcer, mode compile.Mode) (*cluster.Cluster, kubernetes.Interface, []*networkingv1.NetworkPolicy, error) {
	// The API server runs on the agent's two CPUs here. Profiling on:
	// settleAPIServer collects its heap through /debug/pprof/heap (on by
	// default in kube-apiserver; the lab's other tests turn it off). Its
	// watch cache's consistency check off: every few minutes it lists
	// every pod from etcd and from the cache and hashes both (at 150,000
	// pods about 10 s of its CPU and a collection of its heap): a start it
	// overlapped took 7.4 s instead of 3.
	c := cluster.Start(tb, cluster.Config{Enforcer: enforcer, Mode: mode, Nodes: []string{"node-1"}, NoAgents: true, Verbosity: 1, Logf: cfg.Logf,
		APIServerArgs: []string{"--profiling=true", "--feature-gates=DetectCacheInconsistency=false"}})
	rc := c.Env.RESTConfig()
	rc.QPS, rc.Burst = 1e6, 1e6
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	maxPods := cfg.Pods[len(cfg.Pods)-1]
	nNS := (maxPods + podsPerNS - 1) / podsPerNS
	t0 := time.Now()
	if err := parallel(ctx, nNS, 16, func(i int) error { return c.EnsureNamespace(ctx, scaleNSName(i), scaleNSLabels(i)) }); err != nil {
		return nil, nil, nil, err
	}
	firstNS := (cfg.Pods[0] + podsPerNS - 1) / podsPerNS
	pols := scalePolicies(firstNS, cfg.Policies)
	if err := parallel(ctx, len(pols), 16, func(i int) error {
		_, err := cs.NetworkingV1().NetworkPolicies(pols[i].Namespace).Create(ctx, pols[i], metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, nil, nil, fmt.Errorf("creating policies: %w", err)
	}
	for k := 0; k < cfg.LocalPods; k++ {
		j := k % 20 // app-<j>: some policies select it
		p := cluster.Pod{Namespace: scaleNSName(k % firstNS), Name: fmt.Sprintf("local-%d", k), Node: "node-1",
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", j), "tier": tiers[k%3]}, Ports: scalePorts(j)}
		if _, err := c.CreatePod(ctx, p); err != nil {
			return nil, nil, nil, err
		}
	}
	cfg.Logf("scale: %d namespaces, %d policies, %d local pods in %v", nNS, len(pols), cfg.LocalPods, time.Since(t0).Round(time.Millisecond))
	return c, cs, pols, nil
}

// eachScaleSize grows the API's pods to each of cfg.Pods in turn with the
// agent stopped (it would sync thousands of times while they are created
// and slow the API server down), calls measure with the count, and stops
// the agent at the end.
func eachScaleSize(ctx context.Context, cs kubernetes.Interface, agent *cluster.Agent, cfg ScaleConfig, measure func(n int) error) error {
	have := 0
	for _, n := range cfg.Pods {
		if err := agent.Stop(10 * time.Second); err != nil {
			return err
		}
		if err := growScalePods(ctx, cs, have, n, cfg); err != nil {
			return err
		}
		have = n
		if err := measure(n); err != nil {
			return fmt.Errorf("at %d pods: %w", n, err)
		}
	}
	return agent.Stop(10 * time.Second)
}

// growScalePods creates the pods of fake nodes from the have-th to the
// n-th, namespace after namespace.
func growScalePods(ctx context.Context, cs kubernetes.Interface, have, n int, cfg ScaleConfig) error {
	t0 := time.Now()
	cpu0 := cpuOf("kube-apiserver", "etcd")
	if err := parallel(ctx, n-have, cfg.Parallel, func(k int) error {
		idx := have + k
		return createScalePod(ctx, cs, idx/podsPerNS, idx%podsPerNS, cfg.FakeNodes)
	}); err != nil {
		return err
	}
	d := time.Since(t0)
	cpu := cpuOf("kube-apiserver", "etcd") - cpu0
	cfg.Logf("scale: %d pods in the API (%d created in %v, %.0f pods/s; kube-apiserver+etcd CPU %.2f ms per pod)",
		n, n-have, d.Round(time.Millisecond), float64(n-have)/d.Seconds(), cpu*1000/float64(n-have))
	return nil
}

// measureSize measures the agent at one size: its first sync on a node
// without the table (a node's boot: the table and the program snapshot of
// the previous size are deleted first), one-pod syncs, idle CPU and RSS, then a restart over the
// table it wrote (an agent restarted or updated on its node: a re-sync).
func measureSize(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, agent *cluster.Agent, n int, cfg ScaleConfig, res *Result) error {
	sz := sizeName(n)
	if err := bootNode(c); err != nil {
		return err
	}
	startup, cpuStartup, err := startAgentTimed(ctx, c, agent, sz, "first sync", "full_sync", cfg, res)
	if err != nil {
		return err
	}
	pid := agent.Pid()
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	_, prog, rs, err := scaleProgram(ctx, c)
	if err != nil {
		return err
	}
	ns, name, err := pickScalePod(prog, rs)
	if err != nil {
		return err
	}
	lag0, err := scrape(ctx, agent)
	if err != nil {
		return err
	}
	cpu0, _ := procCPU(pid)
	incr, err := timePodChanges(ctx, cs, agent, ns, name, cfg.Incremental)
	if err != nil {
		return err
	}
	cpu1, _ := procCPU(pid)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	// Idle: informer resyncs are off; what is left is the runtime, the
	// heartbeat and the metrics scrapes of this harness.
	time.Sleep(cfg.Settle / 5)
	cpu2, _ := procCPU(pid)
	time.Sleep(cfg.Settle)
	cpu3, _ := procCPU(pid)
	st, err := procStatus(pid)
	if err != nil {
		return err
	}
	rss, hwm := st["VmRSS"]/1024, st["VmHWM"]/1024
	m, _ := agent.Metrics(ctx)
	// What the resident memory is: anonymous (the Go heap and the
	// runtime's) and file pages (the binary's text), and how much of the
	// heap is garbage not yet collected.
	cfg.Logf("scale: %d pods: RSS anon %.1f MiB file %.1f MiB; Go heap in use %.1f MiB, allocated %.1f MiB, next GC at %.1f MiB, %.0f GCs, last %.1fs ago",
		n, st["RssAnon"]/1024, st["RssFile"]/1024, m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_heap_alloc_bytes"]/(1<<20),
		m["go_memstats_next_gc_bytes"]/(1<<20), m["go_gc_duration_seconds_count"], float64(time.Now().UnixNano())/1e9-m["go_memstats_last_gc_time_seconds"])
	res.Set("startup_s_"+sz, round(startup.Seconds(), 2))
	res.Set("startup_agent_cpu_s_"+sz, round(cpuStartup, 2))
	res.Set("incr_sync_ms_"+sz, millis(Percentile(incr, 50)))
	res.Set("incr_sync_ms_max_"+sz, millis(Percentile(incr, 100)))
	res.Set("cpu_ms_per_incr_"+sz, round((cpu1-cpu0)*1000/float64(len(incr)), 1))
	res.Set("cpu_idle_pct_"+sz, round((cpu3-cpu2)/cfg.Settle.Seconds()*100, 2))
	res.Set("rss_mb_"+sz, round(rss, 1))
	res.Set("rss_peak_mb_"+sz, round(hwm, 1))
	res.Set("set_elements_"+sz, m["nftpolicy_programmed_set_elements"])
	setLag(res, "evaluator_lag_ms_p99_"+sz, lag0, m)
	res.Set("go_heap_mb_"+sz, round(m["go_memstats_heap_inuse_bytes"]/(1<<20), 1))
	res.Set("go_heap_alloc_mb_"+sz, round(m["go_memstats_heap_alloc_bytes"]/(1<<20), 1))
	res.Set("rss_anon_mb_"+sz, round(st["RssAnon"]/1024, 1))
	cfg.Logf("scale: %d pods: incremental p50 %v max %v; RSS %.0f MB (peak %.0f MB); idle CPU %.2f%%",
		n, Percentile(incr, 50).Round(10*time.Microsecond), Percentile(incr, 100).Round(10*time.Microsecond), rss, hwm, (cpu3-cpu2)/cfg.Settle.Seconds()*100)

	// The same agent restarted over its own table: the kernel's sets are
	// read and compared, only differences are written.
	if err := agent.Stop(10 * time.Second); err != nil {
		return err
	}
	if _, _, err := startAgentTimed(ctx, c, agent, sz, "re-sync", "full_resync", cfg, res); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	_, err = c.WaitProgrammed(ctx)
	return err
}

// bootNode makes node-1 as a boot leaves it: no table, and no program
// snapshot in its agent's state directory (a tmpfs on a node; a snapshot
// left from the previous measurement would be read at the next start, a
// restart's cost, not a boot's).
func bootNode(c *cluster.Cluster) error {
	snap := filepath.Join(c.Agent("node-1").StateDir(), evaluate.SnapshotFile("node-1"))
	if err := os.Remove(snap); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	has, err := c.HasTable("node-1")
	if err != nil || !has {
		return err
	}
	if out, err := c.Lab.NodeExec("node-1", "nft", "delete", "table", "inet", compile.TableName); err != nil {
		return fmt.Errorf("deleting the previous measurement's table: %v: %s", err, out)
	}
	return nil
}

// timePodChanges times one-pod incremental syncs: a pod of a fake node
// switches between tier=web and tier=api, which moves it in or out of a
// peer set of the node's ruleset; the pod is left as it was.
func timePodChanges(ctx context.Context, cs kubernetes.Interface, agent *cluster.Agent, ns, name string, changes int) ([]time.Duration, error) {
	return timePodChangesAs(ctx, cs, agent, ns, name, changes, "pods")
}

// timePodChangesAs is timePodChanges timing the sync of any of kinds that
// follows each change.
func timePodChangesAs(ctx context.Context, cs kubernetes.Interface, agent *cluster.Agent, ns, name string, changes int, kinds ...string) ([]time.Duration, error) {
	var incr []time.Duration
	for k := 0; k < changes; k++ {
		tier := "api"
		if k%2 == 1 {
			tier = "web"
		}
		before, err := scrape(ctx, agent)
		if err != nil {
			return nil, err
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"tier":%q}}}`, tier)
		if _, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, err
		}
		d, err := waitSyncOf(ctx, agent, kinds, before)
		if err != nil {
			return nil, err
		}
		incr = append(incr, d)
		time.Sleep(50 * time.Millisecond)
	}
	if changes%2 == 1 {
		patch := []byte(`{"metadata":{"labels":{"tier":"web"}}}`)
		if _, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, err
		}
	}
	return incr, nil
}

// startAgentTimed starts the agent and waits for its first committed (full)
// sync; it records <prefix>_ms_<sz> (the sync's duration) and, from the
// agent's log line, its build / apply / kernel-read split. sz names the
// measurement ("150k", or "150k_10k_policies").
func startAgentTimed(ctx context.Context, c *cluster.Cluster, agent *cluster.Agent, sz, what, prefix string, cfg ScaleConfig, res *Result) (startup time.Duration, cpuStartup float64, err error) {
	// Every start appends to the agent's log: its first sync's line is the
	// one after those of the earlier starts.
	firstSyncs := strings.Count(agent.LogTail(math.MaxInt), firstSyncLine)
	gcs0, err := settleAPIServer(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	api0 := cpuOf("kube-apiserver")
	start := time.Now()
	if err := agent.Start(); err != nil {
		return 0, 0, err
	}
	pid := agent.Pid()
	// Polled: /readyz, which turns ready at the first commit, then the
	// metrics once. /metrics itself, every 20 ms, would cost the agent
	// CPU of its own (gathering, compressing) that a real start does not
	// spend (Prometheus scrapes every 15 s or so).
	var m map[string]float64
	for {
		if code, _ := agent.Ready(ctx); code == http.StatusOK {
			m, err = agent.Metrics(ctx)
			if err == nil && m[`nftpolicy_sync_duration_seconds_count{kind="full"}`] >= 1 {
				break
			}
		}
		if !agent.Running() {
			return 0, 0, fmt.Errorf("the agent exited; log tail:\n%s", agent.LogTail(30))
		}
		if time.Since(start) > 5*time.Minute {
			return 0, 0, fmt.Errorf("no full sync after 5 minutes (last scrape error %v); log tail:\n%s", err, agent.LogTail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	startup = time.Since(start)
	api := cpuOf("kube-apiserver") - api0
	if cpuStartup, err = procCPU(pid); err != nil {
		return 0, 0, err
	}
	gcs1, err := apiServerGCs(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	full := m[`nftpolicy_sync_duration_seconds_sum{kind="full"}`] / m[`nftpolicy_sync_duration_seconds_count{kind="full"}`]
	cfg.Logf("scale: %s, %s: agent ready in %v, full sync %.0f ms, %.1f s CPU; kube-apiserver %.1f s CPU, %d heap collections meanwhile",
		sz, what, startup.Round(time.Millisecond), full*1000, cpuStartup, api, gcs1-gcs0)
	res.Set(prefix+"_ms_"+sz, round(full*1000, 1))
	res.Set(prefix+"_apiserver_cpu_s_"+sz, round(api, 2))
	res.Set(prefix+"_apiserver_gcs_"+sz, gcs1-gcs0)
	logged := false
	for t0 := time.Now(); !logged && time.Since(t0) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		// The line follows the metrics.
		logged = strings.Count(agent.LogTail(math.MaxInt), firstSyncLine) > firstSyncs
	}
	tail := agent.LogTail(400)
	if split, ok := firstSyncValues(tail, "build", "apply", "kernelRead"); ok && logged {
		cfg.Logf("scale: %s, %s: build %.0f ms, apply %.0f ms (of which reading the kernel's sets %.0f ms)",
			sz, what, split[0], split[1], split[2])
		res.Set(prefix+"_build_ms_"+sz, round(split[0], 1))
		res.Set(prefix+"_apply_ms_"+sz, round(split[1], 1))
		res.Set(prefix+"_read_ms_"+sz, round(split[2], 1))
	}
	// What the agent's process used during that sync: CPU near the
	// duration means it computed, far below it that it waited for a CPU;
	// page faults are fresh heap pages (each zeroed by the kernel).
	if u, ok := firstSyncValues(tail, "cpu", "nftCPU", "pageFaults", "gcCycles"); ok && logged {
		cfg.Logf("scale: %s, %s: agent CPU %.0f ms (nft processes %.0f ms), %.0f page faults (%.0f MiB), %.0f GC cycles",
			sz, what, u[0], u[1], u[2], u[2]*4096/(1<<20), u[3])
		res.Set(prefix+"_cpu_ms_"+sz, round(u[0], 1))
		res.Set(prefix+"_nft_cpu_ms_"+sz, round(u[1], 1))
		res.Set(prefix+"_page_faults_"+sz, u[2])
		res.Set(prefix+"_gc_cycles_"+sz, u[3])
	}
	return startup, cpuStartup, nil
}

// scaleProgram lists the API's objects and compiles node-1's program and
// ruleset from them, as the agent does.
func scaleProgram(ctx context.Context, c *cluster.Cluster) (compile.Input, *compile.Program, *compile.Ruleset, error) {
	in, err := c.ListInputs(ctx)
	if err != nil {
		return in, nil, nil, err
	}
	in.NodeName, in.NodeIPs = "node-1", c.NodeIPs("node-1")
	prog := compile.Build(in)
	rcfg := compile.RenderConfig{Mode: c.Mode()}
	rcfg.Defaults()
	rs, err := compile.Render(prog, rcfg)
	if err != nil {
		return in, nil, nil, err
	}
	return in, prog, rs, nil
}

// pickScalePod finds a pod of a fake node with tier=web that belongs to a
// peer set of node-1's ruleset ("pods with tier=web in namespace x").
func pickScalePod(prog *compile.Program, rs *compile.Ruleset) (ns, name string, err error) {
	for si := range prog.Selectors {
		sel := &prog.Selectors[si]
		if !strings.HasPrefix(sel.Key, "ns=") || !strings.HasSuffix(sel.Key, "|pods=tier=web") {
			continue
		}
		if _, ok := rs.Sets[compile.PeerSetName(sel, true)]; !ok {
			continue
		}
		for _, id := range sel.Members {
			if p := &prog.Pods[id]; !p.Local {
				return p.Namespace, p.Name, nil
			}
		}
	}
	return "", "", errors.New("no pod of a fake node is in a tier=web peer set of node-1's ruleset")
}

// waitSync waits for the agent's next sync of the given kind ("pods": the
// tracker's element changes; "policies": NetworkPolicy changes through the
// tracker; "incremental": a rebuild) after the metrics in before and
// returns its duration (the mean if several ran). A sync of kind instead
// (if not "") without one of kind is an error: the change did not take
// the path being timed.
func waitSync(ctx context.Context, agent *cluster.Agent, kind, instead string, before map[string]float64) (time.Duration, error) {
	count := func(k string) string { return `nftpolicy_sync_duration_seconds_count{kind="` + k + `"}` }
	cnt, sum := count(kind), `nftpolicy_sync_duration_seconds_sum{kind="`+kind+`"}`
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		m, err := agent.Metrics(ctx)
		if err == nil && m[cnt] > before[cnt] {
			return time.Duration((m[sum] - before[sum]) / (m[cnt] - before[cnt]) * float64(time.Second)), nil
		}
		if err == nil && instead != "" && m[count(instead)] > before[count(instead)] {
			return 0, fmt.Errorf("a %q sync instead of a %q sync; log tail:\n%s", instead, kind, agent.LogTail(30))
		}
		if !agent.Running() {
			return 0, fmt.Errorf("the agent exited; log tail:\n%s", agent.LogTail(30))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, fmt.Errorf("no %q sync within 3 minutes; log tail:\n%s", kind, agent.LogTail(30))
}

// scrape reads the agent's metrics, trying again for up to a minute: an
// agent busy with a rebuild at 150k pods and 10k policies, on a loaded
// machine, can miss the client's 5 s timeout.
func scrape(ctx context.Context, agent *cluster.Agent) (map[string]float64, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := agent.Metrics(ctx)
		if err == nil || !agent.Running() || time.Now().After(deadline) || ctx.Err() != nil {
			return m, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procCPU returns the user+system CPU seconds of a process.
func procCPU(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clkTck, nil
}

// cpuOf returns the CPU seconds of this process's children with the given
// command names (the control plane's processes).
func cpuOf(names ...string) float64 {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	total := 0.0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+2:])
		if len(f) < 2 || f[1] != strconv.Itoa(self) || !slices.Contains(names, s[open+1:end]) {
			continue
		}
		if c, err := procCPU(pid); err == nil {
			total += c
		}
	}
	return total
}

// clkTck is sysconf(_SC_CLK_TCK), 100 on Linux.
const clkTck = 100

// procStatus returns the numeric fields of /proc/<pid>/status (sizes in
// kB, as the kernel writes them).
func procStatus(pid int) (map[string]float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if x, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[k] = x
		}
	}
	return out, nil
}

// firstSyncLine marks the agent's log line of its first committed sync.
const firstSyncLine = `"First sync committed"`

// firstSyncValues reads the last "First sync committed" line of an agent
// log (each start appends one) and returns the values of keys: durations
// (quoted, as klog writes them) in milliseconds, counts as they are. ok is
// false without the line or without one of the keys.
func firstSyncValues(log string, keys ...string) (vals []float64, ok bool) {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], firstSyncLine) {
			continue
		}
		for _, key := range keys {
			_, rest, found := strings.Cut(lines[i], " "+key+"=")
			if !found {
				return nil, false
			}
			if q, isDuration := strings.CutPrefix(rest, `"`); isDuration {
				v, _, _ := strings.Cut(q, `"`)
				d, err := time.ParseDuration(v)
				if err != nil {
					return nil, false
				}
				vals = append(vals, float64(d)/float64(time.Millisecond))
				continue
			}
			v, _, _ := strings.Cut(rest, " ")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, false
			}
			vals = append(vals, f)
		}
		return vals, true
	}
	return nil, false
}

// settleAPIServer has the lab's kube-apiserver collect its heap before a
// timed start (GET /debug/pprof/heap?gc=1 runs a full collection), as Go's
// benchmark harness collects its own heap before each benchmark, and
// returns its count of collections. The lab runs the API server on the
// agent's two CPUs: every pod stream of 150,000 pods allocates about
// 0.9 GB in it, half its live heap, so every other start would otherwise
// include a collection of 1.8 GB (6-7 s of its CPU, on the cores the
// agent starts on), where the collection cycle happened to stand decided
// the figure. On a real control plane its collections run on cores of its
// own. <prefix>_apiserver_gcs_<sz> counts those that still overlap a start.
func settleAPIServer(ctx context.Context, c *cluster.Cluster) (int, error) {
	if _, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/heap").Param("gc", "1").DoRaw(ctx); err != nil {
		return 0, fmt.Errorf("collecting the API server's heap: %w", err)
	}
	return apiServerGCs(ctx, c)
}

// apiServerGCs returns how many heap collections the lab's kube-apiserver
// has run (its go_gc_duration_seconds_count).
func apiServerGCs(ctx context.Context, c *cluster.Cluster) (int, error) {
	body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	const name = "go_gc_duration_seconds_count "
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err
		}
	}
	return 0, fmt.Errorf("the API server's metrics have no %s", strings.TrimSpace(name))
}
