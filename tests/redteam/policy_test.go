package redteam

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// policyPromptly is how soon after its write a small policy must be in
// force on the node while a huge one is being handled: a few syncs on a
// loaded 2-core test machine. Before the range arithmetic was fixed, one
// build with the 16,000-exception policy took over three minutes.
const policyPromptly = 20 * time.Second

// TestRedTeamHugeExcept is a namespace user's attack on the compiler: a
// NetworkPolicy whose ipBlock has 16,000 scattered /32 exceptions (about
// 300 KB, one valid object), written through the real API server to the
// real agent. Then:
//
//   - another namespace's policy, written right after it, is in force
//     within policyPromptly, and the agent stays live (/healthz) and
//     running;
//   - the huge policy, within compile.MaxPolicyCost, is enforced as
//     written: its subject admits the client it names and the kernel
//     agrees with the evaluator;
//   - a policy just past MaxPolicyCost is rejected: its subject is
//     isolated and admits nothing (fail closed), the agent reports it (a
//     Warning Event PolicyTooLarge, nftpolicy_rejected_policies and
//     nftpolicy_policies_rejected_total), and a normal policy written with
//     it is enforced.
func TestRedTeamHugeExcept(t *testing.T) {
	testenv.Require(t, "red-team policy tests", testenv.Root("create network namespaces and run an nftpolicy agent in them"))
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	a := c.Agent("node-1")
	for _, ns := range []string{"tenant", "victim"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []cluster.Pod{
		{Namespace: "tenant", Name: "a", Labels: map[string]string{"app": "a"}, Node: "node-1"},
		{Namespace: "tenant", Name: "b", Labels: map[string]string{"app": "b"}, Node: "node-1"},
		{Namespace: "tenant", Name: "c", Labels: map[string]string{"app": "c"}, Node: "node-1"},
		{Namespace: "tenant", Name: "client", Labels: map[string]string{"role": "client"}, Node: "node-1"},
		{Namespace: "victim", Name: "web", Labels: map[string]string{"app": "web"}, Node: "node-1"},
		{Namespace: "victim", Name: "friend", Labels: map[string]string{"app": "friend"}, Node: "node-1"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	policyProbe(t, ctx, c, "before any policy", "tenant/client", "victim/web", true)

	// The attack, then the victim's own policy: victim/web admits only
	// victim/friend.
	huge := compiletest.HugeExceptPolicy("tenant", "huge", "a", 16000, 80)
	t.Logf("huge policy: 16,000 exceptions, cost %d (bound %d)", compile.NetworkPolicyCost(huge), compile.MaxPolicyCost)
	if _, err := c.ApplyPolicy(ctx, huge); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if _, err := c.ApplyPolicy(ctx, compiletest.NetPol("victim", "web", compiletest.Sel("app", "web"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "friend")))))); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "victim/web isolated after the huge policy", "tenant/client", "victim/web", false, written)
	policyProbe(t, ctx, c, "victim/web isolated", "victim/friend", "victim/web", true)
	policyLive(t, ctx, a)

	// Within the bound: the huge policy is enforced as written, the same
	// in the kernel and in the evaluator.
	waitCtx, cancelWait := context.WithTimeout(ctx, 2*time.Minute)
	_, err := c.WaitProgrammed(waitCtx)
	cancelWait()
	if err != nil {
		t.Fatalf("the huge policy is not programmed: %v", err)
	}
	policyProbe(t, ctx, c, "huge policy in force", "tenant/client", "tenant/a", true)
	policyProbe(t, ctx, c, "huge policy in force", "victim/web", "tenant/a", policyAllows(t, ctx, c, "victim/web", "tenant/a"))

	// Just past the bound: the policy on tenant/b admits tenant/client as
	// written; rejected, it admits nothing. tenant/c's policy, written
	// with it, is enforced.
	tooLarge := policyPastBound("tenant", "too-large", "b")
	if _, err := c.ApplyPolicy(ctx, tooLarge); err != nil {
		t.Fatal(err)
	}
	written = time.Now()
	if _, err := c.ApplyPolicy(ctx, compiletest.NetPol("tenant", "c", compiletest.Sel("app", "c"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "a")))))); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "tenant/c isolated next to the rejected policy", "tenant/client", "tenant/c", false, written)
	policyEventually(t, ctx, c, "the rejected policy's subject admits nothing", "tenant/client", "tenant/b", false, written)
	policyProbe(t, ctx, c, "tenant/c's policy in force", "tenant/a", "tenant/c", true)
	policyLive(t, ctx, a)

	m, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := m[`nftpolicy_rejected_policies{kind="NetworkPolicy"}`]; v != 1 {
		t.Errorf("nftpolicy_rejected_policies{kind=NetworkPolicy} = %v, want 1", v)
	}
	if v := m[`nftpolicy_policies_rejected_total{kind="NetworkPolicy",reason="cost"}`]; v < 1 {
		t.Errorf("nftpolicy_policies_rejected_total{kind=NetworkPolicy,reason=cost} = %v, want >= 1", v)
	}
	policyEvent(t, ctx, c, "tenant", "too-large", "PolicyTooLarge")
}

