package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/slicetest"
)

// remotePodDelay times, with the agent's --pod-source source, how long a
// remote pod's change takes to be enforced: a client on node-2 (no agent)
// is relabelled in and out of the peers a policy of a server on node-1
// admits, changes times; the delay is from the start of the API write to
// the SYN of the first connection with the new verdict (the delay
// section's prober). With slices the section writes the client's slice
// right after its Pod, as a publisher that batches nothing would: the
// publisher's own delay is not in the figure. With sourcePublisher the
// agent reads slices that the real publisher (`nftpolicy publish`, one
// replica, its defaults) writes, and the section writes only the Pod.
func remotePodDelay(ctx context.Context, tb *cluster.ProgramTB, source string, changes int, logf func(string, ...any)) ([]time.Duration, error) {
	agentSource := source
	if source == sourcePublisher {
		agentSource = podstore.SourceSlices
	}
	c := cluster.Start(tb, cluster.Config{Nodes: []string{"node-1", "node-2"}, NoAgents: true, Verbosity: 1, Logf: logf,
		AgentArgs: []string{"--pod-source", agentSource}})
	slicetest.InstallCRD(tb, c.Env)
	slicetest.GrantAgentRead(tb, c.Env)
	writeSlices := source == podstore.SourceSlices
	if source == sourcePublisher {
		stop, err := startPublisher(c)
		if err != nil {
			return nil, err
		}
		defer stop()
	} else {
		leaseCtx, stopLease := context.WithCancel(ctx)
		defer stopLease()
		slicetest.StartLease(leaseCtx, tb, c.Client, time.Second)
	}
	if err := c.EnsureNamespace(ctx, delayNS, nil); err != nil {
		return nil, err
	}
	for _, p := range []cluster.Pod{
		{Namespace: delayNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: delayNS, Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-2"},
	} {
		obj, err := c.CreatePod(ctx, p)
		if err != nil {
			return nil, err
		}
		if !writeSlices {
			continue
		}
		if err := slicetest.Write(ctx, c.Client, slicetest.Slice(p.Name, obj)); err != nil {
			return nil, err
		}
	}
	// Admits app=client only.
	if _, err := c.ApplyPolicy(ctx, policy("deny", "server", true)); err != nil {
		return nil, err
	}
	a := c.Agent("node-1")
	if err := a.Start(); err != nil {
		return nil, err
	}
	if err := a.WaitReady(ctx); err != nil {
		return nil, err
	}
	from, err := c.PodEndpoint(delayNS + "/client")
	if err != nil {
		return nil, err
	}
	server := c.PodIPs(delayNS + "/server")[0]
	pr := &prober{lab: c.Lab, from: from, interval: 2 * time.Millisecond, timeout: 250 * time.Millisecond}
	if _, err := c.WaitVerdict(ctx, cluster.Flow{Name: "client admitted", From: from, To: server, Port: 80, Allowed: true}, 50*time.Millisecond, time.Second); err != nil {
		return nil, err
	}
	if agentSource == podstore.SourceSlices {
		if err := waitSlicesSource(ctx, a); err != nil {
			return nil, err
		}
	}
	pods := c.Client.CoreV1().Pods(delayNS)
	var out []time.Duration
	for k := range changes {
		admitted := k%2 == 1
		app := map[bool]string{true: "client", false: "other"}[admitted]
		d, err := pr.measure(ctx, server, admitted, func() error {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": app}}})
			p, err := pods.Patch(ctx, "client", types.MergePatchType, patch, metav1.PatchOptions{})
			if err != nil || !writeSlices {
				return err
			}
			return slicetest.Write(ctx, c.Client, slicetest.Slice("client", p))
		})
		if err != nil {
			return nil, fmt.Errorf("change %d: %w", k, err)
		}
		out = append(out, d)
		time.Sleep(100 * time.Millisecond)
	}
	return out, nil
}

// sourcePublisher is remotePodDelay's source of slices written by the
// real publisher process.
const sourcePublisher = "publisher"

// startPublisher runs `nftpolicy publish` against c's API server as its
// admin (the harness applies no admission policy on slices); stop kills
// it.
func startPublisher(c *cluster.Cluster) (stop func(), err error) {
	bin, err := cluster.AgentBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "publish", "--kubeconfig", c.Env.AdminKubeconfig, "--identity", "bench-publisher",
		"--metrics-bind-address", "")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}, nil
}

// waitSlicesSource waits, up to a minute, for the agent to read other
// nodes' pods from slices (it reads every Pod until the publisher's
// synced Lease is fresh).
func waitSlicesSource(ctx context.Context, a *cluster.Agent) error {
	var m map[string]float64
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if m, err = a.Metrics(ctx); err == nil && m[`nftpolicy_pod_source{source="slices"}`] == 1 {
			return nil
		}
	}
	return fmt.Errorf("the agent does not read slices (%v)", err)
}
