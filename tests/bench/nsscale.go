package bench

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// measureClusterAndNamespaceChanges times, after the policy scale's
// NetworkPolicy and pod changes over n pods, a ClusterNetworkPolicy edit
// with the agent's default deny log (cnp_sync_ms_<n>_denylog) and a
// namespace label change (namespace_sync_ms_<n>), each on the tracker's
// path (a "policies" or "namespaces" sync; a rebuild instead is an error).
func measureClusterAndNamespaceChanges(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, agent *cluster.Agent, n int, prog *compile.Program, cfg ScaleConfig, res *Result) error {
	sz := sizeName(n)
	if cfg.PolicyScale.ClusterPolicies > 0 {
		cnp, err := timeClusterPolicyChanges(ctx, c, agent, cfg.Incremental)
		if err != nil {
			return err
		}
		res.Set("cnp_sync_ms_"+sz+"_denylog", millis(Percentile(cnp, 50)))
		res.Set("cnp_sync_ms_max_"+sz+"_denylog", millis(Percentile(cnp, 100)))
		cfg.Logf("ClusterNetworkPolicy change (deny log on) p50 %v max %v", Percentile(cnp, 50).Round(10*time.Microsecond), Percentile(cnp, 100).Round(10*time.Microsecond))
	}
	ns, err := pickScaleNamespace(prog)
	if err != nil {
		return err
	}
	nsd, err := timeNamespaceChanges(ctx, cs, agent, ns, cfg.Incremental)
	if err != nil {
		return err
	}
	res.Set("namespace_sync_ms_"+sz, millis(Percentile(nsd, 50)))
	res.Set("namespace_sync_ms_max_"+sz, millis(Percentile(nsd, 100)))
	cfg.Logf("namespace %s label change p50 %v max %v", ns, Percentile(nsd, 50).Round(10*time.Microsecond), Percentile(nsd, 100).Round(10*time.Microsecond))
	return nil
}

// timeClusterPolicyChanges times edits of the first scale
// ClusterNetworkPolicy (scaleClusterPolicies: an egress Deny rule, whose
// deny-log chain is rewritten with its rule chain): the Deny rule gains
// a port, then loses it, and so on; it is left as it was. The program
// refresh after each is waited for, as timePolicyChanges does.
func timeClusterPolicyChanges(ctx context.Context, c *cluster.Cluster, agent *cluster.Agent, changes int) ([]time.Duration, error) {
	pc, err := c.PolicyClient()
	if err != nil {
		return nil, err
	}
	api := pc.PolicyV1beta1().ClusterNetworkPolicies()
	name := scaleClusterPolicies(1)[0].Name
	var out []time.Duration
	for k := 0; k < changes || k%2 == 1; k++ {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var protos []npav1beta1.ClusterNetworkPolicyProtocol
		if k%2 == 0 {
			protos = []npav1beta1.ClusterNetworkPolicyProtocol{ct.Proto("TCP", 9999)}
		}
		cur.Spec.Egress[0].Protocols = protos
		before, err := scrape(ctx, agent)
		if err != nil {
			return nil, err
		}
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return nil, err
		}
		d, err := waitSync(ctx, agent, "policies", "incremental", before)
		if err != nil {
			return nil, fmt.Errorf("change %d of ClusterNetworkPolicy %s: %w", k, name, err)
		}
		if _, err := waitSync(ctx, agent, "incremental", "", before); err != nil {
			return nil, fmt.Errorf("the program refresh after change %d: %w", k, err)
		}
		if k < changes {
			out = append(out, d)
		}
	}
	return out, nil
}

// pickScaleNamespace finds a namespace with a pod of node-1.
func pickScaleNamespace(prog *compile.Program) (string, error) {
	for i := range prog.Pods {
		if prog.Pods[i].Local {
			return prog.Pods[i].Namespace, nil
		}
	}
	return "", fmt.Errorf("no pod of node-1")
}

// timeNamespaceChanges times label changes of a namespace on the agent's
// tracker path (kind "namespaces"): its env label flips between dev and
// prod (ClusterNetworkPolicy subjects and peers select env=dev, so its
// pods change policies and peer sets), and is left as it was. The program
// refresh after each is waited for.
func timeNamespaceChanges(ctx context.Context, cs kubernetes.Interface, agent *cluster.Agent, name string, changes int) ([]time.Duration, error) {
	api := cs.CoreV1().Namespaces()
	var out []time.Duration
	for k := 0; k < changes || k%2 == 1; k++ {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		flipEnv(cur)
		before, err := scrape(ctx, agent)
		if err != nil {
			return nil, err
		}
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return nil, err
		}
		d, err := waitSync(ctx, agent, "namespaces", "incremental", before)
		if err != nil {
			return nil, fmt.Errorf("change %d of namespace %s: %w", k, name, err)
		}
		if _, err := waitSync(ctx, agent, "incremental", "", before); err != nil {
			return nil, fmt.Errorf("the program refresh after change %d: %w", k, err)
		}
		if k < changes {
			out = append(out, d)
		}
	}
	return out, nil
}

// flipEnv flips a scale namespace's env label (scaleNSLabels).
func flipEnv(ns *corev1.Namespace) {
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	if ns.Labels["env"] == "dev" {
		ns.Labels["env"] = "prod"
	} else {
		ns.Labels["env"] = "dev"
	}
}
