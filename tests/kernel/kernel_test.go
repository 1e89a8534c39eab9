package kernel

// Real-kernel tests: each scenario under testdata/ runs in a lab
// (tests/internal/lab) of two nodes (node-1 10.244.1.x, node-2 10.244.2.x
// by the scenarios' convention; external hosts hang off node-1) and every
// probe must get the evaluator's verdict. They need root and the nft binary; each test builds
// its own namespaces, so they run in parallel.

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.Require(t, "kernel tests", testenv.Root("create network namespaces, veths and nftables rulesets"), testenv.Binaries("ip", "nft"))
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newLab(t *testing.T, s *scenario.Scenario, cfg lab.Config) *lab.Lab {
	t.Helper()
	c, err := lab.New(testContext(t), s, cfg)
	if err != nil {
		t.Fatalf("lab.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// check applies s and fails the test on any disagreement or probe error,
// printing the table and the rulesets.
func check(t *testing.T, c *lab.Lab, s *scenario.Scenario, full bool) *lab.Report {
	t.Helper()
	rep, err := c.Check(testContext(t), s, full, nil)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if tab := rep.Table(); tab != "" {
		t.Errorf("%s", tab)
	}
	allowed := 0
	for _, o := range rep.Outcomes {
		if o.Connected {
			allowed++
		}
	}
	t.Logf("%d probes (%d allowed) in %v", len(rep.Outcomes), allowed, rep.Duration.Round(time.Millisecond))
	return rep
}

func scenarioFiles(t *testing.T) []string {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in testdata: %v", err)
	}
	return files
}

// TestScenarios runs every scenario of testdata/ in hybrid and kernel mode.
func TestScenarios(t *testing.T) {
	requireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel} {
		for _, f := range scenarioFiles(t) {
			name := strings.TrimSuffix(filepath.Base(f), ".yaml")
			t.Run(string(mode)+"/"+name, func(t *testing.T) {
				t.Parallel()
				s := scenariotest.Load(t, f)
				c := newLab(t, s, lab.Config{Mode: mode})
				check(t, c, s, false)
			})
		}
	}
}
