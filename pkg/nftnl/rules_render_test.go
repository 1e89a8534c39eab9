package nftnl

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// nftOnlyKinds are the expressions the renderer emits that only nft
// writes: a rule with one goes through nft, by its kind (as does a
// lookup in a set whose declaration only nft writes).
var nftOnlyKinds = map[compile.ExprKind]bool{
	compile.ExprNft: true, compile.ExprMeter: true, compile.ExprNfproto: true, compile.ExprNumgen: true,
}

// TestEveryRenderedRuleEncodes renders every golden scenario in every
// mode and option (deny log, staged log, verification, DNS learning) and
// encodes each rule of each chain: a rule made only of the kinds this
// package encodes must encode (no rule shape the renderer emits goes
// through nft for want of an encoder), and a rule with a kind only nft
// writes is refused as ErrUnsupported, never encoded as something else.
func TestEveryRenderedRuleEncodes(t *testing.T) {
	scenarios, _ := filepath.Glob("../compile/testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	cfgs := map[string]compile.RenderConfig{
		"hybrid":         {Mode: compile.ModeHybrid, StagedLogGroup: 8},
		"queue":          {Mode: compile.ModeQueue, QueueVariant: compile.QueueNative, FailOpen: true, Queues: 2, StagedLogGroup: 8},
		"queue-xt":       {Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat, StagedLogGroup: 8},
		"hybrid-denylog": {Mode: compile.ModeHybrid, DenyLogGroup: 7, StagedLogGroup: 8},
		"hybrid-verify":  {Mode: compile.ModeHybrid, DenyLogGroup: 7, Verify: compile.VerifyConfig{Group: 9, PerMillion: 10_000}},
	}
	encoded, refused := 0, 0
	byKind := map[compile.ExprKind]int{}
	for _, sc := range scenarios {
		in := scenariotest.GoldenInput(t, sc)
		prog := compile.Build(in)
		for mode, cfg := range cfgs {
			rs, err := compile.Render(prog, cfg)
			if err != nil {
				t.Fatalf("%s %s: %v", sc, mode, err)
			}
			sets := func(n string) *compile.Set { return rs.Sets[n] }
			for _, name := range rs.ChainOrder {
				for i := range rs.Chains[name].Rules {
					r := &rs.Chains[name].Rules[i]
					nftOnly := false
					for _, e := range r.Exprs {
						// A learned (dynamic) set's declaration has a
						// timeout, which AddSet and LayoutOf refuse: its
						// chain comes with it, through nft.
						learned := e.Kind == compile.ExprLookup && rs.Sets[e.Set] != nil && rs.Sets[e.Set].Dynamic
						nftOnly = nftOnly || nftOnlyKinds[e.Kind] || learned
					}
					_, err := ruleExprs(r, sets)
					switch {
					case !nftOnly && err != nil:
						t.Errorf("%s %s: chain %s: rule %q is not encoded: %v", filepath.Base(sc), mode, name, r.Text(), err)
					case nftOnly && !errors.Is(err, ErrUnsupported):
						t.Errorf("%s %s: chain %s: rule %q with an expression only nft writes: err %v, want ErrUnsupported", filepath.Base(sc), mode, name, r.Text(), err)
					case nftOnly:
						refused++
					default:
						encoded++
						for _, e := range r.Exprs {
							byKind[e.Kind]++
						}
					}
				}
			}
		}
	}
	// Every kind this package encodes was seen in an encoded rule: the
	// goldens exercise each.
	for _, k := range []compile.ExprKind{compile.ExprLookup, compile.ExprVmap, compile.ExprCounter, compile.ExprLimit, compile.ExprLog} {
		if byKind[k] == 0 {
			t.Errorf("no encoded rule has an expression of kind %d", k)
		}
	}
	t.Logf("%d rules encoded, %d with expressions only nft writes", encoded, refused)
	if encoded == 0 {
		t.Fatal("nothing encoded")
	}
}
