package agent_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
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
// until the new agent listens; it decides from the program snapshot of its
// --state-dir from then on, before its first sync. The test reports that gap
// and checks that allowed connections succeed from the moment the new agent
// listens.
//
// queue-update replaces the SIGKILL by an update with maxSurge, as the
// DaemonSet of install.yaml does it: a second agent starts on node-1 while
// the first runs, listens on the alternate queue range and points the
// queue rule there with its first sync; the first agent then gets SIGTERM,
// points the rule there too, drains its queues and exits. No allowed
// connection may fail, no denied one succeed. queue-update-stopped-first
// sends the first agent SIGTERM 1 s before the second one starts, as a
// real DaemonSet update can (the new pod's readiness probe reaches the old
// agent on their shared host port): the first agent must wait for the
// second one's queues before it closes its own.
func TestAgentRestart(t *testing.T) {
	requireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) { testAgentRestart(t, mode, false, false) })
	}
	t.Run("queue-update", func(t *testing.T) { testAgentRestart(t, compile.ModeQueue, true, false) })
	t.Run("queue-update-stopped-first", func(t *testing.T) { testAgentRestart(t, compile.ModeQueue, true, true) })
}

// updateQueues is --queues of the agents (the alternate range follows).
const updateQueues = 2

// stopFirstLead: how long before the successor starts the old agent gets
// SIGTERM in queue-update-stopped-first: longer than the old agent takes
// from SIGTERM to its hand-over (0.3-0.8 s here), so that an agent that did
// not wait for its successor there would close its queues first (14 allowed
// connections of 965 failed so); within the 2 s it waits for one.
const stopFirstLead = time.Second

func testAgentRestart(t *testing.T, mode compile.Mode, update, stopFirst bool) {
	// --queues explicit: the bound check waits for every queue of the
	// range, and the default (one per CPU) depends on the machine.
	cfg := cluster.Config{Mode: mode, AgentArgs: []string{"--queues", strconv.Itoa(updateQueues)}}
	c := cluster.Start(t, cfg)
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
	r, err := c.RunRestartLoad(ctx, cluster.RestartLoad{
		Node: "node-1", Good: good, Bad: bad, Server: server, Port: 80,
		Interval: loadInterval, Duration: loadDuration, KillAfter: killAfter, ConnTimeout: connTimeout,
		QueueNum: map[bool]uint16{true: 100}[mode == compile.ModeQueue], // the agent's default --queue-num
		Update:   update, StopFirst: map[bool]time.Duration{true: stopFirstLead}[stopFirst], Queues: updateQueues,
	})
	if err != nil {
		t.Fatal(err)
	}
	what := "killed"
	if update {
		what = "updated"
	}
	t.Logf("%s: %d connections from each client over %v; agent of node-1 %s at %v, ready again at %v (after %v)",
		mode, len(r.Good), loadDuration, what, r.KillAt.Round(time.Millisecond), r.ReadyAt.Round(time.Millisecond), (r.ReadyAt - r.KillAt).Round(time.Millisecond))

	for _, a := range r.Bad {
		if a.OK {
			t.Errorf("%s: a denied connection started at %v succeeded", mode, a.At.Round(time.Millisecond))
		}
	}
	failed, run := r.FailedAllowed(), r.LongestGap(loadDuration)
	switch {
	case update && stopFirst:
		t.Logf("queue mode update, the old agent stopped %v before the successor started: the old agent had exited and the successor was ready after %d ms; "+
			"%d of %d allowed connections failed", stopFirstLead, (r.ReadyAt - r.KillAt).Milliseconds(), failed, len(r.Good))
		checkUpdate(t, c, r)
	case update:
		t.Logf("queue mode update: the successor listened on the alternate queues %d ms after it started, "+
			"the old agent had exited and the successor was ready after %d ms; %d of %d allowed connections failed",
			(r.BoundAt - r.KillAt).Milliseconds(), (r.ReadyAt - r.KillAt).Milliseconds(), failed, len(r.Good))
		checkUpdate(t, c, r)
	case mode == compile.ModeQueue:
		t.Logf("queue mode restart gap: %d ms (longest run of failed allowed connections: %d, first at %v (%s), next success at %v); "+
			"%d of %d allowed connections failed; the new agent listened on the queue %d ms after SIGKILL, ready (/readyz 200) after %d ms",
			run.Gap().Milliseconds(), run.N, run.First.Round(time.Millisecond), run.Detail, run.Next.Round(time.Millisecond),
			failed, len(r.Good), (r.BoundAt - r.KillAt).Milliseconds(), (r.ReadyAt - r.KillAt).Milliseconds())
		// Before the kill, and from the moment the new agent listens on the
		// queue (before its first sync: it decides from the program
		// snapshot of --state-dir), every allowed connection succeeds. The
		// gap is the process restart, nothing else; connections whose SYN
		// was queued when the old agent died are dropped with its socket.
		for _, a := range r.Good {
			if !a.OK && (a.At+connTimeout < r.KillAt || a.At > r.BoundAt) {
				t.Errorf("queue mode: allowed connection at %v failed (%s) outside [%v, %v], from SIGKILL to the new agent listening",
					a.At.Round(time.Millisecond), a.Detail, r.KillAt.Round(time.Millisecond), r.BoundAt.Round(time.Millisecond))
			}
		}
		if run.N == 0 {
			t.Logf("queue mode: no allowed connection failed at all")
		}
	default:
		if failed > 0 {
			t.Errorf("%s mode: %d allowed connections failed; longest run %d from %v (%s): the table must keep enforcing while the agent is away",
				mode, failed, run.N, run.First.Round(time.Millisecond), run.Detail)
		}
		// The new agent found the table hooked and compared its sets,
		// read while it built its ruleset.
		line := lastLine(c.Agent("node-1").LogTail(400), "First sync committed")
		if m := setsPrefetched.FindStringSubmatch(line); m == nil || m[1] == "0" {
			t.Errorf("%s mode: the restarted agent's first sync compared no set read before its build:\n%s", mode, line)
		}
	}

	// The new agent is fully in charge again.
	m = verify(t, ctx, c, "after the restart")
	expect(t, m, "after the restart", map[[2]string]bool{{"r/good", "r/server"}: true, {"r/bad", "r/server"}: false})
}

// setsPrefetched is the count of sets a first sync compared from the
// kernel read it started before the build (sets.Syncer.Prefetch).
var setsPrefetched = regexp.MustCompile(` setsPrefetched=(\d+)`)

// lastLine is the last line of log that contains s.
func lastLine(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

// checkUpdate: no allowed connection of an update may fail.
func checkUpdate(t *testing.T, c *cluster.Cluster, r *cluster.RestartResult) {
	t.Helper()
	for _, a := range r.Good {
		if !a.OK {
			t.Errorf("queue mode update: allowed connection at %v failed (%s); the update started at %v",
				a.At.Round(time.Millisecond), a.Detail, r.KillAt.Round(time.Millisecond))
		}
	}
	if t.Failed() {
		t.Logf("the agents' log (old and successor):\n%s", c.Agent("node-1").LogTail(60))
	}
}
