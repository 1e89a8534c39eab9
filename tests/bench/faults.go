package bench

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// FaultsConfig configures RunFaults.
type FaultsConfig struct {
	// Repeats of each outside change.
	Repeats int
	// Interval between connection attempts of the loop that runs during
	// each repair.
	Interval time.Duration
	// ProbeTimeout: a connection without an answer by then was dropped.
	ProbeTimeout time.Duration
	Logf         func(format string, args ...any)
}

func (c *FaultsConfig) defaults() {
	if c.Repeats <= 0 {
		c.Repeats = 20
	}
	if c.Interval <= 0 {
		c.Interval = 2 * time.Millisecond
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 250 * time.Millisecond
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

const faultsNS = "faults"

// RunFaults measures how long a real agent process (hybrid mode, its
// periodic full sync an hour away) takes to repair outside changes of its
// table while a policy denies client -> server: `nft flush ruleset` in the
// node's namespace (the table deleted), and the verdict map element that
// sends the server's traffic to its policy deleted. Each repair time is
// from the outside change's commit (nft returned) to the SYN of the first
// connection denied again, with a connection opened every Interval; the
// connections of that loop admitted after the change are the denied
// connections admitted during the repair. Then the boot window
// (runBootWindow), on a lab of its own.
func RunFaults(ctx context.Context, cfg FaultsConfig) (*Result, error) {
	cfg.defaults()
	res, err := runInProgramTB("faults", func(tb *cluster.ProgramTB, res *Result) error { return runFaults(ctx, tb, cfg, res) })
	if err != nil {
		return nil, err
	}
	boot, err := runInProgramTB("faults-boot", func(tb *cluster.ProgramTB, res *Result) error { return runBootWindow(ctx, tb, cfg, res) })
	if err != nil {
		return nil, err
	}
	res.Merge(boot)
	return res, nil
}

// runBootWindow is a node after a reboot (cluster.RunBootWindow): pods
// started through the boot plugin and a pair without it send, Repeats
// connections each, before the node's agent starts. boot_window_admitted_denied
// counts the denied connections of the held pods admitted (target 0);
// boot_window_admitted_denied_unheld those of the pair without the plugin
// (the window as a node without it has it).
func runBootWindow(ctx context.Context, tb *cluster.ProgramTB, cfg FaultsConfig, res *Result) error {
	c := cluster.Start(tb, cluster.Config{Nodes: []string{"node-1"}, Mode: compile.ModeHybrid, Logf: cfg.Logf,
		NoAgents: true, Prefix: netlab.RandomPrefix("npbootb")})
	r, err := c.RunBootWindow(ctx, cluster.BootWindow{Node: "node-1", Namespace: "boot", Rounds: cfg.Repeats, Interval: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	if len(r.HeldAfter) > 0 || !r.DeniedAfter || !r.AllowedAfter || !r.LateAllowed {
		return fmt.Errorf("boot window: after the first sync: still held %v, denied connection denied %v, allowed one allowed %v, later pod allowed %v",
			r.HeldAfter, r.DeniedAfter, r.AllowedAfter, r.LateAllowed)
	}
	res.Set("boot_window_admitted_denied", r.HeldAdmittedDenied)
	res.Set("boot_window_admitted_denied_unheld", r.UnheldAdmittedDenied)
	res.Set("boot_window_connections", r.Rounds)
	res.Set("boot_window_first_sync_ms", float64(r.FirstSync.Microseconds())/1000)
	cfg.Logf("faults: boot window: %d connections per pair before the agent: %d denied admitted with the boot plugin, %d without; first sync %v",
		r.Rounds, r.HeldAdmittedDenied, r.UnheldAdmittedDenied, r.FirstSync)
	return nil
}

func runFaults(ctx context.Context, tb *cluster.ProgramTB, cfg FaultsConfig, res *Result) error {
	c := cluster.Start(tb, cluster.Config{Nodes: []string{"node-1"}, Mode: compile.ModeHybrid, Logf: cfg.Logf,
		AgentArgs: []string{"--full-sync-period", "1h"}})
	if err := c.EnsureNamespace(ctx, faultsNS, nil); err != nil {
		return err
	}
	for _, p := range []cluster.Pod{
		{Namespace: faultsNS, Name: "client", Labels: map[string]string{"app": "client"}, Node: "node-1"},
		{Namespace: faultsNS, Name: "server", Labels: map[string]string{"app": "server"}, Node: "node-1"},
	} {
		if _, err := c.CreatePod(ctx, p); err != nil {
			return err
		}
	}
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: faultsNS, Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := c.ApplyPolicy(ctx, deny); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	from, err := c.PodEndpoint(faultsNS + "/client")
	if err != nil {
		return err
	}
	server := c.PodIPs(faultsNS + "/server")[0]
	changes := []struct {
		name string
		argv []string
	}{
		{"flush", []string{"nft", "flush", "ruleset"}},
		{"element", []string{"nft", "delete", "element", "inet", compile.TableName, "ingress-pods-v4", "{", server.String(), "}"}},
	}
	for _, ch := range changes {
		var repairs []time.Duration
		admitted, after := 0, 0
		for i := 0; i < cfg.Repeats; i++ {
			d, n, na, err := measureRepair(ctx, c, cfg, from, server, ch.argv)
			if err != nil {
				return fmt.Errorf("%s %d: %w", ch.name, i, err)
			}
			repairs = append(repairs, d)
			admitted += n
			after += na
			if _, err := c.WaitProgrammed(ctx); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		res.Set(fmt.Sprintf("outside_%s_repair_ms_p50", ch.name), float64(Percentile(repairs, 50).Microseconds())/1000)
		res.Set(fmt.Sprintf("outside_%s_repair_ms_p99", ch.name), float64(Percentile(repairs, 99).Microseconds())/1000)
		res.Set(fmt.Sprintf("outside_%s_admitted_denied", ch.name), admitted)
		res.Set(fmt.Sprintf("outside_%s_admitted_after_repair", ch.name), after)
		cfg.Logf("faults: %s: %d repairs, p50 %v, p99 %v; %d denied connections admitted during them", ch.name, len(repairs),
			Percentile(repairs, 50), Percentile(repairs, 99), admitted)
	}
	m, err := c.Agent("node-1").Metrics(ctx)
	if err != nil {
		return err
	}
	res.Set("outside_changes_counted_table", m[`nftpolicy_outside_changes_total{kind="table"}`])
	res.Set("outside_changes_counted_element", m[`nftpolicy_outside_changes_total{kind="element"}`])
	return nil
}

// measureRepair opens a connection from -> to:80 every Interval while argv
// changes the node's table, and returns the time from argv's return to the
// SYN of the first connection dropped after it, how many connections whose
// SYN left after argv started were admitted, and how many of those left
// after that first dropped one (none if the repair holds).
func measureRepair(ctx context.Context, c *cluster.Cluster, cfg FaultsConfig, from netlab.Endpoint, to netip.Addr, argv []string) (time.Duration, int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	type obs struct {
		sent time.Time
		ok   bool
		err  error
	}
	var mu sync.Mutex
	var seen []obs
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var launcher sync.WaitGroup
	launcher.Add(1)
	go func() {
		defer launcher.Done()
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		for {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: from, To: to, Port: 80, Proto: netlab.TCP, Timeout: cfg.ProbeTimeout})
				o := obs{sent: r.Sent, ok: r.Connected, err: r.Err}
				if !r.Connected && r.Err == nil && r.Reason != "timeout" {
					o.err = fmt.Errorf("probe failed: %s", r.Reason)
				}
				mu.Lock()
				seen = append(seen, o)
				mu.Unlock()
			}()
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	time.Sleep(5 * cfg.Interval)
	t0 := time.Now()
	out, err := c.Lab.NodeExec("node-1", argv...)
	t1 := time.Now()
	if err != nil {
		close(stop)
		launcher.Wait()
		wg.Wait()
		return 0, 0, 0, fmt.Errorf("%v: %w: %s", argv, err, out)
	}
	// Probes go on until one whose SYN left after t1 was dropped.
	deadline := time.Now().Add(10 * time.Second)
	var repaired time.Time
	for repaired.IsZero() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		for _, o := range seen {
			if o.err == nil && !o.ok && !o.sent.Before(t1) && (repaired.IsZero() || o.sent.Before(repaired)) {
				repaired = o.sent
			}
		}
		mu.Unlock()
	}
	close(stop)
	launcher.Wait()
	wg.Wait()
	if repaired.IsZero() {
		return 0, 0, 0, fmt.Errorf("%v: no connection denied again within 10s", argv)
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i].sent.Before(seen[j].sent) })
	admitted, after := 0, 0
	for _, o := range seen {
		if o.err == nil && o.ok && !o.sent.Before(t0) {
			admitted++
			if o.sent.After(repaired) {
				after++
			}
		}
	}
	return repaired.Sub(t1), admitted, after, nil
}
