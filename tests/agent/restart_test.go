package agent_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

const (
	loadInterval = 5 * time.Millisecond
	loadDuration = 6 * time.Second
	killAfter    = 2 * time.Second
	// connTimeout bounds one connection; below the 1 s initial SYN
	// retransmission timeout, so a connection whose SYN is dropped fails
	// rather than succeeding later on a retransmit.
	connTimeout = 900 * time.Millisecond
)

// attempt is one connection of the load.
type attempt struct {
	at     time.Duration // start, from the beginning of the load
	ok     bool
	detail string
}

// TestAgentRestart opens new TCP connections continuously (one every 5 ms
// from each client for 6 s) from an allowed and from a denied pod on node-2
// to a server on node-1, while the agent of node-1, which enforces the
// server's ingress policy, is killed with SIGKILL after 2 s and started
// again at once.
//
// Hybrid mode: the kernel decides, and the table stays in the kernel while
// no agent runs, so every allowed connection succeeds and every denied one
// fails throughout. Queue mode: userspace decides every new connection to
// the server, and while no agent listens on the queue the kernel drops them
// (fail-closed), so denied connections never succeed and allowed ones fail
// for a while; the test reports that gap and checks that allowed connections
// succeed again once the new agent is ready.
func TestAgentRestart(t *testing.T) {
	requireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) { testAgentRestart(t, mode) })
	}
}

