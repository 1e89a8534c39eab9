package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
	"github.com/nftpolicy/nftpolicy/pkg/cli"
)

func main() {
	// A runtime executes the boot plugin by its name, without arguments.
	if filepath.Base(os.Args[0]) == bootcni.PluginName {
		os.Exit(runBootPlugin(os.Stdin, os.Stdout))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: nftpolicy <command> [flags]

commands:
  agent     run the node agent: watch the API, program nftables, serve the NFQUEUE fallback
  eval      decide every probe of a scenario with the userspace evaluator (offline)
  compile   print the nftables ruleset the agent would install on one node (offline)
  explain   say why a connection is allowed or denied, and what rule almost allowed it
  status    on how many nodes each policy's current version is in force
  wait      wait until every node enforces a policy's current version or its deletion
  preview   per node, the live connections a policy change would cut or allow (nothing applied)
  cleanup   remove what the agent installed in this node's kernel (its table and queue rules)
  publish   publish every pod's address and labels as PodAddressSlices (leader-elected; docs/scale-out.md)
  cni-install  install the boot hold: the chained CNI plugin that holds pods started before the agent's first sync
  version   print the version, commit, Go version and platform (also --version)

Run 'nftpolicy <command> --help' for the flags of a command.
`

// Exit statuses shared by every command (pkg/cli's table).
const (
	exitOK          = cli.ExitOK
	exitFailure     = cli.ExitFailure
	exitBadInput    = cli.ExitBadInput
	exitUnreachable = cli.ExitUnreachable
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitBadInput
	}
	switch args[0] {
	case "eval":
		return runEval(args[1:], stdout, stderr)
	case "compile":
		return runCompile(args[1:], stdout, stderr)
	case "explain":
		return runExplain(args[1:], stdout, stderr)
	case "agent":
		return runAgent(args[1:], stdout, stderr)
	case "status":
		return runStatus(args[1:], stdout, stderr)
	case "wait":
		return runWait(args[1:], stdout, stderr)
	case "preview":
		return runPreview(args[1:], stdout, stderr)
	case "cleanup":
		return runCleanup(args[1:], stdout, stderr)
	case "publish":
		return runPublish(args[1:], stdout, stderr)
	case "cni-install":
		return runCNIInstall(args[1:], stdout, stderr)
	case "version", "--version":
		return runVersion(args[1:], stdout, stderr)
	case "reference": // hidden: writes docs/flags.md and docs/metrics.md
		return runReference(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "nftpolicy: unknown command %q\n\n%s", args[0], usage)
	return exitBadInput
}

// parseFlags parses a subcommand's flags (see cli.ParseFlags).
func parseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer, usage string) (int, bool) {
	return cli.ParseFlags(fs, args, stderr, usage)
}
