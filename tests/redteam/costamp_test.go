package redteam

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// costAmpPods is how many pods the cluster of TestRedTeamCostAmplification
// holds besides the lab's real ones: issue 43's 5,000, at which the attack
// made 11.5 million elements and added 5 s and 800 MiB to every build.
const costAmpPods = 5000

// TestRedTeamCostAmplification is issue 43's attack on what a policy
// makes: tenant/amplify, a NetworkPolicy of 2,300 peers under
// compile.MaxPolicyCost for what it says, each peer
// `namespaceSelector: {}` and `podSelector` "label nope-<i> does not
// exist", so that each selects every pod. With 5,000 pods in the cluster
// (known to the agents, not started) every node would build 2,300 x 5,000
// peer set elements. Then, with the agents' compiler and default budgets:
//
//   - the build rejects the policy for what it makes, having made nothing
//     of it: the program's peer sets hold what the other policies make
//     (counted, not timed), and it was charged at most its budget;
//   - synced on both nodes of the real kernel, the rejected policy is
//     enforced fail-closed on its own (tenant/a, which every pod could
//     reach as written, admits nothing), the victim namespace's policy is
//     in force, unselected pods are untouched, and the kernel agrees with
//     the evaluator on every probe.
func TestRedTeamCostAmplification(t *testing.T) {
	ctx := requireLab(t)
	l, pods := costAmpLab(t, ctx)
	attack := compiletest.CostAmplificationPolicy("tenant", "amplify", "a", 2300)
	said := compile.NetworkPolicyCost(attack)
	if said > compile.MaxPolicyCost {
		t.Fatalf("the attack says %d, over MaxPolicyCost %d: not issue 43's", said, compile.MaxPolicyCost)
	}
	l.SetPolicy(attack)
	l.SetPolicy(compiletest.NetPol("victim", "web", compiletest.Sel("app", "web"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "friend"))))))

	// The agents' compiler, before anything reaches the kernel: a build
	// that made what the policy says would hold 11.5 million elements.
	start := time.Now()
	prog := compile.Build(l.Input(lab.DefaultNodes[0]))
	t.Logf("built %d pods in %v; the attack says %d", len(prog.Pods), time.Since(start).Round(time.Millisecond), said)
	var pol *compile.Policy
	for i := range prog.Policies {
		if prog.Policies[i].Key == "tenant/amplify" {
			pol = &prog.Policies[i]
		}
	}
	elements := 0
	for i := range prog.Selectors {
		elements += len(prog.Selectors[i].Members)
	}
	if pol == nil || !pol.Rejected || elements > 10 {
		t.Fatalf("the attack is not refused before it is built: rejected %v, %d peer set elements in the program (%d sets)",
			pol != nil && pol.Rejected, elements, len(prog.Selectors))
	}
	if pol.Cost > compile.DefaultPolicyBudget || len(pol.Problems) != 1 {
		t.Errorf("charged %d (budget %d), problems %v", pol.Cost, compile.DefaultPolicyBudget, pol.Problems)
	}
	t.Logf("rejected: %s", pol.Problems[0].Message)

	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	costAmpProbes(t, ctx, l, pods, false)
}

// costAmpLab starts the lab of the cost amplification tests: pods
// tenant/a, tenant/b, tenant/client, victim/web and victim/friend on the
// lab's two nodes, and costAmpPods more known to the agents in 20
// namespaces filler-NN (app=filler), not started.
func costAmpLab(t *testing.T, ctx context.Context) (*lab.Lab, map[string]lab.PodSpec) {
	t.Helper()
	l, err := lab.New(ctx, nil, lab.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	pods := map[string]lab.PodSpec{}
	for i, p := range []struct{ ns, name, app string }{
		{"tenant", "a", "a"}, {"tenant", "b", "b"}, {"tenant", "client", "client"}, {"victim", "web", "web"}, {"victim", "friend", "friend"},
	} {
		spec := lab.PodSpec{Namespace: p.ns, Name: p.name, Node: i % 2, IP: lab.PodIP(i%2, i), Labels: map[string]string{"app": p.app}, TCPPorts: []uint16{80}}
		if err := l.StartPod(spec); err != nil {
			t.Fatal(err)
		}
		l.Know(spec)
		pods[spec.Key()] = spec
	}
	l.Namespace("tenant", nil)
	l.Namespace("victim", nil)
	for i := range costAmpPods {
		ns := fmt.Sprintf("filler-%02d", i/250)
		if i%250 == 0 {
			l.Namespace(ns, nil)
		}
		l.Know(lab.PodSpec{Namespace: ns, Name: fmt.Sprintf("p-%d", i), Node: i % 2,
			IP: netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), Labels: map[string]string{"app": "filler"}})
	}
	return l, pods
}

