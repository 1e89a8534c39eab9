// Package scenariotest reads scenario files for tests, failing the test on
// an error. It is apart from pkg/scenario so that the product does not
// import package testing, and apart from compiletest so that the tests of
// the evaluator, which pkg/scenario imports, can use compiletest.
package scenariotest

import (
	"os"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// Load reads and parses a scenario file, failing the test on an error.
func Load(t testing.TB, path string) *scenario.Scenario {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := scenario.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s
}

// GoldenInput reads a scenario file (the golden scenarios live in
// pkg/compile/testdata/golden) and returns its objects as node-1 sees
// them, with node-1 and node-2 as the default nodes, as the golden
// rulesets are rendered.
func GoldenInput(t testing.TB, path string) compile.Input {
	t.Helper()
	s := Load(t, path)
	return s.Input("node-1", s.NodeNames([]string{"node-1", "node-2"}), nil)
}
