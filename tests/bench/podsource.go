package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/slicetest"
)

// PodSourceConfig configures the podsource section: one agent's start
// with --pod-source pods (a watch-list of every Pod) and slices (the
// PodAddressSlices, the node's own Pods and the publisher's Lease), on the
// lab's real API server, with the fanout section's Pods (the shape of a
// Deployment's pods on a real cluster: fanoutobjects.go). The section
// writes the slices itself, as the publisher would (its Lease renewed).
type PodSourceConfig struct {
	// Pods, on Nodes nodes, in Deployments of SliceSize pods (one slice
	// each).
	Pods, Nodes, SliceSize int
	// Starts is how many starts of each source are timed (the median
	// is reported).
	Starts int
	// RemoteChanges is how many remote pod changes are timed per source
	// on a lab of two nodes (0: none).
	RemoteChanges int
	Logf          func(format string, args ...any)
}

func (c *PodSourceConfig) defaults() {
	c.Pods = cmpOr(c.Pods, 3000)
	c.Nodes = cmpOr(c.Nodes, 100)
	c.SliceSize = cmpOr(c.SliceSize, 50)
	c.Starts = cmpOr(c.Starts, 3)
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

func cmpOr(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// RunPodSource prints podsource_{pods,slices}_start_bytes (what the
// agent's pod source receives from the API server until its first sync,
// uncompressed), podsource_{pods,slices}_first_sync_ms and, on a lab of
// two nodes, podsource_{pods,slices,publisher}_remote_pod_delay_{p50,max}_ms
// (remotePodDelay; publisher: the real publisher process writes the
// slices).
func RunPodSource(ctx context.Context, cfg PodSourceConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("podsource", func(tb *cluster.ProgramTB, res *Result) error {
		return runPodSource(ctx, tb, cfg, res)
	})
}

func runPodSource(ctx context.Context, tb *cluster.ProgramTB, cfg PodSourceConfig, res *Result) error {
	env := cluster.StartControlPlane(tb)
	slicetest.InstallCRD(tb, env)
	rc := env.RESTConfig()
	rc.QPS, rc.Burst = 1e6, 1e6
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := podSourceObjects(ctx, cs, cfg); err != nil {
		return err
	}
	cfg.Logf("podsource: %d pods on %d nodes, %d slices, written in %v", cfg.Pods, cfg.Nodes, cfg.Pods/cfg.SliceSize, time.Since(t0).Round(time.Millisecond))
	leaseCtx, stopLease := context.WithCancel(ctx)
	defer stopLease()
	slicetest.StartLease(leaseCtx, tb, cs, time.Second)
	node := fanoutNodeName(0)
	for _, source := range []string{podstore.SourcePods, podstore.SourceSlices} {
		var bytes, ms []float64
		for range cfg.Starts {
			b, d, err := timePodSourceStart(ctx, rc, source, node)
			if err != nil {
				return fmt.Errorf("%s: %w", source, err)
			}
			bytes, ms = append(bytes, float64(b)), append(ms, float64(d.Microseconds())/1000)
		}
		slices.Sort(bytes)
		slices.Sort(ms)
		cfg.Logf("podsource: %s: bytes %v, first sync ms %v", source, bytes, ms)
		res.Set("podsource_"+source+"_start_bytes", int64(bytes[len(bytes)/2]))
		res.Set("podsource_"+source+"_first_sync_ms", fmt.Sprintf("%.1f", ms[len(ms)/2]))
	}
	for _, source := range []string{podstore.SourcePods, podstore.SourceSlices, sourcePublisher} {
		if cfg.RemoteChanges <= 0 {
			break
		}
		ds, err := remotePodDelay(ctx, tb, source, cfg.RemoteChanges, cfg.Logf)
		if err != nil {
			return fmt.Errorf("%s: remote pod delay: %w", source, err)
		}
		cfg.Logf("podsource: %s: remote pod change delays %v", source, ds)
		res.Set("podsource_"+source+"_remote_pod_delay_p50_ms", millis(Percentile(ds, 50)))
		res.Set("podsource_"+source+"_remote_pod_delay_max_ms", millis(Percentile(ds, 100)))
	}
	return nil
}

// podSourceObjects writes the pods and, per Deployment, its slice.
func podSourceObjects(ctx context.Context, cs kubernetes.Interface, cfg PodSourceConfig) error {
	const ns = "shop"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// No controller-manager: the ServiceAccount admission needs.
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	pods := make([]*corev1.Pod, cfg.Pods)
	err := parallel(ctx, cfg.Pods, 16, func(i int) error {
		node := i % cfg.Nodes
		p := fanoutPod(ns, fmt.Sprintf("svc-%d", i/cfg.SliceSize), i, fanoutNodeName(node))
		// Each Deployment its own labels, as the publisher groups them.
		p.Labels["app.kubernetes.io/name"] = fmt.Sprintf("svc-%d", i/cfg.SliceSize)
		p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{FieldManager: controllerManager})
		if err != nil {
			return err
		}
		fanoutPodStatus(p, fanoutPodIP(i), fanoutNode(fanoutNodeName(node), node).Status.Addresses[0].Address, true, time.Now())
		pods[i], err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: kubeletManager})
		return err
	})
	if err != nil {
		return err
	}
	deploys := (cfg.Pods + cfg.SliceSize - 1) / cfg.SliceSize
	return parallel(ctx, deploys, 16, func(d int) error {
		group := pods[d*cfg.SliceSize : min((d+1)*cfg.SliceSize, len(pods))]
		return slicetest.Write(ctx, cs, slicetest.Slice(fmt.Sprintf("svc-%d", d), group...))
	})
}

// timePodSourceStart runs the agent's pod store of source on node until
// its first sync, and returns the bytes its clients received and the
// time it took.
func timePodSourceStart(ctx context.Context, base *rest.Config, source, node string) (int64, time.Duration, error) {
	var received atomic.Int64
	rc := rest.CopyConfig(base)
	rc.DisableCompression = true
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &received} }
	podClient, err := slim.NewPodClient(rc)
	if err != nil {
		return 0, 0, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var store podstore.Reader = podstore.New(podstore.RESTSource(podClient), func(string) {}, logr.Discard())
	if source == podstore.SourceSlices {
		pods := podstore.RESTSource(podClient)
		store, err = podstore.NewSliced(podstore.SlicedConfig{Node: node, Local: podstore.OnNode(pods, node), Pods: pods,
			Slices: podstore.RESTSliceSource(cs.CoreV1().RESTClient()),
			Lease:  podstore.InformLease(cs, slicetest.LeaseNamespace, slicetest.LeaseName),
			Limits: podstore.DefaultSliceLimits}, func(string) {}, logr.Discard())
		if err != nil {
			return 0, 0, err
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !store.HasSynced() {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	if sl, ok := store.(*podstore.Sliced); ok && sl.Source() != podstore.SourceSlices {
		return 0, 0, fmt.Errorf("the store reads %q, not slices", sl.Source())
	}
	return received.Load(), took, nil
}
