package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// StatusConfig configures RunStatus.
type StatusConfig struct {
	// Nodes simulated against the API server: an agent pod and a
	// status.Reporter each.
	Nodes int
	// Policies the client evaluates (NetworkPolicies in the API).
	Policies int
	// Changes each node reports (its last ones; status.MaxChanges at most).
	Changes int
	// Runs of Gather + Evaluate timed (one more, untimed, opens the
	// connection first).
	Runs int
	// Burst changes reach every node within BurstWindow.
	Burst       int
	BurstWindow time.Duration
	// WaitRounds of policy create -> status.Wait with two real agents;
	// 0 leaves that part out.
	WaitRounds int
	// AdminWrites makes the reporters write as an admin, whom API Priority
	// and Fairness exempts: the write path's cost without the flow control
	// the agents' ServiceAccount gets.
	AdminWrites bool
	Logf        func(format string, args ...any)
}

func (c *StatusConfig) defaults() {
	orDefault(&c.Nodes, 1000)
	orDefault(&c.Policies, 100)
	orDefault(&c.Runs, 9)
	orDefault(&c.Changes, status.MaxChanges)
	orDefault(&c.Burst, 10)
	orDefault(&c.BurstWindow, 50*time.Millisecond)
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// orDefault sets *v to def unless it is positive.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// statusClients are the status clients of one configuration.
func statusClients(rc *rest.Config) (status.Clients, error) {
	dyn, err := dynamic.NewForConfig(rc)
	return status.Clients{Dynamic: dyn}, err
}

// RunStatus measures the NodeEnforcement status path against a real API
// server: with Nodes simulated agents (their pods, and a status.Reporter
// each), the client's Gather + Evaluate, and the API writes and the time
// one policy change, then a burst of changes, costs; then, in a cluster
// of its own with two real agent processes, the time from a policy's
// creation to status.Wait returning. Each part's control plane is stopped
// before the next starts.
func RunStatus(ctx context.Context, cfg StatusConfig) (*Result, error) {
	cfg.defaults()
	res, err := runInProgramTB("status", func(tb *cluster.ProgramTB, res *Result) error {
		return measureStatusAPI(ctx, tb, cfg, res)
	})
	if err != nil || cfg.WaitRounds == 0 {
		return res, err
	}
	wait, err := runInProgramTB("status-wait", func(tb *cluster.ProgramTB, res *Result) error {
		skip, err := measureWaitLatency(ctx, tb, cfg, res)
		if skip != "" {
			cfg.Logf("status: wait latency not measured: %s", skip)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	res.Merge(wait)
	return res, nil
}

// statusAgents are where the simulated agents' pods are, as install.yaml's.
var statusAgents = status.DefaultAgents

// measureStatusAPI is RunStatus's first part, on a control plane of its own.
func measureStatusAPI(ctx context.Context, tb testing.TB, cfg StatusConfig, res *Result) error {
	// API Priority and Fairness on, as in a cluster (kubeenv turns it off):
	// install.yaml's FlowSchema decides how a burst of the agents' writes
	// is queued.
	env := cluster.StartControlPlane(tb, kubeenv.WithAPIServerArgs("--enable-priority-and-fairness=true"))
	if err := applyStatusInstall(tb, env); err != nil {
		return err
	}
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 1e6, 1e6
	admin, err := statusClients(rc)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn := admin.Dynamic
	nodes := make([]string, cfg.Nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i+1)
	}
	t0 := time.Now()
	if err := ensureAgentPods(ctx, cs, nodes); err != nil {
		return err
	}
	pols, err := createStatusPolicies(ctx, cs, cfg.Policies)
	if err != nil {
		return err
	}
	cfg.Logf("status: %d agent pods and %d policies in %v", len(nodes), len(pols), time.Since(t0).Round(time.Millisecond))

	// The agents write as the nftpolicy ServiceAccount, as in a cluster:
	// its RBAC and its API priority level, not an admin's.
	agents := admin
	if !cfg.AdminWrites {
		arc := env.ServiceAccountConfig(tb, statusAgents.Namespace, "nftpolicy")
		arc.QPS, arc.Burst = 1e6, 1e6
		if agents, err = statusClients(arc); err != nil {
			return err
		}
	}
	fleetCtx, stop := context.WithCancel(ctx)
	defer stop()
	f, err := startFleet(fleetCtx, agents.Dynamic, nodes, pols, cfg.Changes)
	if err != nil {
		return err
	}
	t0 = time.Now()
	if _, err := f.publish(ctx, dyn, []status.Publication{f.initial}); err != nil {
		return fmt.Errorf("the first NodeEnforcements: %w", err)
	}
	cfg.Logf("status: %d NodeEnforcements written in %v", len(nodes), time.Since(t0).Round(time.Millisecond))

	if err := measureGather(ctx, env, cfg, pols, res); err != nil {
		return err
	}
	return measureWrites(ctx, cs, dyn, f, cfg, res)
}

// applyStatusInstall applies install.yaml's ServiceAccount, RBAC and
// NodeEnforcement CustomResourceDefinition, and waits for the latter.
func applyStatusInstall(tb testing.TB, env *kubeenv.Env) error {
	docs, err := cluster.InstallDocuments("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
		"PriorityLevelConfiguration", "FlowSchema")
	if err != nil {
		return err
	}
	if !strings.Contains(strings.Join(docs, ""), "name: nodeenforcements."+status.Group) {
		return errors.New("install.yaml declares no NodeEnforcement CustomResourceDefinition")
	}
	path := filepath.Join(tb.TempDir(), "status-install.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		return err
	}
	if out, err := env.Kubectl(tb, "apply", "-f", path); err != nil {
		return fmt.Errorf("applying install.yaml's NodeEnforcement CRD and RBAC: %w: %s", err, out)
	}
	crd := "crd/" + status.Resource + "." + status.Group
	if out, err := env.Kubectl(tb, "wait", "--for=condition=Established", "--timeout=60s", crd); err != nil {
		return fmt.Errorf("waiting for %s: %w: %s", crd, err, out)
	}
	return nil
}

// ensureAgentPods creates, for each node without one, an agent pod from
// install.yaml's DaemonSet template, bound to the node and Ready, as the
// DaemonSet controller and the kubelet would.
func ensureAgentPods(ctx context.Context, cs kubernetes.Interface, nodes []string) error {
	docs, err := cluster.InstallDocuments("DaemonSet")
	if err != nil {
		return err
	}
	if len(docs) != 1 {
		return fmt.Errorf("install.yaml: %d DaemonSets, want 1", len(docs))
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &ds); err != nil {
		return fmt.Errorf("install.yaml's DaemonSet: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ds.Spec.Template.Spec.ServiceAccountName}}
	if _, err := cs.CoreV1().ServiceAccounts(ds.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	have, err := cs.CoreV1().Pods(statusAgents.Namespace).List(ctx, metav1.ListOptions{LabelSelector: statusAgents.Selector})
	if err != nil {
		return err
	}
	covered := map[string]bool{}
	for _, p := range have.Items {
		covered[p.Spec.NodeName] = true
	}
	var missing []string
	for _, n := range nodes {
		if !covered[n] {
			missing = append(missing, n)
		}
	}
	return parallel(ctx, len(missing), 32, func(i int) error {
		return createAgentPod(ctx, cs, &ds, missing[i], i)
	})
}

func createAgentPod(ctx context.Context, cs kubernetes.Interface, ds *appsv1.DaemonSet, node string, i int) error {
	ctrl := true
	pod := &corev1.Pod{
		ObjectMeta: *ds.Spec.Template.ObjectMeta.DeepCopy(),
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Name, pod.Namespace = ds.Name+"-"+node, ds.Namespace
	pod.Labels["controller-revision-hash"] = "6c9b7f8d5"
	pod.Labels["pod-template-generation"] = "1"
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name,
		UID: "5d0c7a52-9f3e-4d1b-8c6a-0e2f4b7a9c31", Controller: &ctrl, BlockOwnerDeletion: &ctrl}}
	pod.Spec.NodeName = node
	pod, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the agent pod of %s: %w", node, err)
	}
	now := metav1.Now()
	ip := fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: ip, PodIP: ip, StartTime: &now,
		HostIPs: []corev1.HostIP{{IP: ip}}, PodIPs: []corev1.PodIP{{IP: ip}}, QOSClass: corev1.PodQOSBurstable,
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	started := true
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Ready: true, Started: &started, Image: c.Image,
			ImageID:     c.Image + "@sha256:3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f",
			ContainerID: fmt.Sprintf("containerd://%064x", i+1),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if _, err := cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the status of the agent pod of %s: %w", node, err)
	}
	return nil
}

// statusNS is the namespace of the policies of the status benchmark.
const statusNS = "status-bench"

// createStatusPolicies creates n NetworkPolicies and returns them as stored.
func createStatusPolicies(ctx context.Context, cs kubernetes.Interface, n int) ([]*networkingv1.NetworkPolicy, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: statusNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	out := make([]*networkingv1.NetworkPolicy, n)
	err := parallel(ctx, n, 8, func(i int) error {
		port := intstr.FromInt32(8080)
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: statusNS, Name: fmt.Sprintf("allow-app-%03d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
				}},
			},
		}
		var err error
		out[i], err = cs.NetworkingV1().NetworkPolicies(statusNS).Create(ctx, np, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating policies: %w", err)
	}
	return out, nil
}

func policyRef(np *networkingv1.NetworkPolicy) status.PolicyRef {
	return status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: np.Namespace, Name: np.Name}
}

// statusFleet is the simulated agents: one running status.Reporter per node.
type statusFleet struct {
	nodes     []string
	reporters []*status.Reporter
	writes    atomic.Int64 // completed writes (a create counts once)
	failed    atomic.Int64
	// initial is every node's first commit: watermarks past every policy,
	// the last policy creations, two policies with problems.
	initial  status.Publication
	problems []status.Problem
}

func startFleet(ctx context.Context, dyn dynamic.Interface, nodes []string, pols []*networkingv1.NetworkPolicy, changes int) (*statusFleet, error) {
	f := &statusFleet{nodes: nodes}
	for _, n := range nodes {
		r, err := status.NewReporter(status.ReporterConfig{Node: n, Client: dyn, OnWrite: func(err error) {
			f.writes.Add(1)
			if err != nil {
				f.failed.Add(1)
			}
		}})
		if err != nil {
			return nil, err
		}
		f.reporters = append(f.reporters, r)
		go r.Run(ctx)
	}
	var last string
	for _, np := range pols {
		if compareRV(np.ResourceVersion, last) > 0 {
			last = np.ResourceVersion
		}
	}
	now := time.Now()
	f.initial = status.Publication{Watermarks: status.Watermarks{NetworkPolicies: last, ClusterNetworkPolicies: last}, At: now}
	for i, np := range pols[max(0, len(pols)-changes):] {
		f.initial.Changes = append(f.initial.Changes, policyChange(np, time.Duration(800+37*i)*time.Microsecond, now))
	}
	for i, reason := range []string{"PolicyTooLarge", "UnsupportedNetworkPolicy"} {
		np := pols[(i*7+3)%len(pols)]
		f.problems = append(f.problems, status.Problem{PolicyRef: policyRef(np), Generation: np.Generation, Reason: reason,
			Message: "ingress rule 1 selects more than 65536 addresses: the node denies what the rule would allow (fail-closed)"})
	}
	f.initial.Problems = f.problems
	return f, nil
}

func policyChange(np *networkingv1.NetworkPolicy, latency time.Duration, at time.Time) status.Change {
	return status.Change{PolicyRef: policyRef(np), ResourceVersion: np.ResourceVersion, Generation: np.Generation,
		LatencyMicros: latency.Microseconds(), ProgrammedAt: metav1.NewMicroTime(at)}
}

// change is the commit of one policy change on every node: the watermark
// advanced to it, the change among the last ones.
func (f *statusFleet) change(np *networkingv1.NetworkPolicy) status.Publication {
	now := time.Now()
	return status.Publication{
		Watermarks: status.Watermarks{NetworkPolicies: np.ResourceVersion, ClusterNetworkPolicies: f.initial.Watermarks.ClusterNetworkPolicies},
		Changes:    []status.Change{policyChange(np, 1200*time.Microsecond, now)},
		Problems:   f.problems, At: now,
	}
}

// publish hands every reporter the publications, spread evenly over
// window, and returns how long from the first until every NodeEnforcement
// shows the last one's NetworkPolicy watermark.
func (f *statusFleet) publish(ctx context.Context, dyn dynamic.Interface, pubs []status.Publication, window ...time.Duration) (time.Duration, error) {
	list, err := dyn.Resource(status.GVR).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	rv := list.GetResourceVersion()
	w, err := dyn.Resource(status.GVR).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for k, p := range pubs {
		if k > 0 && len(window) > 0 {
			time.Sleep(time.Until(start.Add(window[0] * time.Duration(k) / time.Duration(len(pubs)))))
		}
		for _, r := range f.reporters {
			r.Programmed(p)
		}
	}
	want := pubs[len(pubs)-1].Watermarks.NetworkPolicies
	if err := awaitWatermark(ctx, dyn, w, len(f.nodes), want); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// awaitWatermark reads the watch until n NodeEnforcements show a
// NetworkPolicy watermark at or after want. When the API server ends the
// watch (it drops a watcher that falls behind), it lists and watches
// again, as an informer does.
func awaitWatermark(ctx context.Context, dyn dynamic.Interface, w watch.Interface, n int, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	done := map[string]bool{}
	see := func(u *unstructured.Unstructured) {
		wm, _, _ := unstructured.NestedString(u.Object, "status", "programmed", "networkPolicies")
		if compareRV(wm, want) >= 0 {
			done[u.GetName()] = true
		}
	}
	for len(done) < n {
		select {
		case <-ctx.Done():
			w.Stop()
			return fmt.Errorf("%d of %d NodeEnforcements show watermark %s after 2 minutes", len(done), n, want)
		case ev, ok := <-w.ResultChan():
			if u, isObj := ev.Object.(*unstructured.Unstructured); ok && isObj && ev.Type != watch.Deleted {
				see(u)
			}
			if ok && ev.Type != watch.Error {
				continue
			}
			w.Stop()
			list, err := dyn.Resource(status.GVR).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for i := range list.Items {
				see(&list.Items[i])
			}
			if w, err = dyn.Resource(status.GVR).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}); err != nil {
				return err
			}
		}
	}
	w.Stop()
	return nil
}