// costAmpProbes probes the cost amplification lab: tenant/amplify's
// subject tenant/a admits every pod (amplify built as written) or none
// (rejected, fail-closed); victim/web admits victim/friend only; pods no
// policy selects are reached. The kernel and the evaluator must agree.
func costAmpProbes(t *testing.T, ctx context.Context, l *lab.Lab, pods map[string]lab.PodSpec, amplifyBuilt bool) {
	t.Helper()
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"tenant/client", "tenant/a", amplifyBuilt}, // as written, every pod may connect
		{"tenant/b", "tenant/a", amplifyBuilt},
		{"victim/friend", "victim/web", true},
		{"tenant/client", "victim/web", false},
		{"tenant/client", "tenant/b", true},
		{"victim/web", "tenant/client", true},
	} {
		from, to := pods[c.from], pods[c.to]
		got, err := l.Net().Probe(ctx, from.Endpoint(), to.IP, 80, netlab.TCP, l.ProbeTimeout())
		if err != nil {
			t.Fatal(err)
		}
		v := l.Agent(lab.DefaultNodes[to.Node]).Evaluator().Evaluate(from.IP, to.IP, compile.ProtoTCP, 80)
		if got != c.want || v.Allowed != c.want {
			t.Errorf("%s -> %s:80: kernel %v, evaluator %v (%s); want %v", c.from, c.to, got, v.Allowed, v.Reason(), c.want)
		}
	}
}

// costAmpSharedPeers is how many distinct peers each selecting every pod
// TestRedTeamCostAmplificationSharedPeers writes: what matching them
// costs (peers x pods) fits the default policy budget at costAmpPods
// pods, and so does one set of every pod; one set per peer (as many
// again) does not.
const costAmpSharedPeers = 150

// TestRedTeamCostAmplificationSharedPeers is issue 43's attack scaled to
// what the budget admits: tenant/amplify's costAmpSharedPeers peers, each
// `namespaceSelector: {}` and "label nope-<i> does not exist", select the
// same pods however differently they say it, and so does tenant/plain's
// peer `namespaceSelector: {}`. With costAmpPods pods in the cluster,
// every node makes one set of every pod for all of them, not one per
// peer: the program holds one such selector (the others its aliases), the
// policy is charged for one set and built as written (tenant/a admits
// every pod), and each node's kernel table holds one peer set per family
// of every pod. The kernel and the evaluator agree on every probe.
func TestRedTeamCostAmplificationSharedPeers(t *testing.T) {
	ctx := requireLab(t)
	l, pods := costAmpLab(t, ctx)
	l.SetPolicy(compiletest.CostAmplificationPolicy("tenant", "amplify", "a", costAmpSharedPeers))
	l.SetPolicy(compiletest.NetPol("tenant", "plain", compiletest.Sel("app", "b"),
		compiletest.Ingress(compiletest.Peers(compiletest.NSPeer(compiletest.Sel())))))
	l.SetPolicy(compiletest.NetPol("victim", "web", compiletest.Sel("app", "web"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "friend"))))))

	start := time.Now()
	prog := compile.Build(l.Input(lab.DefaultNodes[0]))
	t.Logf("built %d pods in %v", len(prog.Pods), time.Since(start).Round(time.Millisecond))
	every := 0
	for i := range prog.Policies {
		if p := &prog.Policies[i]; p.Key == "tenant/amplify" && p.Rejected {
			t.Fatalf("tenant/amplify rejected, charged %d: %v", p.Cost, p.Problems)
		}
	}
	for i := range prog.Selectors {
		if s := &prog.Selectors[i]; len(s.Members) == len(prog.Pods) {
			every++
			if len(s.Aliases) != costAmpSharedPeers {
				t.Errorf("the set of every pod has %d aliases, want %d", len(s.Aliases), costAmpSharedPeers)
			}
		}
	}
	if every != 1 {
		t.Fatalf("%d peer sets of every pod in the program, want 1 for %d peers", every, costAmpSharedPeers+1)
	}

	if err := l.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, node := range lab.DefaultNodes {
		table := l.ListTable(node)
		sets, big := 0, 0
		for _, block := range strings.Split(table, "\tset ")[1:] {
			if !strings.HasPrefix(block, "peers-") {
				continue
			}
			sets++
			if strings.Count(block, ",") >= costAmpPods {
				big++
			}
		}
		if big != 1 || sets > 4 {
			t.Errorf("node %s: %d peer sets in the kernel, %d of them of every pod; want one of every pod (IPv4) and the victim's", node, sets, big)
		}
	}
	costAmpProbes(t, ctx, l, pods, true)
}