// policyPastBound is a NetworkPolicy selecting app=<app> whose cost is
// compile.MaxPolicyCost+1: HugeExceptPolicy with as many exceptions as
// that takes.
func policyPastBound(ns, name, app string) *networkingv1.NetworkPolicy {
	base := compile.NetworkPolicyCost(compiletest.HugeExceptPolicy(ns, name, app, 0, 80))
	np := compiletest.HugeExceptPolicy(ns, name, app, compile.MaxPolicyCost+1-base, 80)
	if got := compile.NetworkPolicyCost(np); got != compile.MaxPolicyCost+1 {
		panic(fmt.Sprintf("policyPastBound: cost %d, want %d", got, compile.MaxPolicyCost+1))
	}
	return np
}

// policyAllows is the evaluator's verdict on from -> to, 80/TCP, over the
// API's current objects.
func policyAllows(t *testing.T, ctx context.Context, c *cluster.Cluster, from, to string) bool {
	t.Helper()
	prog, err := c.Program(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return evaluate.Evaluate(prog, c.PodIPs(from)[0], c.PodIPs(to)[0], compile.ProtoTCP, 80).Allowed
}

// policyConnect opens one TCP connection from -> to:80 on real packets.
func policyConnect(t *testing.T, ctx context.Context, c *cluster.Cluster, from string, to netip.Addr) bool {
	t.Helper()
	ep, err := c.PodEndpoint(from)
	if err != nil {
		t.Fatal(err)
	}
	res := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: ep, To: to, Port: 80, Proto: netlab.TCP, Timeout: time.Second})
	if res.Err != nil {
		t.Fatalf("probe %s -> %s: %v", from, to, res.Err)
	}
	return res.Connected
}

// policyProbe checks one connection on real packets, and that the
// evaluator agrees.
func policyProbe(t *testing.T, ctx context.Context, c *cluster.Cluster, step, from, to string, want bool) {
	t.Helper()
	got := policyConnect(t, ctx, c, from, c.PodIPs(to)[0])
	if ev := policyAllows(t, ctx, c, from, to); got != want || ev != want {
		t.Errorf("%s: %s -> %s:80: kernel %v, evaluator %v, want %v", step, from, to, got, ev, want)
	}
}

