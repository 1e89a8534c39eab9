package bench

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// ChurnConfig configures RunChurn.
type ChurnConfig struct {
	// Pods in the API (on fake nodes) and Policies over their namespaces,
	// as the scale section has them.
	Pods, Policies int
	// Peers of the churning policy, each selecting every pod.
	Peers int
	// Interval between two edits of the churning policy.
	Interval time.Duration
	// Changes: new policies of another namespace timed without the churn,
	// then as many with it.
	Changes int
	// ProbeInterval between probe launches.
	ProbeInterval time.Duration
	Logf          func(format string, args ...any)
}

func (c *ChurnConfig) defaults() {
	if c.Pods <= 0 {
		c.Pods = 5000
	}
	if c.Policies <= 0 {
		c.Policies = 1000
	}
	if c.Peers <= 0 {
		c.Peers = 200
	}
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.Changes <= 0 {
		c.Changes = 20
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = 2 * time.Millisecond
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

const churnNS = "churn"

// ChurnPolicy is the policy of issue 43, item 6: it isolates every pod of
// its namespace and lets in, on port, the pods of every namespace through
// peers peers, each selecting every pod (a label nobody has, absent), so
// that on a node where one of its pods runs it names peers sets of every
// pod.
func ChurnPolicy(ns string, peers int, port int32) *networkingv1.NetworkPolicy {
	from := make([]networkingv1.NetworkPolicyPeer, peers)
	for i := range from {
		from[i] = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{},
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: fmt.Sprintf("nope-%d", i), Operator: metav1.LabelSelectorOpDoesNotExist}}}}
	}
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "churn"},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: from, Ports: []networkingv1.NetworkPolicyPort{{Port: &p}}}},
		}}
}

// RunChurn measures how long another namespace's new policy takes to be
// enforced while one namespace's user edits ChurnPolicy every Interval,
// with a real API server holding Pods pods and Policies policies and one
// real agent process: the programming delay of delay's "create" (API write
// -> the first connection observing the new verdict), Changes times
// without the churn (churn_idle_*), then Changes times with it.
func RunChurn(ctx context.Context, cfg ChurnConfig) (*Result, error) {
	cfg.defaults()
	return runInProgramTB("churn", func(tb *cluster.ProgramTB, res *Result) error { return runChurn(ctx, tb, cfg, res) })
}

func runChurn(ctx context.Context, tb *cluster.ProgramTB, cfg ChurnConfig, res *Result) error {
	sc := ScaleConfig{Pods: []int{cfg.Pods}, Policies: cfg.Policies, Logf: cfg.Logf}
	sc.defaults()
	c, cs, _, err := startScaleCluster(ctx, tb, sc, cluster.EnforcerNftpolicy, compile.ModeHybrid)
	if err != nil {
		return err
	}
	if err := growScalePods(ctx, cs, 0, cfg.Pods, sc); err != nil {
		return err
	}
	for _, ns := range []string{delayNS, churnNS} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			return err
		}
	}
	for _, p := range []cluster.Pod{
		{Namespace: delayNS, Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		{Namespace: delayNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
		{Namespace: churnNS, Name: "victim", Labels: map[string]string{"app": "victim"}, Node: "node-1"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return err
		}
	}
	churnPols := cs.NetworkingV1().NetworkPolicies(churnNS)
	if _, err := churnPols.Create(ctx, ChurnPolicy(churnNS, cfg.Peers, 80), metav1.CreateOptions{}); err != nil {
		return err
	}
	agent := c.Agent("node-1")
	if err := agent.Start(); err != nil {
		return err
	}
	if err := agent.WaitReady(ctx); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	from, err := c.PodEndpoint(delayNS + "/client")
	if err != nil {
		return err
	}
	pr := &prober{lab: c.Lab, from: from, interval: cfg.ProbeInterval, timeout: 250 * time.Millisecond}
	server := c.PodIPs(delayNS + "/server")[0]
	idle, err := timeNewPolicies(ctx, cs, pr, server, cfg.Changes)
	if err != nil {
		return fmt.Errorf("without the churn: %w", err)
	}
	cfg.Logf("churn: without the churn, new policy p50 %v p99 %v", Percentile(idle, 50), Percentile(idle, 99))
	m0, err := agent.Metrics(ctx)
	if err != nil {
		return err
	}
	stop, edits := churnEdits(ctx, churnPols, cfg)
	busy, err := timeNewPolicies(ctx, cs, pr, server, cfg.Changes)
	n := stop()
	if err != nil {
		return fmt.Errorf("with the churn: %w", err)
	}
	cfg.Logf("churn: with the churn (%d edits), new policy p50 %v p99 %v", n, Percentile(busy, 50), Percentile(busy, 99))
	res.Set("churn_pods", cfg.Pods)
	res.Set("churn_policies", cfg.Policies)
	res.Set("churn_peers", cfg.Peers)
	res.Set("churn_edit_interval_ms", millis(cfg.Interval))
	res.Set("churn_idle_delay_ms_p50", millis(Percentile(idle, 50)))
	res.Set("churn_idle_delay_ms_p99", millis(Percentile(idle, 99)))
	res.Set("churn_other_policy_delay_ms_p50", millis(Percentile(busy, 50)))
	res.Set("churn_other_policy_delay_ms_p99", millis(Percentile(busy, 99)))
	res.Set("churn_other_policy_delay_ms_max", millis(Percentile(busy, 100)))
	res.Set("churn_edits", n)
	res.Set("churn_edit_errors", edits.errors.Load())
	if m1, err := agent.Metrics(ctx); err == nil {
		churnAgentFigures(res, m0, m1)
	}
	return nil
}

// churnEdits edits the churning policy every cfg.Interval (its port, 80
// and 81 in turn) until the returned stop, which returns how many edits
// were written.
func churnEdits(ctx context.Context, pols interface {
	Get(context.Context, string, metav1.GetOptions) (*networkingv1.NetworkPolicy, error)
	Update(context.Context, *networkingv1.NetworkPolicy, metav1.UpdateOptions) (*networkingv1.NetworkPolicy, error)
}, cfg ChurnConfig) (stop func() int, st *churnStats) {
	st = &churnStats{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		cur, err := pols.Get(ctx, "churn", metav1.GetOptions{})
		if err != nil {
			st.errors.Add(1)
			return
		}
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			next := ChurnPolicy(churnNS, cfg.Peers, int32(80+i%2))
			next.ResourceVersion = cur.ResourceVersion
			if cur, err = pols.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
				st.errors.Add(1)
				if cur, err = pols.Get(ctx, "churn", metav1.GetOptions{}); err != nil {
					return
				}
				continue
			}
			st.edits.Add(1)
		}
	}()
	return func() int { close(done); wg.Wait(); return int(st.edits.Load()) }, st
}