func compareRV(a, b string) int {
	if b == "" {
		return 1
	}
	c, err := resourceversion.CompareResourceVersion(a, b)
	if err != nil {
		return -1
	}
	return c
}

// measureGather times what `kubectl nftpolicy status` does for Policies
// policies: status.Gather (two lists) and one Cluster.Evaluate per policy,
// with an admin's default client (JSON), over a warm connection.
func measureGather(ctx context.Context, env *kubeenv.Env, cfg StatusConfig, pols []*networkingv1.NetworkPolicy, res *Result) error {
	var listed atomic.Int64
	rc := env.RESTConfig()
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &listed} })
	c, err := statusClients(rc)
	if err != nil {
		return err
	}
	targets := make([]status.Target, len(pols))
	for i, np := range pols {
		targets[i] = status.Target{Ref: policyRef(np), ResourceVersion: np.ResourceVersion, Generation: np.Generation}
	}
	var total, gather, eval []time.Duration
	for run := 0; run <= cfg.Runs; run++ {
		listed.Store(0)
		t0 := time.Now()
		cl, err := status.Gather(ctx, c, statusAgents)
		if err != nil {
			return err
		}
		t1 := time.Now()
		rows := make([]status.Row, len(targets))
		for i, t := range targets {
			rows[i] = cl.Evaluate(t)
		}
		t2 := time.Now()
		if err := checkRows(cl, rows, cfg.Nodes); err != nil {
			return err
		}
		if run == 0 {
			res.Set(fmt.Sprintf("status_gather_ms_first_%d_nodes", cfg.Nodes), millis(t2.Sub(t0)))
			continue
		}
		total, gather, eval = append(total, t2.Sub(t0)), append(gather, t1.Sub(t0)), append(eval, t2.Sub(t1))
	}
	nodes := strconv.Itoa(cfg.Nodes)
	res.Set("status_gather_ms_"+nodes+"_nodes", millis(Percentile(total, 50)))
	res.Set("status_gather_ms_max_"+nodes+"_nodes", millis(Percentile(total, 100)))
	res.Set("status_gather_lists_ms_"+nodes+"_nodes", millis(Percentile(gather, 50)))
	res.Set(fmt.Sprintf("status_evaluate_ms_%d_policies_%s_nodes", len(pols), nodes), millis(Percentile(eval, 50)))
	res.Set("status_gather_listed_kib_"+nodes+"_nodes", round(float64(listed.Load())/1024, 0))
	res.Set("status_gather_runs", cfg.Runs)
	cfg.Logf("status: Gather + Evaluate of %d policies over %d nodes: median %v, max %v (%d runs); %d KiB listed",
		len(pols), cfg.Nodes, Percentile(total, 50).Round(time.Millisecond), Percentile(total, 100).Round(time.Millisecond), cfg.Runs, listed.Load()/1024)
	return nil
}

