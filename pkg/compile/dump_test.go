package compile_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// dumpDirect is Ruleset.DumpTo's text: what `nftpolicy compile` prints.
func dumpDirect(rs *compile.Ruleset) string {
	tx := knftables.NewFake(knftables.InetFamily, compile.TableName).NewTransaction()
	rs.DumpTo(tx)
	return tx.String()
}

// dumpFake loads the ruleset into knftables' fake and dumps it.
func dumpFake(t *testing.T, rs *compile.Ruleset) string {
	t.Helper()
	fake := knftables.NewFake(knftables.InetFamily, compile.TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("ruleset does not load into the fake: %v", err)
	}
	return fake.Dump()
}

// DumpTo writes, byte for byte, what the fake dumps after AddTo, for every
// golden scenario in every golden configuration, for a policy with many
// exceptions, and with a set holding two elements of one key.
func TestDumpToEqualsFakeDump(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	for _, sc := range scenarios {
		for _, m := range goldenModes {
			t.Run(strings.TrimSuffix(filepath.Base(sc), ".yaml")+"."+m.suffix, func(t *testing.T) {
				rs := renderScenarioRuleset(t, sc, m.cfg)
				if diff := cmp.Diff(dumpFake(t, rs), dumpDirect(rs)); diff != "" {
					t.Errorf("DumpTo differs from the fake's dump (-fake +DumpTo):\n%s", diff)
				}
			})
		}
	}
	t.Run("excepts", func(t *testing.T) {
		in := compiletest.Cluster(20, 4, 2)
		in.NodeName = "node-0"
		in.Policies = append(in.Policies, compiletest.HugeExceptPolicy("ns-0000", "huge", "app-1", 500, 80))
		rs, err := compile.Render(compile.Build(in), compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(dumpFake(t, rs), dumpDirect(rs)); diff != "" {
			t.Errorf("DumpTo differs from the fake's dump (-fake +DumpTo):\n%s", diff)
		}
	})
	t.Run("duplicate-key", func(t *testing.T) {
		rs := renderScenarioRuleset(t, scenarios[0], compile.RenderConfig{Mode: compile.ModeHybrid})
		for _, n := range rs.SortedSetNames() {
			s := rs.Sets[n]
			if s.Map != nil || len(s.Elements) == 0 || s.Elements[0].Shape != compile.ShapeAddr || s.Elements[0].Last != nil {
				continue
			}
			a := netip.MustParseAddr("192.0.2.1")
			if !s.Elements[0].Addr.Is4() {
				a = netip.MustParseAddr("2001:db8::1")
			}
			first, second := "first", "second"
			s.Elements = append(s.Elements, compile.AddrElement(a, &first), s.Elements[0], compile.AddrElement(a, &second))
			if diff := cmp.Diff(dumpFake(t, rs), dumpDirect(rs)); diff != "" {
				t.Errorf("set %s: DumpTo differs from the fake's dump (-fake +DumpTo):\n%s", n, diff)
			}
			return
		}
		t.Fatal("no address set in the scenario")
	})
}
