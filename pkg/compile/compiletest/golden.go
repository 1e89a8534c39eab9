package compiletest

import (
	"os"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// LoadScenario reads and parses a scenario file, failing the test on an
// error.
func LoadScenario(t testing.TB, path string) *compile.Scenario {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := compile.ParseScenario(data)
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
	s := LoadScenario(t, path)
	return s.Input("node-1", s.NodeNames([]string{"node-1", "node-2"}), nil)
}