// policyEventually waits until from -> to gets the wanted verdict on real
// packets, at most policyPromptly after written.
func policyEventually(t *testing.T, ctx context.Context, c *cluster.Cluster, step, from, to string, want bool, written time.Time) {
	t.Helper()
	dst := c.PodIPs(to)[0]
	for {
		if policyConnect(t, ctx, c, from, dst) == want {
			t.Logf("%s: %s -> %s in force %v after the write", step, from, to, time.Since(written).Round(time.Millisecond))
			return
		}
		if time.Since(written) > policyPromptly {
			t.Fatalf("%s: %s -> %s still %v %v after the write (want %v within %v); agent log:\n%s",
				step, from, to, !want, time.Since(written).Round(time.Millisecond), want, policyPromptly, c.Agent("node-1").LogTail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// policyLive checks that the agent runs and answers /healthz.
func policyLive(t *testing.T, ctx context.Context, a *cluster.Agent) {
	t.Helper()
	if !a.Running() {
		t.Fatalf("the agent exited; log:\n%s", a.LogTail(30))
	}
	if code, body, err := a.Get(ctx, a.HealthAddr, "/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %q %v", code, strings.TrimSpace(body), err)
	}
}

// policyEvent waits for a Warning Event with reason on the NetworkPolicy.
func policyEvent(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, name, reason string) {
	t.Helper()
	deadline := time.Now().Add(policyPromptly)
	for {
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning {
				t.Logf("event on %s/%s: %s: %.200s", ns, name, e.Reason, e.Message)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Warning Event %s on %s/%s (%d events)", reason, ns, name, len(evs.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// policyBuildDeadline bounds one build and sync of every node in
// TestRedTeamHugeExceptKernel; before the fix the build alone took minutes.
const policyBuildDeadline = 60 * time.Second

// TestRedTeamHugeExceptKernel is TestRedTeamHugeExcept without an API
// server (tests/internal/lab: the agent's compiler, syncer and
// evaluator in process, two nodes on the real kernel), so that it runs
// where the control plane's binaries are missing: the 16,000-exception
// policy, one just past compile.MaxPolicyCost and two ordinary ones are
// built, synced and probed within policyBuildDeadline; the kernel agrees
// with the evaluator on every probe; the huge policy is enforced as
// written, the one past the bound admits nothing, and the ordinary ones
// are in force.
func TestRedTeamHugeExceptKernel(t *testing.T) {
	testenv.Require(t, "red-team policy tests", testenv.Root("create network namespaces and nftables rulesets"), testenv.Binaries("ip", "nft"))
	s := &scenario.Scenario{}
	for i, p := range []struct{ key, label, value, node string }{
		{"tenant/a", "app", "a", "node-1"}, {"tenant/b", "app", "b", "node-1"}, {"tenant/c", "app", "c", "node-2"},
		{"tenant/client", "role", "client", "node-2"}, {"victim/web", "app", "web", "node-1"}, {"victim/friend", "app", "friend", "node-2"},
	} {
		ns, name, _ := strings.Cut(p.key, "/")
		node := strings.TrimPrefix(p.node, "node-")
		s.Pods = append(s.Pods, scenario.Pod{Namespace: ns, Name: name, Labels: map[string]string{p.label: p.value},
			IP: fmt.Sprintf("10.244.%s.%d", node, 11+i), Node: p.node, Ports: []scenario.Port{{Port: 80}}})
	}
	for _, np := range []*networkingv1.NetworkPolicy{
		compiletest.HugeExceptPolicy("tenant", "huge", "a", 16000, 80),
		policyPastBound("tenant", "too-large", "b"),
		compiletest.NetPol("tenant", "c", compiletest.Sel("app", "c"), compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "a"))))),
		compiletest.NetPol("victim", "web", compiletest.Sel("app", "web"), compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "friend"))))),
	} {
		s.Policies = append(s.Policies, *np)
	}
	want := map[[2]string]bool{
		{"tenant/client", "tenant/a"}:   true,  // the huge policy names the client
		{"victim/web", "tenant/a"}:      true,  // 10.244.1.15: odd, never among the exceptions
		{"tenant/client", "tenant/b"}:   false, // past the bound: admits nothing
		{"tenant/a", "tenant/b"}:        false,
		{"tenant/client", "tenant/c"}:   false,
		{"tenant/a", "tenant/c"}:        true,
		{"tenant/client", "victim/web"}: false,
		{"victim/friend", "victim/web"}: true,
	}
	for pair := range want {
		s.Probes = append(s.Probes, scenario.Probe{From: scenario.Endpoint{Pod: pair[0]}, To: scenario.Endpoint{Pod: pair[1]}, Port: 80})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := lab.New(ctx, s, lab.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	type result struct {
		rep *lab.Report
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		rep, err := c.Check(ctx, s, true, nil)
		done <- result{rep, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(policyBuildDeadline):
		t.Fatalf("building, syncing and probing the huge policies took more than %v", policyBuildDeadline)
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Logf("built, synced on both nodes and probed in %v", time.Since(start).Round(time.Millisecond))
	if tab := res.rep.Table(); tab != "" {
		t.Errorf("the kernel and the evaluator disagree:\n%s", tab)
	}
	for _, o := range res.rep.Outcomes {
		pair := [2]string{o.Probe.From.Pod, o.Probe.To.Pod}
		if o.Err != nil || o.Connected != want[pair] {
			t.Errorf("%s -> %s:80: kernel %v (%v), want %v (%s)", pair[0], pair[1], o.Connected, o.Err, want[pair], o.WantReason)
		}
	}
}
