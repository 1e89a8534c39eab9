package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// PolicyScale is the policies-at-scale measurement of issue 31, made after
// the scale run's last size over its pods (creating them again would take
// most of the run): the run's NetworkPolicies are replaced by Policies
// NetworkPolicies spread over all namespaces (pkg/sets' benchmark mix),
// ClusterPolicies ClusterNetworkPolicies are added, and the agent's first
// sync on a node without the table, one NetworkPolicy change and one pod
// change are timed. The zero value is off.
type PolicyScale struct {
	Policies, ClusterPolicies int
}

// ParsePolicyScale reads "NETWORKPOLICIES:CLUSTERNETWORKPOLICIES"
// ("10000:100"); "" is off.
func ParsePolicyScale(s string) (PolicyScale, error) {
	if s == "" {
		return PolicyScale{}, nil
	}
	a, b, ok := strings.Cut(s, ":")
	np, err1 := strconv.Atoi(a)
	cnp, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || np < 1 || cnp < 0 {
		return PolicyScale{}, fmt.Errorf("policy scale %q: want NETWORKPOLICIES:CLUSTERNETWORKPOLICIES, at least one NetworkPolicy (10000:100)", s)
	}
	return PolicyScale{Policies: np, ClusterPolicies: cnp}, nil
}

// name is the suffix of the measurement's figures at n pods:
// "150k_10k_policies".
func (p PolicyScale) name(n int) string {
	return sizeName(n) + "_" + sizeName(p.Policies) + "_policies"
}

