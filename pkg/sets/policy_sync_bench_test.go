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

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// BenchmarkPolicySync times one NetworkPolicy edit on the agent's path, in
// BenchmarkSync's cluster (-sync-bench-pods): a policy that isolates pods of
// the synced node gets, then loses again, a port in its first ingress rule
// and a second ingress rule with a peer of its own. "rebuild" is the path
// before the tracker applied policies (a full Build and Render, then the
// Syncer's diff); "tracker" is Tracker.ApplyPolicy, then the Syncer's diff
// of the new ruleset. build-ms is the compile step, tx-ms the Sync;
// "fake" stops at the transaction's text, "kernel" applies it in a private
// network namespace (root only).
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
					for _, path := range []string{"rebuild", "tracker"} {
						b.Run(path, func(b *testing.B) {
							s := policyBenchSyncer(b, backend)
							tr, rs := trackerRebuild(b, cfg, in)
							if _, err := s.Sync(context.Background(), rs); err != nil {
								b.Fatal(err)
							}
							var t syncTimes
							v := 0
							for b.Loop() {
								v = 1 - v
								cur := versions[v]
								t0 := time.Now()
								if path == "rebuild" {
									if _, _, err := tr.Rebuild(cur); err != nil {
										b.Fatal(err)
									}
								} else if !tr.ApplyPolicy(key, cur.Policies[i]) {
									b.Fatal("the edit needs a rebuild")
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