type churnStats struct{ edits, errors atomic.Int64 }

// timeNewPolicies times n creations of a policy of namespace delay that
// isolates its server (the probes from its client flip from connected to
// dropped), deleting it after each (its enforcement awaited, not timed).
func timeNewPolicies(ctx context.Context, cs kubernetes.Interface, pr *prober, server netip.Addr, n int) ([]time.Duration, error) {
	pols := cs.NetworkingV1().NetworkPolicies(delayNS)
	var out []time.Duration
	for range n {
		d, err := pr.measure(ctx, server, false, func() error {
			_, err := pols.Create(ctx, policy("deny", "server", false), metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return out, fmt.Errorf("create: %w", err)
		}
		out = append(out, d)
		if _, err := pr.measure(ctx, server, true, func() error { return pols.Delete(ctx, "deny", metav1.DeleteOptions{}) }); err != nil {
			return out, fmt.Errorf("delete: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out, nil
}

// churnAgentFigures reports what the agent did during the churn, from its
// metrics before (m0) and after (m1): the policy syncs, their mean
// duration, the program refreshes made as full builds on the loop, and
// the off-loop refresh builds discarded.
func churnAgentFigures(res *Result, m0, m1 map[string]float64) {
	d := func(k string) float64 { return m1[k] - m0[k] }
	const pcnt, psum = `nftpolicy_sync_duration_seconds_count{kind="policies"}`, `nftpolicy_sync_duration_seconds_sum{kind="policies"}`
	res.Set("churn_agent_policy_syncs", d(pcnt))
	if n := d(pcnt); n > 0 {
		res.Set("churn_agent_policy_sync_mean_ms", round(d(psum)/n*1000, 2))
	}
	const icnt, isum = `nftpolicy_sync_duration_seconds_count{kind="incremental"}`, `nftpolicy_sync_duration_seconds_sum{kind="incremental"}`
	// Changes the tracker left to a full build, by reason: the churning
	// policy's edits are applied alone (none with reason cost or
	// shared-set).
	var fallbacks float64
	for _, f := range compile.Fallbacks() {
		n := d(`nftpolicy_incremental_fallbacks_total{reason="` + string(f) + `"}`)
		fallbacks += n
		if n > 0 {
			res.Set("churn_agent_fallbacks_"+strings.ReplaceAll(string(f), "-", "_"), n)
		}
	}
	res.Set("churn_agent_fallbacks", fallbacks)
	// Refreshes built off the sync loop and discarded because changes
	// overtook them (the adopted ones are not syncs).
	res.Set("churn_agent_refresh_discards", d("nftpolicy_program_refresh_discarded_total"))
	res.Set("churn_agent_refreshes", d(icnt))
	if n := d(icnt); n > 0 {
		res.Set("churn_agent_refresh_mean_ms", round(d(isum)/n*1000, 2))
	}
}
