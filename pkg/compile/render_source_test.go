package compile

import (
	"strings"
	"testing"
)

// TestSourceValidation: in every mode the source check is forward's first
// rule (before the DNS capture and the established accept, which a spoofed
// reply would match) and input's second, after neighbour discovery (DAD's
// source is ::); NoSourceValidation leaves it out and input's order as it
// was.
func TestSourceValidation(t *testing.T) {
	const check = "fib saddr . iif oif missing counter drop"
	for _, cfg := range []RenderConfig{{Mode: ModeHybrid}, {Mode: ModeKernel}, {Mode: ModeQueue}, {Mode: ModeQueue, QueueVariant: QueueXTCompat}} {
		for _, sc := range []string{"testdata/golden/cluster-tiers.yaml", "testdata/golden/egress-dualstack.yaml"} {
			name := string(cfg.Mode) + " " + sc
			rs := renderScenarioRuleset(t, sc, cfg)
			fwd, in := rs.Chains[ChainForward].Rules, rs.Chains[ChainInput].Rules
			if !strings.Contains(fwd[0].Rule, check) || fwd[0].Comment == nil || !strings.Contains(*fwd[0].Comment, "--source-validation=false") {
				t.Errorf("%s: forward starts with %q", name, fwd[0].Rule)
			}
			if !strings.Contains(in[0].Rule, "nd-neighbor-solicit") || !strings.Contains(in[1].Rule, check) {
				t.Errorf("%s: input starts with %q, %q", name, in[0].Rule, in[1].Rule)
			}
			for _, c := range []*Chain{rs.Chains[ChainForward], rs.Chains[ChainInput]} {
				n := 0
				for _, r := range c.Rules {
					if strings.Contains(r.Rule, "nd-neighbor-solicit") {
						n++
					}
				}
				if n != 1 {
					t.Errorf("%s: %s has %d neighbour discovery rules", name, c.Chain.Name, n)
				}
			}

			off := cfg
			off.NoSourceValidation = true
			rs = renderScenarioRuleset(t, sc, off)
			for _, c := range rs.Chains {
				for _, r := range c.Rules {
					if strings.Contains(r.Rule, "fib ") {
						t.Errorf("%s, validation off: %s has %q", name, c.Chain.Name, r.Rule)
					}
				}
			}
			est, nd := -1, -1
			for i, r := range rs.Chains[ChainInput].Rules {
				if strings.HasPrefix(r.Rule, "ct state established") {
					est = i
				}
				if strings.Contains(r.Rule, "nd-neighbor-solicit") {
					nd = i
				}
			}
			if est < 0 || nd < est {
				t.Errorf("%s, validation off: input's neighbour discovery rule moved (%d, established %d)", name, nd, est)
			}
		}
	}
}