// costAmpAgentBudget is the policy budget TestRedTeamCostAmplificationAgent
// gives the agent: above what the attack says (48,313), so that its build
// starts and is stopped while its selectors are matched, with the few
// pods of the test's cluster.
const costAmpAgentBudget = 60000

// TestRedTeamCostAmplificationAgent is TestRedTeamCostAmplification as a
// namespace user does it: the 2,300-peer policy written through the real
// API server to the real agent, which runs with --policy-cost-budget
// (costAmpAgentBudget, for a cluster of a few pods what the default is
// for thousands). The policy is rejected and enforced fail-closed
// (tenant/a, which every pod may reach as written, admits nothing), the
// victim namespace's policy written after it is in force promptly, the
// agent stays live, and it reports the rejection (Warning Event
// PolicyTooLarge, nftpolicy_policies_rejected_total with reason budget).
func TestRedTeamCostAmplificationAgent(t *testing.T) {
	testenv.Require(t, "red-team policy tests", testenv.Root("create network namespaces and run an nftpolicy agent in them"))
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1"}, AgentArgs: []string{fmt.Sprintf("--policy-cost-budget=%d", costAmpAgentBudget)}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := c.Agent("node-1")
	for _, ns := range []string{"tenant", "victim"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []cluster.Pod{
		{Namespace: "tenant", Name: "a", Labels: map[string]string{"app": "a"}, Node: "node-1"},
		{Namespace: "tenant", Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-1"},
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
	policyProbe(t, ctx, c, "before any policy", "tenant/client", "tenant/a", true)

	if _, err := c.ApplyPolicy(ctx, compiletest.CostAmplificationPolicy("tenant", "amplify", "a", 2300)); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if _, err := c.ApplyPolicy(ctx, compiletest.NetPol("victim", "web", compiletest.Sel("app", "web"),
		compiletest.Ingress(compiletest.Peers(compiletest.PodPeer(compiletest.Sel("app", "friend")))))); err != nil {
		t.Fatal(err)
	}
	policyEventually(t, ctx, c, "victim/web isolated after the attack", "tenant/client", "victim/web", false, written)
	policyEventually(t, ctx, c, "the rejected policy's subject admits nothing", "tenant/client", "tenant/a", false, written)
	// The kernel and the evaluator, over the API's objects with the
	// agent's budgets, agree.
	in, err := c.ListInputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in.Budgets = compile.Budgets{Policy: costAmpAgentBudget}
	prog := compile.Build(in)
	for _, p := range []struct {
		from, to string
		want     bool
	}{
		{"victim/friend", "victim/web", true}, {"victim/friend", "tenant/a", false}, {"tenant/client", "tenant/a", false},
	} {
		got := policyConnect(t, ctx, c, p.from, c.PodIPs(p.to)[0])
		v := evaluate.Evaluate(prog, c.PodIPs(p.from)[0], c.PodIPs(p.to)[0], compile.ProtoTCP, 80)
		if got != p.want || v.Allowed != p.want {
			t.Errorf("%s -> %s:80: kernel %v, evaluator %v (%s); want %v", p.from, p.to, got, v.Allowed, v.Reason(), p.want)
		}
	}
	policyLive(t, ctx, a)

	m, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := m[`nftpolicy_policies_rejected_total{kind="NetworkPolicy",reason="budget"}`]; v < 1 {
		t.Errorf("nftpolicy_policies_rejected_total{kind=NetworkPolicy,reason=budget} = %v, want >= 1", v)
	}
	policyEvent(t, ctx, c, "tenant", "amplify", "PolicyTooLarge")
}
