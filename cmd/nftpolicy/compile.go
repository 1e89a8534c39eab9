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

// CompileScenario renders the ruleset one node of the scenario would get
// with the given cost budgets and render configuration, as
// an nft script: the canonical dump of the table (knftables.Fake's Dump),
// written straight from the rendered ruleset (compile.Ruleset.DumpTo).
func CompileScenario(s *scenario.Scenario, node string, nodeIPs []netip.Addr, budgets compile.Budgets, cfg compile.RenderConfig) (string, *compile.Program, error) {
	nodes := s.NodeNames(defaultNodes)
	in := s.Input(node, nodes, nodeIPs)
	in.Budgets = budgets
	prog := compile.Build(in)
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

// compileRenderFlags are the agent's flags that shape its ruleset or
// program. compile takes them from the agent's own flag set, with the
// agent's defaults and help, so that without flags it renders what an
// agent with default flags installs (the deny log and the staged log on).
var compileRenderFlags = []string{"mode", "fail-open", "source-validation", "tunnel-udp-ports", "tunnel-peers",
	"queue-num", "queues", "allow-mark", "queue-source-rate", "queue-source-burst",
	"deny-log", "deny-log-group", "deny-log-kernel-rate", "deny-log-kernel-total-rate",
	"staged-log", "staged-log-group", "staged-log-kernel-rate", "staged-log-kernel-total-rate",
	"verify-rate", "verify-log-group", "verify-kernel-rate",
	"unknown-pods", "unknown-pod-source-rate", "unknown-pod-source-burst", "uplink-interfaces", "dns-queue-num",
	"policy-cost-budget", "namespace-cost-budget", "cluster-policy-cost-budget"}

// addAgentRenderFlags adds compileRenderFlags to fs, bound to a new
// agentOptions whose configuration holds the agent's defaults until fs is
// parsed (compileRenderConfig validates and applies it).
func addAgentRenderFlags(fs *pflag.FlagSet) *agentOptions {
	o := &agentOptions{}
	agentFS := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	o.addFlags(agentFS)
	for _, name := range compileRenderFlags {
		fs.AddFlag(agentFS.Lookup(name))
	}
	return o
}

// compileRenderConfig is the render configuration of the agent's options
// o, as the agent completes it (agentOptions.finishRenderConfig), with the
// queue rule variant given instead of probed.
func compileRenderConfig(o *agentOptions, variant string) (compile.RenderConfig, error) {
	if err := o.cfg.Validate(); err != nil {
		return compile.RenderConfig{}, err
	}
	o.applyConfig()
	m, err := compile.ParseMode(o.mode)
	if err != nil {
		return compile.RenderConfig{}, fmt.Errorf("--mode: %w", err)
	}
	v := compile.QueueVariant(variant)
	if v != compile.QueueNative && v != compile.QueueXTCompat {
		return compile.RenderConfig{}, fmt.Errorf("--queue-variant %q: want %s or %s", variant, compile.QueueNative, compile.QueueXTCompat)
	}
	render, err := o.renderConfig(m)
	if err != nil {
		return compile.RenderConfig{}, err
	}
	render.QueueVariant = v
	o.newPod.configureRender(&render)
	if err := o.configureLogs(&render); err != nil {
		return compile.RenderConfig{}, err
	}
	return render, nil
}

const compileUsage = `usage: nftpolicy compile --scenario FILE --node NAME [flags]

Prints the nftables ruleset the agent would install on that node: without
flags, what an agent with default flags installs (deny log, staged log,
source validation and the queueing of unknown pod addresses on). The
agent's flags that shape the ruleset are taken with the agent's defaults.
Three of those defaults come from the machine the agent runs on, and
compile takes them from the machine it runs on: give the node's values
elsewhere: --queues (one per CPU), --uplink-interfaces (the interfaces of
the default routes), --queue-variant (the agent probes the kernel;
compile's default is native).

`

func runCompile(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("compile", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario file (YAML or JSON, see docs/scenario-format.md)")
	node := fs.String("node", "", "node whose ruleset to print (pods without a node are spread over node-1, node-2 unless the scenario names nodes)")
	variant := fs.String("queue-variant", string(compile.QueueNative), "queue rule: native or xt-compat (the agent probes the kernel)")
	nodeIPs := fs.StringSlice("node-ip", nil, "the node's own addresses (traffic between them and the node's pods is always allowed)")
	o := addAgentRenderFlags(fs)
	if code, ok := parseFlags(fs, args, stderr, compileUsage+cli.ExitCodes); !ok {
		return code
	}
	if *node == "" {
		fmt.Fprintln(stderr, "nftpolicy: --node NAME is required")
		return exitBadInput
	}
	cfg, err := compileRenderConfig(o, *variant)
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy: %v\n", err)
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
	out, prog, err := CompileScenario(s, *node, ips, o.budgets, cfg)
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
