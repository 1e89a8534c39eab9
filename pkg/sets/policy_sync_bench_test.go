package sets_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// BenchmarkPolicySync times one NetworkPolicy edit on the agent's path, in
// BenchmarkSync's cluster (-sync-bench-pods): a policy that isolates pods of
// the synced node gets, then loses again, a port in its first ingress rule
// and a second ingress rule with a peer of its own. "rebuild" is the path
// before the tracker applied policies (a full Build and Render, then the
// Syncer's diff); "tracker" is Tracker.ApplyPolicy, then the Syncer's diff
// of the new ruleset; "tracker-refreshed" the same after a Rebuild and
// its sync (the agent's program refresh, not timed), as every edit is in
// the agent unless edits come faster than refreshes. build-ms is the compile step, tx-ms the Sync;
// "fake" stops at the transaction's text, "kernel" applies it in a private
// network namespace (root only). "cluster-rebuild" and "cluster-tracker"
// time the same edit of a ClusterNetworkPolicy (of policyBenchCNPs, added
// to the cluster) whose subjects include pods of the synced node, the
// tracker's path being Tracker.ApplyClusterPolicy.
func BenchmarkPolicySync(b *testing.B) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true}
	cfg.Defaults()
	for _, backend := range []string{"fake", "kernel"} {
		b.Run(backend, func(b *testing.B) {
			for _, f := range strings.Split(*syncBenchPods, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n <= 0 {
					b.Fatalf("-sync-bench-pods: %q is not a pod count", f)
				}
				b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
					in := syncBenchInput(n, syncBenchPolicies)
					i, edited := editablePolicy(b, in)
					versions := [2]compile.Input{in, in}
					versions[1].Policies = append([]*networkingv1.NetworkPolicy(nil), in.Policies...)
					versions[1].Policies[i] = edited
					key := edited.Namespace + "/" + edited.Name
					cin := in
					cin.ClusterPolicies = policyBenchCNPs()
					ci, cedited := editableClusterPolicy(b, cin)
					cversions := [2]compile.Input{cin, cin}
					cversions[1].ClusterPolicies = append([]*npav1beta1.ClusterNetworkPolicy(nil), cin.ClusterPolicies...)
					cversions[1].ClusterPolicies[ci] = cedited
					for _, path := range []string{"rebuild", "tracker", "tracker-refreshed", "cluster-rebuild", "cluster-tracker"} {
						b.Run(path, func(b *testing.B) {
							s := policyBenchSyncer(b, backend)
							cluster := strings.HasPrefix(path, "cluster-")
							versions := versions
							if cluster {
								versions = cversions
							}
							tr, rs := trackerRebuild(b, cfg, versions[0])
							if _, err := s.Sync(context.Background(), rs); err != nil {
								b.Fatal(err)
							}
							var t syncTimes
							v := 0
							for b.Loop() {
								v = 1 - v
								cur := versions[v]
								if path == "tracker-refreshed" {
									// As in the agent: the program refresh (a
									// rebuild, synced) comes between two edits.
									_, rs, err := tr.Rebuild(versions[1-v])
									if err != nil {
										b.Fatal(err)
									}
									if _, err := s.Sync(context.Background(), rs); err != nil {
										b.Fatal(err)
									}
								}
								t0 := time.Now()
								switch path {
								case "rebuild", "cluster-rebuild":
									if _, _, err := tr.Rebuild(cur); err != nil {
										b.Fatal(err)
									}
								case "tracker", "tracker-refreshed":
									if tr.ApplyPolicy(key, cur.Policies[i]) != compile.NoFallback {
										b.Fatal("the edit needs a rebuild")
									}
								default:
									if tr.ApplyClusterPolicy(cedited.Name, cur.ClusterPolicies[ci]) != compile.NoFallback {
										b.Fatal("the cluster policy edit needs a rebuild")
									}
								}
								t.build += time.Since(t0)
								if res := t.sync(b, s, tr.Ruleset()); res.Operations == 0 || res.Full {
									b.Fatalf("the edit's sync: %+v", res)
								}
								t.n++
							}
							t.report(b)
						})
					}
				})
			}
		})
	}
}