// measurePolicyScale makes the PolicyScale measurement over the n pods in
// the API; old are the scale run's NetworkPolicies, deleted first.
func measurePolicyScale(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, agent *cluster.Agent, n int, old []*networkingv1.NetworkPolicy, cfg ScaleConfig, res *Result) error {
	ps, logf := cfg.PolicyScale, cfg.Logf
	sfx := ps.name(n)
	if err := agent.Stop(10 * time.Second); err != nil {
		return err
	}
	t0 := time.Now()
	if err := parallel(ctx, len(old), 16, func(i int) error {
		return cs.NetworkingV1().NetworkPolicies(old[i].Namespace).Delete(ctx, old[i].Name, metav1.DeleteOptions{})
	}); err != nil {
		return fmt.Errorf("deleting the scale run's policies: %w", err)
	}
	pols := scalePolicies((n+podsPerNS-1)/podsPerNS, ps.Policies)
	if err := parallel(ctx, len(pols), cfg.Parallel, func(i int) error {
		_, err := cs.NetworkingV1().NetworkPolicies(pols[i].Namespace).Create(ctx, pols[i], metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("creating policies: %w", err)
	}
	if ps.ClusterPolicies > 0 {
		if err := c.InstallClusterPolicyCRD(ctx, "experimental"); err != nil {
			return err
		}
		cnps := scaleClusterPolicies(ps.ClusterPolicies)
		if err := parallel(ctx, len(cnps), 16, func(i int) error {
			_, err := c.ApplyClusterPolicy(ctx, cnps[i])
			return err
		}); err != nil {
			return err
		}
	}
	logf("policy scale: %d NetworkPolicies and %d ClusterNetworkPolicies over %d pods in %v",
		len(pols), ps.ClusterPolicies, n, time.Since(t0).Round(time.Millisecond))
	res.Set("policy_scale_policies", len(pols))
	res.Set("policy_scale_cluster_policies", ps.ClusterPolicies)

	if err := bootNode(c); err != nil {
		return err
	}
	startup, cpuStartup, err := startAgentTimed(ctx, c, agent, sfx, "first sync", "full_sync", cfg, res)
	if err != nil {
		return err
	}
	res.Set("startup_s_"+sfx, round(startup.Seconds(), 2))
	res.Set("startup_agent_cpu_s_"+sfx, round(cpuStartup, 2))
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	in, prog, rs, err := scaleProgram(ctx, c)
	if err != nil {
		return err
	}
	np, err := pickScalePolicy(in, prog)
	if err != nil {
		return err
	}
	lag0, err := scrape(ctx, agent)
	if err != nil {
		return err
	}
	pol, refresh, err := timePolicyChanges(ctx, cs, agent, np, cfg.Incremental)
	if err != nil {
		return err
	}
	res.Set("policy_sync_ms_"+sfx, millis(Percentile(pol, 50)))
	res.Set("policy_sync_ms_max_"+sfx, millis(Percentile(pol, 100)))
	res.Set("policy_refresh_ms_"+sfx, millis(Percentile(refresh, 50)))
	ns, name, err := pickScalePod(prog, rs)
	if err != nil {
		return err
	}
	incr, err := timePodChanges(ctx, cs, agent, ns, name, cfg.Incremental)
	if err != nil {
		return err
	}
	res.Set("incr_sync_ms_"+sfx, millis(Percentile(incr, 50)))
	res.Set("incr_sync_ms_max_"+sfx, millis(Percentile(incr, 100)))
	if err := measureClusterAndNamespaceChanges(ctx, c, cs, agent, n, prog, cfg, res); err != nil {
		return err
	}
	// RSS as at the sizes, after --settle: right after the changes a
	// program refresh runs (a full build, at the build's GOGC) and the
	// pages it freed are not yet returned; the peak keeps that.
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	time.Sleep(cfg.Settle)
	// The policy changes' programs follow with the refresh, the pod
	// changes' when the pace allows: both are in by now.
	if lag1, err := scrape(ctx, agent); err == nil {
		setLag(res, "evaluator_lag_ms_p99_"+sfx, lag0, lag1)
	}
	st, err := procStatus(agent.Pid())
	if err != nil {
		return err
	}
	res.Set("rss_mb_"+sfx, round(st["VmRSS"]/1024, 1))
	res.Set("rss_peak_mb_"+sfx, round(st["VmHWM"]/1024, 1))
	logf("policy scale: NetworkPolicy change p50 %v max %v (program refresh after it p50 %v); one-pod change p50 %v; RSS %.0f MiB (peak %.0f MiB)",
		Percentile(pol, 50).Round(10*time.Microsecond), Percentile(pol, 100).Round(10*time.Microsecond), Percentile(refresh, 50).Round(time.Millisecond),
		Percentile(incr, 50).Round(10*time.Microsecond), st["VmRSS"]/1024, st["VmHWM"]/1024)
	return nil
}

// pickScalePolicy finds a NetworkPolicy with ingress rules that isolates a
// pod of node-1: its change is in node-1's ruleset.
func pickScalePolicy(in compile.Input, prog *compile.Program) (*networkingv1.NetworkPolicy, error) {
	for pi := range prog.Policies {
		p := &prog.Policies[pi]
		if len(p.Ingress) == 0 || !p.IsolatesIngress {
			continue
		}
		local := false
		for _, id := range p.Selected {
			local = local || prog.Pods[id].Local
		}
		if !local {
			continue
		}
		for _, np := range in.Policies {
			if np.Namespace+"/"+np.Name == p.Key {
				return np, nil
			}
		}
	}
	return nil, errors.New("no NetworkPolicy with ingress rules isolates a pod of node-1")
}

// timePolicyChanges times NetworkPolicy changes on the agent's incremental
// path (kind "policies"): np's first ingress rule gains port 9999, then
// loses it again, and so on; np is left as it was. After each change the
// tracker's program is stale and the agent rebuilds it (kind
// "incremental"); that rebuild is waited for, so that the next change is
// not folded into it, and its duration returned as refresh.
func timePolicyChanges(ctx context.Context, cs kubernetes.Interface, agent *cluster.Agent, np *networkingv1.NetworkPolicy, changes int) (pol, refresh []time.Duration, err error) {
	api := cs.NetworkingV1().NetworkPolicies(np.Namespace)
	orig := np.Spec.Ingress[0].Ports
	for k := 0; k < changes || k%2 == 1; k++ {
		cur, err := api.Get(ctx, np.Name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		cur.Spec.Ingress[0].Ports = orig
		if k%2 == 0 {
			port := intstr.FromInt32(9999)
			cur.Spec.Ingress[0].Ports = append(append([]networkingv1.NetworkPolicyPort(nil), orig...), networkingv1.NetworkPolicyPort{Port: &port})
		}
		before, err := scrape(ctx, agent)
		if err != nil {
			return nil, nil, err
		}
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return nil, nil, err
		}
		d, err := waitSync(ctx, agent, "policies", "incremental", before)
		if err != nil {
			return nil, nil, fmt.Errorf("change %d of NetworkPolicy %s/%s: %w", k, np.Namespace, np.Name, err)
		}
		r, err := waitSync(ctx, agent, "incremental", "", before)
		if err != nil {
			return nil, nil, fmt.Errorf("the program refresh after change %d: %w", k, err)
		}
		if k < changes {
			pol, refresh = append(pol, d), append(refresh, r)
		}
	}
	return pol, refresh, nil
}
