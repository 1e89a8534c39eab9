package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// FanoutConfig configures RunFanout: what N watching clients cost a real
// kube-apiserver per object change and per client start (issue 48).
type FanoutConfig struct {
	// Agents are the numbers of simulated clients measured, in increasing
	// order (the clients of a smaller number stay connected).
	Agents []int
	// Pods are the pods while the changes are measured: every simulated
	// agent reads them all when it starts, so they are few; the cost of
	// one change does not depend on how many others are stored.
	Pods int
	// SliceSize is the pods of a Deployment, each with its Service and one
	// EndpointSlice of that many endpoints.
	SliceSize int
	// Changes are the object writes timed at each number of clients.
	Changes int
	// StartPods are the pods when the clients' starts are measured, and
	// StartAgents how many start, one after the other.
	StartPods, StartAgents int
	// Nodes are the Node objects (pods are spread over them); by default
	// StartPods/30, the density of 150,000 pods on 5,000 nodes, so that an
	// agent that watches its own node's pods reads as many as there.
	Nodes int
	// Idle is how long the API server's CPU is read with the clients
	// connected and no change, to subtract what it spends anyway.
	Idle time.Duration
	Logf func(format string, args ...any)
}

func (c *FanoutConfig) defaults() {
	if len(c.Agents) == 0 {
		c.Agents = []int{100, 250, 500, 1000}
	}
	if c.Pods <= 0 {
		c.Pods = 200
	}
	if c.SliceSize <= 0 {
		c.SliceSize = 50
	}
	if c.Changes <= 0 {
		c.Changes = 100
	}
	if c.StartPods <= 0 {
		c.StartPods = 10000
	}
	if c.StartAgents <= 0 {
		c.StartAgents = 5
	}
	if c.Nodes <= 0 {
		c.Nodes = max(c.StartPods*fanoutTargetNodes/fanoutTargetPods, 1)
	}
	if c.Idle <= 0 {
		c.Idle = 3 * time.Second
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// fanoutTarget* are the sizes the figures are extrapolated to: Kubernetes'
// supported limits.
const (
	fanoutTargetNodes = 5000
	fanoutTargetPods  = 150000
)

// RunFanout measures, on a real kube-apiserver and etcd, what simulated
// clients making nftpolicy's agent's requests (the watchall_ figures:
// every agent watches every pod) and kube-proxy's (the kubeproxy_ ones:
// EndpointSlices) cost the API server: its CPU time (utime+stime of the
// process, not wall time: the machine is shared), the bytes it sends and
// the memory it allocates, per object change at each number of clients
// and per client start; and the linear model of each in the number of
// clients, extrapolated to 5,000.
func RunFanout(ctx context.Context, cfg FanoutConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("fanout", func(tb *cluster.ProgramTB, res *Result) error {
		return runFanout(ctx, tb, cfg, res)
	})
}

func runFanout(ctx context.Context, tb *cluster.ProgramTB, cfg FanoutConfig, res *Result) error {
	// The watch cache's consistency check off, as in the scale section:
	// every few minutes it lists and hashes every pod, a cost of the
	// stored pods, not of the watchers, that would land in one window.
	env := cluster.StartControlPlane(tb, kubeenv.WithAPIServerArgs("--feature-gates=DetectCacheInconsistency=false"))
	pid, err := childPID("kube-apiserver")
	if err != nil {
		return err
	}
	fx, err := newFanoutCluster(tb, env, cfg, pid)
	if err != nil {
		return err
	}
	if fx.dyn, err = installPodSlices(tb, env); err != nil {
		return err
	}
	t0 := time.Now()
	if err := fx.grow(ctx, cfg.Pods); err != nil {
		return err
	}
	cfg.Logf("fanout: %d nodes, %d pods, %d EndpointSlices and PodAddressSlices in %v (a pod is %d bytes of protobuf, an EndpointSlice %d, a PodAddressSlice %d of JSON)",
		cfg.Nodes, len(fx.pods), len(fx.slices), time.Since(t0).Round(time.Millisecond), fx.podBytes(), fx.sliceBytes(), fx.podSliceBytes())
	res.Set("fanout_pod_protobuf_bytes", fx.podBytes())
	res.Set("fanout_endpointslice_protobuf_bytes", fx.sliceBytes())
	res.Set("fanout_podaddressslice_json_bytes", fx.podSliceBytes())
	for _, m := range []struct {
		prefix  string
		watches func(string) []watchRequest
		change  func(context.Context, int) error
	}{
		{"watchall", agentWatches, fx.changePod},
		{"kubeproxy", kubeProxyWatches, fx.changeSlice},
		{"podslices", podSliceWatches, fx.changePodAndSlice},
	} {
		if err := fx.measureChanges(ctx, res, m.prefix, m.watches, m.change); err != nil {
			return fmt.Errorf("%s: %w", m.prefix, err)
		}
	}
	return fx.measureAllStarts(ctx, res)
}

// measureAllStarts times the clients' starts with the pods of the changes
// and again with cfg.StartPods, and reports the line through them.
func (fx *fanoutCluster) measureAllStarts(ctx context.Context, res *Result) error {
	kinds := []struct {
		prefix  string
		watches func(string) []watchRequest
	}{{"watchall", agentWatches}, {"kubeproxy", kubeProxyWatches}, {"podslices", podSliceWatches}}
	costs := make([][]startCost, len(kinds))
	for round, pods := range []int{fx.cfg.Pods, fx.cfg.StartPods} {
		t0 := time.Now()
		if err := fx.grow(ctx, pods); err != nil {
			return err
		}
		if round > 0 {
			fx.cfg.Logf("fanout: %d pods in %v", len(fx.pods), time.Since(t0).Round(time.Millisecond))
		}
		for i, k := range kinds {
			c, err := fx.measureStarts(ctx, k.prefix, k.watches)
			if err != nil {
				return fmt.Errorf("%s start: %w", k.prefix, err)
			}
			costs[i] = append(costs[i], c)
		}
	}
	for i, k := range kinds {
		setStartModel(res, k.prefix, costs[i])
	}
	return nil
}

// fanoutCluster is the section's control plane and the objects it wrote.
type fanoutCluster struct {
	cfg    FanoutConfig
	cs     kubernetes.Interface
	sim    simConfig
	pid    int
	nss    []string
	pods   []*corev1.Pod // in index order; each the API server's last answer
	slices []*discoveryv1.EndpointSlice
	// dyn and podSlices: the PodAddressSlices of the podslices_ figures.
	dyn       dynamic.Interface
	podSlices []*unstructured.Unstructured
}

// fanoutNamespaces are the namespaces the Deployments are spread over.
const fanoutNamespaces = 10

func newFanoutCluster(tb *cluster.ProgramTB, env *kubeenv.Env, cfg FanoutConfig, pid int) (*fanoutCluster, error) {
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 1e6, 1e6
	rc.ContentType = runtime.ContentTypeProtobuf
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	sim, err := newSimConfig(env.RESTConfig(), "nftbench-fanout")
	if err != nil {
		return nil, err
	}
	fx := &fanoutCluster{cfg: cfg, cs: cs, sim: sim, pid: pid}
	for i := range fanoutNamespaces {
		// With its default ServiceAccount: admission adds the token's
		// projected volume to the pods, as on a cluster.
		fx.nss = append(fx.nss, env.CreateNamespace(tb, fmt.Sprintf("shop-%d", i)).Name)
	}
	ctx := context.Background()
	err = parallel(ctx, cfg.Nodes, 16, func(i int) error {
		_, err := cs.CoreV1().Nodes().Create(ctx, fanoutNode(fanoutNodeName(i), i), metav1.CreateOptions{FieldManager: kubeletManager})
		return err
	})
	return fx, err
}

func fanoutNodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// grow creates pods up to n (whole Deployments), each created as its
// controller does and given a running status as its kubelet does, then
// each Deployment's Service and EndpointSlice.
func (fx *fanoutCluster) grow(ctx context.Context, n int) error {
	size := fx.cfg.SliceSize
	first := len(fx.pods) / size
	deploys := (n+size-1)/size - first
	if deploys <= 0 {
		return nil
	}
	pods := make([]*corev1.Pod, deploys*size)
	slices := make([]*discoveryv1.EndpointSlice, deploys)
	err := parallel(ctx, len(pods), 16, func(j int) error {
		p, err := fx.createPod(ctx, first*size+j)
		pods[j] = p
		return err
	})
	if err != nil {
		return err
	}
	err = parallel(ctx, deploys, 16, func(d int) error {
		ns, name := fx.deployment(first + d)
		if _, err := fx.cs.CoreV1().Services(ns).Create(ctx, fanoutService(ns, name), metav1.CreateOptions{FieldManager: "kubectl"}); err != nil {
			return err
		}
		es, err := fx.cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, fanoutEndpointSlice(ns, name, pods[d*size:(d+1)*size]),
			metav1.CreateOptions{FieldManager: controllerManager})
		slices[d] = es
		return err
	})
	fx.pods = append(fx.pods, pods...)
	fx.slices = append(fx.slices, slices...)
	if err != nil {
		return err
	}
	return fx.createPodSlices(ctx, first, pods)
}

// deployment returns the namespace and name of the d-th Deployment.
func (fx *fanoutCluster) deployment(d int) (string, string) {
	return fx.nss[d%len(fx.nss)], fmt.Sprintf("svc-%d", d)
}

func (fx *fanoutCluster) createPod(ctx context.Context, i int) (*corev1.Pod, error) {
	ns, deploy := fx.deployment(i / fx.cfg.SliceSize)
	node := i % fx.cfg.Nodes
	p, err := fx.cs.CoreV1().Pods(ns).Create(ctx, fanoutPod(ns, deploy, i, fanoutNodeName(node)), metav1.CreateOptions{FieldManager: controllerManager})
	if err != nil {
		return nil, err
	}
	hostIP := fanoutNode(fanoutNodeName(node), node).Status.Addresses[0].Address
	fanoutPodStatus(p, fanoutPodIP(i), hostIP, true, time.Now())
	return fx.cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: kubeletManager})
}