// editablePolicy picks a policy with ingress rules that isolates pods of
// the synced node, and returns its index and an edited copy.
func editablePolicy(b *testing.B, in compile.Input) (int, *networkingv1.NetworkPolicy) {
	prog := compile.Build(in)
	for pi := range prog.Policies {
		p := &prog.Policies[pi]
		if len(p.Selected) == 0 || len(p.Ingress) == 0 || !p.IsolatesIngress {
			continue
		}
		for i, np := range in.Policies {
			if np.Namespace+"/"+np.Name != p.Key {
				continue
			}
			e := np.DeepCopy()
			port := intstr.FromInt32(9999)
			e.Spec.Ingress[0].Ports = append(e.Spec.Ingress[0].Ports, networkingv1.NetworkPolicyPort{Port: &port})
			e.Spec.Ingress = append(e.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": "policy-edit"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			})
			return i, e
		}
	}
	b.Fatal("no policy isolates a pod of the synced node")
	return 0, nil
}

func policyBenchSyncer(b *testing.B, backend string) *sets.Syncer {
	if backend == "kernel" {
		return newKernelNode(b, true).syncer
	}
	s, err := sets.New(sets.Config{NFT: &serializingFake{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// policyBenchCNPs are ClusterNetworkPolicies for BenchmarkSync's cluster,
// a few per tier: each applies to one tier of pods in the namespaces of one
// team, lets the web pods of the next team in on one port and denies
// egress to another team's namespaces.
func policyBenchCNPs() []*npav1beta1.ClusterNetworkPolicy {
	var out []*npav1beta1.ClusterNetworkPolicy
	tiers := []string{"web", "api", "db"}
	for i := range 8 {
		tier := "Admin"
		if i%2 == 1 {
			tier = "Baseline"
		}
		team := func(k int) string { return fmt.Sprintf("t%d", k%10) }
		out = append(out, ct.CNP(fmt.Sprintf("bench-%d", i), tier, int32(10*i),
			ct.PodsSubject(ct.Sel("team", team(i)), ct.Sel("tier", tiers[i%3])),
			ct.CNPIngress(ct.CNPRule("web", "Accept", ct.ToPods(ct.Sel("team", team(i+1)), ct.Sel("tier", "web"))).On(ct.Proto("TCP", int32(8080+i)))),
			ct.CNPEgress(ct.CNPRule("other-team", "Deny", ct.ToNamespaces(ct.Sel("team", team(i+5)))))))
	}
	return out
}

// editableClusterPolicy picks a ClusterNetworkPolicy with ingress rules
// and subjects on the synced node, and returns its index and a copy that
// editablePolicy's edit was made to: a port more in its first ingress
// rule, and a second ingress rule with a peer of its own.
func editableClusterPolicy(b *testing.B, in compile.Input) (int, *npav1beta1.ClusterNetworkPolicy) {
	prog := compile.Build(in)
	for _, cp := range prog.ClusterPolicies {
		if len(cp.Subjects) == 0 || len(cp.Ingress) == 0 {
			continue
		}
		for i, cnp := range in.ClusterPolicies {
			if cnp.Name != cp.Name {
				continue
			}
			e := cnp.DeepCopy()
			e.Spec.Ingress[0].Protocols = append(e.Spec.Ingress[0].Protocols, ct.Proto("TCP", 9999))
			e.Spec.Ingress = append(e.Spec.Ingress, npav1beta1.ClusterNetworkPolicyIngressRule{Name: "bench", Action: npav1beta1.ClusterNetworkPolicyRuleActionAccept,
				From:      []npav1beta1.ClusterNetworkPolicyIngressPeer{{Pods: ct.ToPods(ct.Sel(), ct.Sel("bench", "policy-edit")).Pods}},
				Protocols: []npav1beta1.ClusterNetworkPolicyProtocol{ct.Proto("TCP", 9999)}})
			return i, e
		}
	}
	b.Fatal("no ClusterNetworkPolicy applies to a pod of the synced node")
	return 0, nil
}
