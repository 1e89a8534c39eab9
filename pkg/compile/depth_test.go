package compile_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The kernel refuses a table whose chain graph is deeper than its jump
// stack, so every ruleset must stay under it: each golden scenario, and
// the deepest shape the tiers make (an Admin Pass, a NetworkPolicy and a
// Baseline Deny around the same pods, both ends on one node: upstream's
// CNPAdminTierIntegration), in every mode and with every optional chain.
func TestJumpDepthUnderKernelStack(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	scenarios = append(scenarios, "testdata/depth-pass-np-baseline.yaml")
	cfgs := []compile.RenderConfig{
		{Mode: compile.ModeKernel},
		{Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat},
		{Mode: compile.ModeHybrid, DenyLogGroup: 7, StagedLogGroup: 8,
			Verify: compile.VerifyConfig{Group: 9, PerMillion: 10000, SourceRate: 20, SourceBurst: 40}},
	}
	for _, sc := range scenarios {
		for _, cfg := range cfgs {
			rs := renderScenarioRuleset(t, sc, cfg)
			path, err := rs.JumpPath()
			if err != nil {
				t.Fatalf("%s (%s): %v", sc, cfg.Mode, err)
			}
			if len(path)-1 >= compile.KernelJumpStack {
				t.Errorf("%s (%s, deny log %v): %d nested chains, the kernel refuses %d: %s",
					sc, cfg.Mode, cfg.DenyLogGroup != 0, len(path)-1, compile.KernelJumpStack, strings.Join(path, " -> "))
			}
			t.Logf("%s (%s): depth %d", filepath.Base(sc), cfg.Mode, len(path)-1)
		}
	}
}
