package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
)

// inProcessProfiles runs the agent's controller in this process (what
// cmd/nftpolicy agent runs: informers with the product's transform, Build,
// Render, a Syncer writing node-1's table) until its first sync. With
// cpuPath, a CPU profile of that start is written there (where the agent's
// start spends its CPU); with heapPath, a heap profile (in-use space after
// a GC) a second later: where the agent process's RSS goes. The agent
// process must be stopped.
func inProcessProfiles(ctx context.Context, c *cluster.Cluster, heapPath, cpuPath string, logf func(string, ...any)) error {
	render := compile.RenderConfig{Mode: c.Mode()}
	if render.UsesQueue() {
		v, err := queuerule.ProbeQueueVariant(ctx)
		if err != nil {
			return err
		}
		render.QueueVariant = compile.QueueVariant(v.String())
	}
	render.Defaults()
	// The node's syncer and queue runtime as the agent configures them:
	// a syncer without the netlink writer and the xt-compat rule's
	// installer fails every sync over the table the agent left.
	node, err := inproc.New(c.Lab, "node-1", render, quiet)
	if err != nil {
		return err
	}
	defer node.Close()
	rc := c.Env.RESTConfig()
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	podCfg := c.Env.RESTConfig()
	podCfg.DisableCompression = true // as the agent's default
	podClient, err := slim.NewPodClient(podCfg)
	if err != nil {
		return err
	}
	ctrl, err := controller.New(controller.Config{Client: cs, PodClient: podClient, NodeName: "node-1", NodeIPs: c.NodeIPs("node-1"), Render: render,
		Syncer: node.Syncer(), Evaluator: node.Evaluator(), Metrics: controller.NewMetrics(), Logger: quiet})
	if err != nil {
		return err
	}
	stopCPU := func() error { return nil }
	if cpuPath != "" {
		f, err := os.Create(cpuPath)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		stopCPU = func() error { pprof.StopCPUProfile(); return f.Sync() }
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Not ready in time: a sync that keeps failing (the controller logs
	// nothing here) must end the profile with an error, not hang the run.
	deadline := time.After(5 * time.Minute)
	for !ctrl.Ready() {
		select {
		case err := <-done:
			return fmt.Errorf("in-process controller: %w", err)
		case <-deadline:
			return fmt.Errorf("in-process controller: not ready after 5 minutes (its first sync did not commit)")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if cpuPath != "" {
		if err := stopCPU(); err != nil {
			return err
		}
		logf("scale: in-process controller: first sync committed after %v; CPU profile in %s", time.Since(start).Round(time.Millisecond), cpuPath)
	}
	if heapPath == "" {
		return nil
	}
	time.Sleep(time.Second)
	runtime.GC()
	f, err := os.Create(heapPath)
	if err != nil {
		return err
	}
	defer f.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	logf("scale: in-process controller: heap in use %.0f MiB after GC; profile in %s", float64(ms.HeapInuse)/(1<<20), heapPath)
	return pprof.Lookup("heap").WriteTo(f, 0)
}
