// Command kubectl-nftpolicy is nftpolicy's kubectl plugin: on PATH, kubectl
// runs it for `kubectl nftpolicy ...`. It holds the commands that need only
// the API server (status, wait) and builds for Linux, macOS and Windows:
// it imports nothing of the kernel side (main_test.go checks that).
//
// The commands that evaluate policies (explain, eval, compile, preview) use
// the agent's compiler, which is Linux-only and large; the plugin runs them
// with the nftpolicy binary when it is on PATH.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

const usage = `usage: kubectl nftpolicy <command> [flags]

commands:
  status    on how many nodes each policy's current version is in force
  wait      wait until every node enforces a policy's current version or its deletion

  explain, eval, compile, preview: run by the nftpolicy binary, when it is on PATH

Every command takes kubectl's connection flags (--kubeconfig, --context,
--cluster, --user, -n, --as, --as-group, --request-timeout, ...).
Run 'kubectl nftpolicy <command> --help' for the flags of a command.

` + cli.ExitCodes + "\n"

// fullBinary is the program that runs the commands the plugin leaves out.
var fullBinary = "nftpolicy"

// delegated are the commands of the full binary that an operator runs
// through the plugin.
var delegated = map[string]bool{"explain": true, "eval": true, "compile": true, "preview": true}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.ExitBadInput
	}
	switch args[0] {
	case "status":
		return cli.Status(args[1:], stdout, stderr)
	case "wait":
		return cli.Wait(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	}
	if delegated[args[0]] {
		return runFull(args, stdin, stdout, stderr)
	}
	fmt.Fprintf(stderr, "kubectl-nftpolicy: unknown command %q\n\n%s", args[0], usage)
	return cli.ExitBadInput
}

// runFull runs args with the nftpolicy binary and returns its exit status.
func runFull(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	path, err := exec.LookPath(fullBinary)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl-nftpolicy: %s needs the %s binary on PATH (a Linux build: it evaluates policies with the agent's compiler): %v\n",
			args[0], fullBinary, err)
		return cli.ExitBadInput
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return cli.ExitOK
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	}
	fmt.Fprintf(stderr, "kubectl-nftpolicy: %s: %v\n", path, err)
	return cli.ExitFailure
}
