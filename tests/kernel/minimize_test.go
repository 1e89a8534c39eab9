package kernel

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// isPolicyChain tells a policy's own chain ("ingress-ns/name") from the
// static and isolation chains.
func isPolicyChain(name string) bool {
	return (strings.HasPrefix(name, "ingress-") || strings.HasPrefix(name, "egress-")) && strings.Contains(name, "/")
}

// Compiler bugs injected into the rendered ruleset, in the test only.
var injectedBugs = map[string]func(node string, rs *compile.Ruleset){
	// The first rule of every policy chain is lost.
	"drop-first-policy-rule": func(_ string, rs *compile.Ruleset) {
		for name, ch := range rs.Chains {
			if isPolicyChain(name) && len(ch.Rules) > 0 {
				ch.Rules = ch.Rules[1:]
			}
		}
	},
	// Every port set element is off by one: "tcp . 80" becomes "tcp . 81".
	"port-off-by-one": func(_ string, rs *compile.Ruleset) {
		for name, set := range rs.Sets {
			if !strings.HasSuffix(name, "-ports") {
				continue
			}
			for i := range set.Elements {
				p := &set.Elements[i].Ports
				p.First, p.Last = uint16(min(int(p.First)+1, 65535)), uint16(min(int(p.Last)+1, 65535))
			}
		}
	},
}

// TestDifferentialCatchesInjectedBug: with a deliberately broken compiler
// output the differential run must disagree on some generated scenario, the
// minimizer must shrink it (fewer policies or probes) while it still
// disagrees, and without the bug the minimized scenario must agree again.
func TestDifferentialCatchesInjectedBug(t *testing.T) {
	requireRoot(t)
	for name, bug := range injectedBugs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for seed := uint64(1); seed <= 20; seed++ {
				s := scenariogen.Generate(seed)
				c, err := lab.New(ctx, s, lab.Config{MutateRuleset: bug})
				if err != nil {
					t.Fatal(err)
				}
				done, err := catchAndMinimize(ctx, t, c, seed, s)
				if cerr := c.Close(); cerr != nil {
					t.Errorf("Close: %v", cerr)
				}
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if done {
					return
				}
			}
			t.Fatal("the injected bug went unnoticed over 20 seeds")
		})
	}
}

func catchAndMinimize(ctx context.Context, t *testing.T, c *lab.Lab, seed uint64, s *scenario.Scenario) (bool, error) {
	rep, err := c.Check(ctx, s, false, nil)
	if err != nil {
		return false, err
	}
	if errs := rep.Errors(); len(errs) > 0 {
		return false, fmt.Errorf("harness errors:\n%s", rep.Table())
	}
	var bad []int
	for _, o := range rep.Disagreements() {
		bad = append(bad, o.Index)
	}
	if len(bad) == 0 {
		t.Logf("seed %d: no disagreement", seed)
		return false, nil
	}
	t.Logf("seed %d: %d of %d probes disagree", seed, len(bad), len(s.Probes))
	m, err := Minimize(ctx, c, s, bad, MinimizeOptions{Logf: t.Logf})
	if err != nil {
		return false, err
	}
	if len(m.Report.Disagreements()) == 0 {
		t.Errorf("the minimized scenario no longer disagrees")
	}
	if len(m.Scenario.Policies) >= len(s.Policies) && len(m.Scenario.Probes) >= len(s.Probes) {
		t.Errorf("not minimized: %d policies/%d probes, was %d/%d", len(m.Scenario.Policies), len(m.Scenario.Probes), len(s.Policies), len(s.Probes))
	}
	if _, err := lab.Revalidate(m.Scenario); err != nil {
		t.Errorf("the minimized scenario is invalid: %v", err)
	}
	data, _ := lab.MarshalScenario(m.Scenario, fmt.Sprintf("seed %d minimized in %d steps", seed, m.Steps))
	t.Logf("minimized from %d policies/%d probes to %d/%d in %d steps:\n%s\n%s",
		len(s.Policies), len(s.Probes), len(m.Scenario.Policies), len(m.Scenario.Probes), m.Steps, data, m.Report.Table())

	c.SetMutateRuleset(nil)
	fixed, err := c.Check(ctx, m.Scenario, true, nil)
	if err != nil {
		return false, err
	}
	if tab := fixed.Table(); tab != "" {
		t.Errorf("without the injected bug the minimized scenario still disagrees:\n%s", tab)
	}
	return true, nil
}