// checkRows fails unless every node is covered and enforces every policy,
// with the problems' warnings: the benchmark timed the whole decision.
func checkRows(cl *status.Cluster, rows []status.Row, nodes int) error {
	if len(cl.Nodes) != nodes {
		return fmt.Errorf("status.Gather saw %d nodes, want %d", len(cl.Nodes), nodes)
	}
	warned := 0
	for _, r := range rows {
		if !r.Done() || len(r.Programmed) != nodes {
			why := ""
			if len(r.Lagging) > 0 {
				why = r.Lagging[0].Node + ": " + r.Lagging[0].Why
			}
			return fmt.Errorf("%s: %d of %d nodes lag (%s)", r.Ref, len(r.Lagging), r.Nodes, why)
		}
		warned += len(r.Warnings)
	}
	if warned == 0 {
		return errors.New("no policy got the nodes' problems as warnings")
	}
	return nil
}

// countingTransport counts the bytes of the response bodies it reads.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = countingBody{resp.Body, t.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// measureWrites counts the API server's NodeEnforcement writes for one
// policy change reaching every node, then for Burst changes within
// BurstWindow, and times each until every object shows it.
func measureWrites(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, f *statusFleet, cfg StatusConfig, res *Result) error {
	nodes := strconv.Itoa(cfg.Nodes)
	edits := make([]*networkingv1.NetworkPolicy, 1+cfg.Burst)
	for i := range edits {
		np, err := editPolicy(ctx, cs, fmt.Sprintf("allow-app-%03d", i%cfg.Policies), i)
		if err != nil {
			return err
		}
		edits[i] = np
	}
	for _, step := range []struct {
		name, propagation string
		edits             []*networkingv1.NetworkPolicy
	}{
		{"status_api_writes_per_change_" + nodes + "_nodes", "status_propagation_ms_" + nodes + "_nodes", edits[:1]},
		{fmt.Sprintf("status_api_writes_per_burst_of_%d_%s_nodes", cfg.Burst, nodes), fmt.Sprintf("status_burst_propagation_ms_%s_nodes", nodes), edits[1:]},
	} {
		before, err := quiescentWrites(ctx, cs, f)
		if err != nil {
			return err
		}
		pubs := make([]status.Publication, len(step.edits))
		for i, np := range step.edits {
			pubs[i] = f.change(np)
		}
		cpu0 := cpuOf("kube-apiserver", "etcd")
		d, err := f.publish(ctx, dyn, pubs, cfg.BurstWindow)
		if err != nil {
			return err
		}
		after, err := quiescentWrites(ctx, cs, f)
		if err != nil {
			return err
		}
		cpu := cpuOf("kube-apiserver", "etcd") - cpu0
		writes, rejected := total(after)-total(before), after["429"]-before["429"]
		if ok := writes - rejected; ok > 0 && cpu > 0 && len(step.edits) == 1 {
			res.Set("status_api_cpu_ms_per_write", round(cpu*1000/ok, 2))
		}
		res.Set(step.name, round(writes/float64(cfg.Nodes), 3))
		res.Set(strings.Replace(step.name, "_writes_", "_rejected_", 1), round(rejected/float64(cfg.Nodes), 3))
		res.Set(step.propagation, millis(d))
		cfg.Logf("status: %d change(s) on %d nodes: %.0f API writes (%.3f per node; %.0f rejected: 429), all shown after %v",
			len(step.edits), cfg.Nodes, writes, writes/float64(cfg.Nodes), rejected, d.Round(time.Millisecond))
	}
	if n := f.failed.Load(); n > 0 {
		res.Set("status_reporter_write_errors", n)
	}
	// One NodeEnforcement's size, as listed (JSON).
	u, err := dyn.Resource(status.GVR).Get(ctx, f.nodes[0], metav1.GetOptions{})
	if err != nil {
		return err
	}
	data, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	res.Set("status_nodeenforcement_kib", round(float64(len(data))/1024, 1))
	return nil
}

