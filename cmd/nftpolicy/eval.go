package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// ProbeResult is one output line of `nftpolicy eval`.
type ProbeResult struct {
	Probe   int    `json:"probe"`
	Allowed bool   `json:"allowed"`
	Ingress bool   `json:"ingress"`
	Egress  bool   `json:"egress"`
	Reason  string `json:"reason"`
}

func loadScenario(path string, stderr io.Writer) (*scenario.Scenario, int) {
	if path == "" {
		fmt.Fprintln(stderr, "nftpolicy: --scenario FILE is required")
		return nil, exitBadInput
	}
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy: reading scenario: %v\n", err)
		return nil, exitBadInput
	}
	s, err := scenario.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy: %s: %v\n", path, err)
		return nil, exitBadInput
	}
	return s, exitOK
}

// EvalScenario decides every probe of a scenario cluster-wide
// (scenario.Decide).
func EvalScenario(s *scenario.Scenario) []ProbeResult {
	out := make([]ProbeResult, len(s.Probes))
	for i, v := range s.Decide() {
		out[i] = ProbeResult{Probe: i, Allowed: v.Allowed, Ingress: v.Ingress, Egress: v.Egress, Reason: v.Reason()}
	}
	return out
}

func runEval(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("eval", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario file (YAML or JSON, see docs/scenario-format.md)")
	if code, ok := parseFlags(fs, args, stderr, "usage: nftpolicy eval --scenario FILE\n\nPrints one JSON line per probe: {\"probe\":i,\"allowed\":b,\"ingress\":b,\"egress\":b,\"reason\":\"...\"}.\n\n"+cli.ExitCodes); !ok {
		return code
	}
	s, code := loadScenario(*scenario, stderr)
	if s == nil {
		return code
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for _, r := range EvalScenario(s) {
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "nftpolicy: writing: %v\n", err)
			return exitFailure
		}
	}
	return exitOK
}