func testAgentRestart(t *testing.T, mode compile.Mode) {
	c := cluster.Start(t, cluster.Config{Mode: mode})
	ctx := testContext(t, 3*time.Minute)
	if err := c.EnsureNamespace(ctx, "r", nil); err != nil {
		t.Fatal(err)
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "r", Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		cluster.Pod{Namespace: "r", Name: "good", Labels: map[string]string{"role": "good"}, Node: "node-2"},
		cluster.Pod{Namespace: "r", Name: "bad", Labels: map[string]string{"role": "bad"}, Node: "node-2"},
	)
	if _, err := c.ApplyPolicy(ctx, makePolicy("r", "server", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "server")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selector("role", "good")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	m := verify(t, ctx, c, "before the restart")
	expect(t, m, "before the restart", map[[2]string]bool{{"r/good", "r/server"}: true, {"r/bad", "r/server"}: false})

	server := c.PodIPs("r/server")[0]
	good, err := c.PodEndpoint("r/good")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := c.PodEndpoint("r/bad")
	if err != nil {
		t.Fatal(err)
	}
	agent := c.Agent("node-1")

	var (
		mu               sync.Mutex
		goodRes, badRes  []attempt
		wg               sync.WaitGroup
		killAt, readyAt  time.Duration
		boundAt          time.Duration // queue mode: the new agent listens on the queue
		restartErr       error
		restartSignalled = make(chan struct{})
	)
	dial := func(from netlab.Endpoint, at time.Duration, out *[]attempt) {
		defer wg.Done()
		r := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: from, To: server, Port: 80, Proto: netlab.TCP, Timeout: connTimeout})
		mu.Lock()
		defer mu.Unlock()
		if r.Err != nil {
			r.Reason = "harness: " + r.Err.Error()
		}
		*out = append(*out, attempt{at: at, ok: r.Connected, detail: r.Reason})
	}
	start := time.Now()
	go func() {
		defer close(restartSignalled)
		time.Sleep(killAfter)
		killAt = time.Since(start)
		if restartErr = agent.Kill(); restartErr != nil {
			return
		}
		if restartErr = agent.Start(); restartErr != nil {
			return
		}
		if mode == compile.ModeQueue {
			var at time.Time
			if at, restartErr = waitQueueBound(ctx, c, "node-1"); restartErr != nil {
				return
			}
			boundAt = at.Sub(start)
		}
		restartErr = agent.WaitReady(ctx)
		readyAt = time.Since(start)
	}()
	tick := time.NewTicker(loadInterval)
	for now := time.Now(); now.Sub(start) < loadDuration; now = <-tick.C {
		at := now.Sub(start)
		wg.Add(2)
		go dial(good, at, &goodRes)
		go dial(bad, at, &badRes)
	}
	tick.Stop()
	wg.Wait()
	<-restartSignalled
	if restartErr != nil {
		t.Fatalf("restarting the agent of node-1: %v", restartErr)
	}
	sortAttempts(goodRes)
	sortAttempts(badRes)
	t.Logf("%s: %d connections from each client over %v; agent of node-1 killed at %v, ready again at %v (down %v)",
		mode, len(goodRes), loadDuration, killAt.Round(time.Millisecond), readyAt.Round(time.Millisecond), (readyAt - killAt).Round(time.Millisecond))

	for _, a := range badRes {
		if a.ok {
			t.Errorf("%s: a denied connection started at %v succeeded", mode, a.at.Round(time.Millisecond))
		}
	}
	failed, run := 0, gapRun{}
	var cur gapRun
	for i, a := range goodRes {
		if a.ok {
			cur = gapRun{}
			continue
		}
		failed++
		if cur.n == 0 {
			cur.first = a.at
			cur.detail = a.detail
		}
		cur.n++
		cur.last = a.at
		if i+1 < len(goodRes) {
			cur.next = goodRes[i+1].at
		} else {
			cur.next = loadDuration
		}
		if cur.n > run.n {
			run = cur
		}
	}
	switch mode {
	case compile.ModeQueue:
		t.Logf("queue mode restart gap: %d ms (longest run of failed allowed connections: %d, first at %v (%s), next success at %v); "+
			"%d of %d allowed connections failed; the new agent listened on the queue %d ms after SIGKILL, ready (/readyz 200) after %d ms",
			run.gap().Milliseconds(), run.n, run.first.Round(time.Millisecond), run.detail, run.next.Round(time.Millisecond),
			failed, len(goodRes), (boundAt - killAt).Milliseconds(), (readyAt - killAt).Milliseconds())
		// Before the kill, and from the moment the new agent listens on the
		// queue (before its first sync: it decides from the program
		// snapshot of --state-dir), every allowed connection succeeds. The
		// gap is the process restart, nothing else; connections whose SYN
		// was queued when the old agent died are dropped with its socket.
		for _, a := range goodRes {
			if !a.ok && (a.at+connTimeout < killAt || a.at > boundAt) {
				t.Errorf("queue mode: allowed connection at %v failed (%s) outside [%v, %v], from SIGKILL to the new agent listening",
					a.at.Round(time.Millisecond), a.detail, killAt.Round(time.Millisecond), boundAt.Round(time.Millisecond))
			}
		}
		if run.n == 0 {
			t.Logf("queue mode: no allowed connection failed at all")
		}
	default:
		if failed > 0 {
			t.Errorf("%s mode: %d allowed connections failed; longest run %d from %v (%s): the table must keep enforcing while the agent is away",
				mode, failed, run.n, run.first.Round(time.Millisecond), run.detail)
		}
	}

	// The new agent is fully in charge again.
	m = verify(t, ctx, c, "after the restart")
	expect(t, m, "after the restart", map[[2]string]bool{{"r/good", "r/server"}: true, {"r/bad", "r/server"}: false})
}

// gapRun is a run of consecutive failed connections.
type gapRun struct {
	n                 int
	first, last, next time.Duration
	detail            string
}

// gap is from the start of the first failed connection to the start of the
// first one that succeeded after it.
func (g gapRun) gap() time.Duration {
	if g.n == 0 {
		return 0
	}
	return g.next - g.first
}

// waitQueueBound polls the kernel's queue statistics in node's namespace
// every millisecond until queue 100 (the agent's --queue-num) has a
// listener again (the killed agent's went with its socket), and returns
// when it saw it.
func waitQueueBound(ctx context.Context, c *cluster.Cluster, node string) (time.Time, error) {
	for {
		var bound bool
		err := c.Lab.InNode(node, func() error {
			st, err := queue.ReadKernelQueueStats()
			for _, q := range st {
				bound = bound || q.QueueNum == 100
			}
			return err
		})
		if err != nil {
			return time.Time{}, err
		}
		if bound {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func sortAttempts(a []attempt) { sort.Slice(a, func(i, j int) bool { return a[i].at < a[j].at }) }
