package main

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// defaultNodes are the nodes pods are spread over when a scenario names none;
// the end-to-end runner uses the same two.
var defaultNodes = []string{"node-1", "node-2"}

// CompileScenario renders the ruleset one node of the scenario would get, as
// an nft script: the canonical dump of the table (knftables.Fake's Dump),
// written straight from the rendered ruleset (compile.Ruleset.DumpTo).
func CompileScenario(s *scenario.Scenario, node string, nodeIPs []netip.Addr, cfg compile.RenderConfig) (string, *compile.Program, error) {
	nodes := s.NodeNames(defaultNodes)
	prog := compile.Build(s.Input(node, nodes, nodeIPs))
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		return "", nil, err
	}
	tx := knftables.NewFake(knftables.InetFamily, compile.TableName).NewTransaction()
	rs.DumpTo(tx)
	out := tx.String()
	// knftables ends the text with this line when an object is invalid
	// (the error Run would return).
	if i := strings.LastIndex(out, txErrorMark); i >= 0 && (i == 0 || out[i-1] == '\n') {
		return "", nil, fmt.Errorf("rendered ruleset does not load: %s", out[i+len(txErrorMark):])
	}
	return out, prog, nil
}

// txErrorMark starts the line knftables.Transaction's String ends with
// when an operation was invalid.
const txErrorMark = "# ERROR: "

func runCompile(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("compile", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario file (YAML or JSON, see docs/scenario-format.md)")
	node := fs.String("node", "", "node whose ruleset to print (pods without a node are spread over node-1, node-2 unless the scenario names nodes)")
	mode := fs.String("mode", string(compile.ModeHybrid), "enforcement mode: hybrid, queue or kernel")
	variant := fs.String("queue-variant", string(compile.QueueNative), "queue rule: native or xt-compat (the agent probes the kernel)")
	nodeIPs := fs.StringSlice("node-ip", nil, "the node's own addresses (traffic between them and the node's pods is always allowed)")
	failOpen := fs.Bool("fail-open", false, "queued packets pass while no agent listens")
	if code, ok := parseFlags(fs, args, stderr, "usage: nftpolicy compile --scenario FILE --node NAME [--mode hybrid|queue|kernel]\n\nPrints the nftables ruleset the agent would install on that node.\n\n"+cli.ExitCodes); !ok {
		return code
	}
	if *node == "" {
		fmt.Fprintln(stderr, "nftpolicy: --node NAME is required")
		return exitBadInput
	}
	m, err := compile.ParseMode(*mode)
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy: --mode: %v\n", err)
		return exitBadInput
	}
	if v := compile.QueueVariant(*variant); v != compile.QueueNative && v != compile.QueueXTCompat {
		fmt.Fprintf(stderr, "nftpolicy: --queue-variant %q: want %s or %s\n", *variant, compile.QueueNative, compile.QueueXTCompat)
		return exitBadInput
	}
	var ips []netip.Addr
	for _, s := range *nodeIPs {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy: --node-ip: %v\n", err)
			return exitBadInput
		}
		ips = append(ips, a)
	}
	s, code := loadScenario(*scenario, stderr)
	if s == nil {
		return code
	}
	// A node the scenario does not have (a typo) would render a ruleset
	// without local pods.
	if nodes := s.NodeNames(defaultNodes); !slices.Contains(nodes, *node) {
		fmt.Fprintf(stderr, "nftpolicy: --node %q: not a node of the scenario (%s)\n", *node, strings.Join(nodes, ", "))
		return exitBadInput
	}
	out, prog, err := CompileScenario(s, *node, ips, compile.RenderConfig{Mode: m, QueueVariant: compile.QueueVariant(*variant), FailOpen: *failOpen})
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy: %v\n", err)
		return exitFailure
	}
	for _, p := range prog.Problems {
		fmt.Fprintf(stderr, "warning: %v\n", p)
	}
	fmt.Fprint(stdout, out)
	return exitOK
}
