package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// ProbeResult is one output line of `nftpolicy eval`: the verdict, then
// the connection decided (after the verdict, so that the fields every tool
// of docs/scenario-format.md prints come first).
type ProbeResult struct {
	Probe    int    `json:"probe"`
	Allowed  bool   `json:"allowed"`
	Ingress  bool   `json:"ingress"`
	Egress   bool   `json:"egress"`
	Reason   string `json:"reason"`
	From     string `json:"from"`
	To       string `json:"to"`
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
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
		p := s.Probes[i]
		out[i] = ProbeResult{Probe: i, Allowed: v.Allowed, Ingress: v.Ingress, Egress: v.Egress, Reason: v.Reason(),
			From: p.From.String(), To: p.To.String(), Protocol: p.ProbeProtocol().String(), Port: p.Port}
	}
	return out
}

const evalUsage = `usage: nftpolicy eval --scenario FILE [-o json|yaml|text]

Decides every probe of the scenario with the userspace evaluator. -o json
(the default) prints one JSON line per probe:
{"probe":i,"allowed":b,"ingress":b,"egress":b,"reason":"...","from":"NS/POD","to":"...","protocol":"TCP","port":80};
yaml the same fields as a list; text a table.

` + cli.ExitCodes

func runEval(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("eval", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario file (YAML or JSON, see docs/scenario-format.md)")
	output := fs.StringP("output", "o", "json", "json (one line per probe), yaml or text")
	if code, ok := parseFlags(fs, args, stderr, evalUsage); !ok {
		return code
	}
	if *output != "json" && *output != "yaml" && *output != "text" {
		fmt.Fprintf(stderr, "nftpolicy: --output %q: must be json, yaml or text\n", *output)
		return exitBadInput
	}
	s, code := loadScenario(*scenario, stderr)
	if s == nil {
		return code
	}
	if err := printProbes(stdout, EvalScenario(s), *output); err != nil {
		fmt.Fprintf(stderr, "nftpolicy: writing: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// printProbes prints the results as JSON lines, YAML or a table.
func printProbes(w io.Writer, results []ProbeResult, output string) error {
	switch output {
	case "yaml":
		return cli.PrintStructured(w, results, output)
	case "text":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PROBE\tFROM\tTO\tPROTOCOL\tPORT\tVERDICT\tREASON")
		for _, r := range results {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Probe, r.From, r.To, r.Protocol, r.Port, strings.ToUpper(verdictText(r.Allowed)), r.Reason)
		}
		return tw.Flush()
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range results {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
