package evaluate_test

// The 48 upstream e2e NetworkPolicy cases (compiletest.NetpolCases, listed
// in docs/netpol-cases.md) decided by the evaluator. tests/e2e runs the same
// cases on real packets. Programs are cluster-wide (Input.NodeName ""):
// every pod is enforced.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// checkTruthTable evaluates every ordered pair of distinct pods and reports
// the tables and the evaluator's reasons when they differ from want.
func checkTruthTable(t *testing.T, prog *compile.Program, want ct.TruthTable, e ct.Expectation) {
	t.Helper()
	got := ct.TruthTable{Pods: want.Pods, Allowed: map[[2]string]bool{}}
	var mismatches []string
	for _, f := range want.Pods {
		for _, to := range want.Pods {
			if f == to {
				continue
			}
			v := evaluate.Evaluate(prog, ct.GridIP(f), ct.GridIP(to), e.Proto, e.Port)
			got.Allowed[[2]string{f, to}] = v.Allowed
			if w := want.Allowed[[2]string{f, to}]; v.Allowed != w {
				mismatches = append(mismatches, fmt.Sprintf("  %s -> %s: want %s, got %s (ingress=%v egress=%v): %s",
					f, to, ct.VerdictWord(w), ct.VerdictWord(v.Allowed), v.Ingress, v.Egress, v.Reason()))
			}
		}
	}
	if len(mismatches) > 0 {
		t.Errorf("%s/%d: %d of %d pairs differ ('.' allowed, 'X' denied, '*' mismatch)\nexpected:\n%sobserved:\n%smismatches:\n%s",
			e.Proto, e.Port, len(mismatches), len(want.Allowed), want.Render(nil), got.Render(&want), strings.Join(mismatches, "\n"))
	}
}

// runNetpolCases checks every case with the pods podsOf returns; fullGrid
// adds the deltas a case needs when all nine pods exist.
func runNetpolCases(t *testing.T, podsOf func(ct.NetpolCase) []string, fullGrid bool) {
	cases := ct.NetpolCases()
	if len(cases) != 48 {
		t.Fatalf("have %d cases, docs/netpol-cases.md has 48", len(cases))
	}
	for i, c := range cases {
		if c.Num != i+1 {
			t.Fatalf("case %d is numbered %d", i+1, c.Num)
		}
		var extra []ct.Delta
		if fullGrid {
			extra = c.GridExtra
		}
		t.Run(fmt.Sprintf("%02d %s", c.Num, c.Name), func(t *testing.T) {
			pods := podsOf(c)
			for si, st := range c.Steps {
				prog := compile.Build(st.Grid(pods).Input(st.Policies, nil))
				if len(prog.Problems) > 0 {
					t.Fatalf("step %d: unexpected problems: %v", si+1, prog.Problems)
				}
				for _, e := range st.Expect {
					name := fmt.Sprintf("step%d-%s-%d", si+1, e.Proto, e.Port)
					if st.Note != "" {
						name = fmt.Sprintf("step%d %s-%s-%d", si+1, st.Note, e.Proto, e.Port)
					}
					t.Run(name, func(t *testing.T) { checkTruthTable(t, prog, e.Table(pods, extra...), e) })
				}
			}
		})
	}
}

// TestNetpolCases runs each case with the pods the current upstream test
// creates.
func TestNetpolCases(t *testing.T) {
	runNetpolCases(t, func(c ct.NetpolCase) []string { return c.Pods }, false)
}

// TestNetpolCasesFullGrid runs the cases on the full 3x3 grid that older
// versions of the upstream file always created, as tests/e2e does; two
// cases need their GridExtra deltas there.
func TestNetpolCasesFullGrid(t *testing.T) {
	runNetpolCases(t, func(ct.NetpolCase) []string { return ct.GridPods() }, true)
}
