package compile_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// TestStagedLogOnlyWhereStaged: the staged log is rendered only when it is
// on and a staged policy selects a pod of the rendered node.
func TestStagedLogOnlyWhereStaged(t *testing.T) {
	in := scenariotest.GoldenInput(t, "testdata/golden/staged.yaml")
	render := func(node string, group uint16) string {
		in := in
		in.NodeName = node
		rs, err := compile.Render(compile.Build(in), compile.RenderConfig{Mode: compile.ModeHybrid, StagedLogGroup: group})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for name, c := range rs.Chains {
			b.WriteString(name + "\n")
			if c.Chain.Comment != nil && len(*c.Chain.Comment) > knftables.CommentLengthMax {
				t.Errorf("chain %s: comment longer than nft takes: %q", name, *c.Chain.Comment)
			}
		}
		for name := range rs.Sets {
			b.WriteString(name + "\n")
		}
		return b.String()
	}
	if s := render("node-1", 8); !strings.Contains(s, compile.ChainStagedLog) {
		t.Errorf("node-1 has staged subjects and no staged log:\n%s", s)
	}
	if s := render("node-1", 0); strings.Contains(s, "staged") {
		t.Errorf("the staged log off, node-1's ruleset has:\n%s", s)
	}
	// A node none of whose pods a staged policy selects (it has none).
	if s := render("node-9", 8); strings.Contains(s, "staged") {
		t.Errorf("a node without staged subjects has:\n%s", s)
	}
	if _, err := compile.Render(compile.Build(in), compile.RenderConfig{DenyLogGroup: 8, StagedLogGroup: 8}); err == nil {
		t.Error("the staged log on the deny log's group: no error")
	}
}
