package compile_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestSourceValidation: in every mode the source check is a prerouting
// base chain at priority raw (before conntrack, forward and input), whose
// neighbour discovery rule comes before the drop (DAD's source is ::);
// forward and input do not change; NoSourceValidation leaves the chain out.
func TestSourceValidation(t *testing.T) {
	const check = "fib saddr . iif oif missing counter drop"
	for _, cfg := range []compile.RenderConfig{{Mode: compile.ModeHybrid}, {Mode: compile.ModeKernel}, {Mode: compile.ModeQueue}, {Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat}} {
		for _, sc := range []string{"testdata/golden/cluster-tiers.yaml", "testdata/golden/egress-dualstack.yaml"} {
			name := string(cfg.Mode) + " " + sc
			rs := renderScenarioRuleset(t, sc, cfg)
			c := rs.Chains[compile.ChainPrerouting]
			if c == nil {
				t.Fatalf("%s: no %s chain", name, compile.ChainPrerouting)
			}
			if *c.Chain.Hook != knftables.PreroutingHook || *c.Chain.Priority != knftables.RawPriority || *c.Chain.Policy != knftables.AcceptPolicy {
				t.Errorf("%s: chain %+v", name, c.Chain)
			}
			if len(c.Rules) != 2 || !strings.Contains(c.Rules[0].Rule, "nd-neighbor-solicit") || !strings.Contains(c.Rules[1].Rule, check) ||
				c.Rules[1].Comment == nil || !strings.Contains(*c.Rules[1].Comment, "--source-validation=false") {
				t.Errorf("%s: prerouting rules %+v", name, c.Rules)
			}

			off := cfg
			off.NoSourceValidation = true
			rsOff := renderScenarioRuleset(t, sc, off)
			if rsOff.Chains[compile.ChainPrerouting] != nil {
				t.Errorf("%s, validation off: the prerouting chain is there", name)
			}
			for _, ch := range []string{compile.ChainForward, compile.ChainInput} {
				on, off := rs.Chains[ch].Rules, rsOff.Chains[ch].Rules
				if len(on) != len(off) {
					t.Errorf("%s: %s differs with and without validation", name, ch)
				}
				for _, r := range off {
					if strings.Contains(r.Rule, "fib ") {
						t.Errorf("%s, validation off: %s has %q", name, ch, r.Rule)
					}
				}
			}
		}
	}
}
