package kernel

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// TestIncrementalSync changes the cluster after the first sync the way the
// controller would (a pod relabelled, a policy edited, policies deleted and
// created again), each time with a second Build+Render and an incremental
// Sync on the same syncer, and re-probes: the kernel must follow the
// evaluator every time.
func TestIncrementalSync(t *testing.T) {
	requireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			base := scenariotest.Load(t, "testdata/incremental.yaml")
			c := newLab(t, base, lab.Config{Mode: mode}) // queue: the variant the kernel supports
			rep := check(t, c, base, false)
			for n, r := range rep.Sync {
				if !r.Full {
					t.Errorf("first sync of %s was not full", n)
				}
			}
			prev := verdicts(rep)

			steps := []struct {
				name string
				edit func(s *scenario.Scenario)
			}{
				{"relabel y/d as a client", func(s *scenario.Scenario) {
					s.Pod("y/d").Labels["role"] = "client"
				}},
				{"edit x/web-in: port 80 becomes 81", func(s *scenario.Scenario) {
					p := policyNamed(t, s, "x", "web-in")
					p.Spec.Ingress[0].Ports[0].Port.IntVal = 81
				}},
				{"delete x/db-in", func(s *scenario.Scenario) {
					s.Policies = slices.DeleteFunc(s.Policies, func(p networkingv1.NetworkPolicy) bool { return p.Name == "db-in" })
				}},
				{"delete every policy", func(s *scenario.Scenario) { s.Policies = nil }},
				{"create them again", func(s *scenario.Scenario) { s.Policies = lab.CloneScenario(base).Policies }},
			}
			cur := lab.CloneScenario(base)
			for _, st := range steps {
				st.edit(cur)
				s := mustValid(t, cur)
				rep := check(t, c, s, false)
				for n, r := range rep.Sync {
					if r.Full {
						t.Errorf("%s: sync of %s was full, want incremental", st.name, n)
					}
				}
				if c.RenderConfig().Mode == compile.ModeQueue && c.RenderConfig().QueueVariant == compile.QueueXTCompat {
					for _, n := range c.Nodes() {
						if ok, err := c.CompatQueueRuleInstalled(n); !ok || err != nil {
							t.Errorf("%s: %s lost its xt-compat queue rule (%v, %v)", st.name, n, ok, err)
						}
					}
				}
				now := verdicts(rep)
				if slices.Equal(now, prev) {
					t.Errorf("%s: no verdict changed; the step tests nothing", st.name)
				}
				t.Logf("%s: verdicts %v", st.name, now)
				prev = now
			}
		})
	}
}

func verdicts(r *lab.Report) []bool {
	out := make([]bool, len(r.Outcomes))
	for i, o := range r.Outcomes {
		out[i] = o.Connected
	}
	return out
}

func policyNamed(t *testing.T, s *scenario.Scenario, ns, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	for i := range s.Policies {
		if s.Policies[i].Namespace == ns && s.Policies[i].Name == name {
			return &s.Policies[i]
		}
	}
	t.Fatalf("no policy %s/%s", ns, name)
	return nil
}

// mustValid checks that an edited scenario is still one the API server
// would take, and returns an independent copy.
func mustValid(t *testing.T, s *scenario.Scenario) *scenario.Scenario {
	t.Helper()
	out, err := lab.Revalidate(s)
	if err != nil {
		t.Fatalf("edited scenario: %v", err)
	}
	return out
}