// changePod is the k-th pod change: a kubelet's status update that flips
// a pod's readiness (one MODIFIED event of the whole pod to every pod
// watch).
func (fx *fanoutCluster) changePod(ctx context.Context, k int) error {
	i := k % fx.cfg.Pods
	p := fx.pods[i].DeepCopy()
	ready := p.Status.Conditions[2].Status != corev1.ConditionTrue
	fanoutPodStatus(p, p.Status.PodIP, p.Status.HostIP, ready, time.Now())
	np, err := fx.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: kubeletManager})
	if err == nil {
		fx.pods[i] = np
	}
	return err
}

// changeSlice is the EndpointSlice controller's answer to the same pod
// change: one endpoint's readiness flipped in its slice.
func (fx *fanoutCluster) changeSlice(ctx context.Context, k int) error {
	i := (k % fx.cfg.Pods) / fx.cfg.SliceSize
	es := fx.slices[i].DeepCopy()
	ep := &es.Endpoints[k%len(es.Endpoints)]
	ep.Conditions.Ready = new(!*ep.Conditions.Ready)
	ns, err := fx.cs.DiscoveryV1().EndpointSlices(es.Namespace).Update(ctx, es, metav1.UpdateOptions{FieldManager: controllerManager})
	if err == nil {
		fx.slices[i] = ns
	}
	return err
}