// editPolicy changes a policy's port and returns it as stored.
func editPolicy(ctx context.Context, cs kubernetes.Interface, name string, i int) (*networkingv1.NetworkPolicy, error) {
	patch := fmt.Sprintf(`{"spec":{"ingress":[{"from":[{"podSelector":{"matchLabels":{"role":"client"}}}],"ports":[{"port":%d}]}]}}`, 9000+i)
	np, err := cs.NetworkingV1().NetworkPolicies(statusNS).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("editing policy %s: %w", name, err)
	}
	return np, nil
}

// quiescentWrites waits until neither the reporters nor the API server's
// counter move for 300 ms and returns the API server's count of
// NodeEnforcement writes by response code.
func quiescentWrites(ctx context.Context, cs kubernetes.Interface, f *statusFleet) (map[string]float64, error) {
	prev, prevDone := -1.0, int64(-1)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		m, err := apiWrites(ctx, cs, status.Resource)
		if err != nil {
			return nil, err
		}
		done := f.writes.Load()
		if total(m) == prev && done == prevDone {
			return m, nil
		}
		prev, prevDone = total(m), done
		time.Sleep(300 * time.Millisecond)
	}
	return nil, errors.New("the NodeEnforcement writes did not settle within a minute")
}

// writeVerbs are the verbs of apiserver_request_total that write.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true}

// apiWrites reads the API server's /metrics and sums apiserver_request_total
// over the write verbs for a resource, by response code.
func apiWrites(ctx context.Context, cs kubernetes.Interface, resource string) (map[string]float64, error) {
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	return sumRequests(string(body), resource, writeVerbs)
}

// sumRequests sums the apiserver_request_total samples of resource whose
// verb is in verbs, by response code.
func sumRequests(metrics, resource string, verbs map[string]bool) (map[string]float64, error) {
	byCode := map[string]float64{}
	seen := false
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("metrics: malformed line %q", line)
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		seen = true
		if l["resource"] != resource || !verbs[l["verb"]] {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		byCode[l["code"]] += v
	}
	if !seen {
		return nil, errors.New("metrics: no apiserver_request_total")
	}
	return byCode, nil
}

func total(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}
