package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

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
  version   print the version, commit, Go version and platform (also --version)

Run 'nftpolicy <command> --help' for the flags of a command.
`

// Exit statuses shared by the offline commands (see docs/scenario-format.md).
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
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
	case "version", "--version":
		return runVersion(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "nftpolicy: unknown command %q\n\n%s", args[0], usage)
	return exitBadInput
}

// parseFlags parses a subcommand's flags. It returns ok=false with the exit
// code when the command must stop: 0 after --help, 2 for bad flags (with the
// error and the usage on stderr).
func parseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer, usage string) (int, bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK, false
		}
		fmt.Fprintf(stderr, "nftpolicy: %v\n", err)
		fs.Usage()
		return exitBadInput, false
	}
	return exitOK, true
}