func (fx *fanoutCluster) podBytes() int {
	b, _ := fx.pods[0].Marshal()
	return len(b)
}

func (fx *fanoutCluster) sliceBytes() int {
	b, _ := fx.slices[0].Marshal()
	return len(b)
}

// apiserverSample is the API server's counters at one moment.
type apiserverSample struct {
	cpu   float64 // seconds, utime+stime
	alloc float64 // go_memstats_alloc_bytes_total
}

// sample reads the API server's CPU and allocations. The metrics are
// scraped before the CPU is read at the start of a window (first) and
// after it at its end, so that the scrapes' CPU falls outside the window.
func (fx *fanoutCluster) sample(ctx context.Context, first bool) (apiserverSample, error) {
	var s apiserverSample
	var err error
	if !first {
		if s.cpu, err = procCPUNS(fx.pid); err != nil {
			return s, err
		}
	}
	if s.alloc, err = fx.metric(ctx, "go_memstats_alloc_bytes_total"); err != nil {
		return s, err
	}
	if first {
		s.cpu, err = procCPUNS(fx.pid)
	}
	return s, err
}

// metric returns the sum of a metric's samples on the API server's
// /metrics.
func (fx *fanoutCluster) metric(ctx context.Context, name string) (float64, error) {
	body, err := fx.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("the API server's metrics: %w", err)
	}
	return sumMetric(string(body), name)
}

// sumMetric sums the samples of one metric in Prometheus' text format.
func sumMetric(text, name string) (float64, error) {
	sum, found := 0.0, false
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("no metric %s", name)
	}
	return sum, nil
}

// rssMB is the API server's resident memory.
func (fx *fanoutCluster) rssMB() float64 {
	st, err := procStatus(fx.pid)
	if err != nil {
		return 0
	}
	return st["VmRSS"] / 1024
}

// procCPUNS returns a process's CPU seconds at nanosecond resolution: the
// sum of its threads' run time (/proc/PID/task/*/schedstat), where
// /proc/PID/stat counts 10 ms ticks, too coarse for one change.
func procCPUNS(pid int) (float64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread has exited
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %w", pid, t.Name(), err)
		}
		total += ns / 1e9
	}
	return total, nil
}

// childPID returns the pid of this process's child with the given command
// name.
func childPID(name string) (int, error) {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
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
		if f := strings.Fields(s[end+2:]); len(f) >= 2 && f[1] == self && s[open+1:end] == name {
			return pid, nil
		}
	}
	return 0, errors.New("no child process " + name)
}
