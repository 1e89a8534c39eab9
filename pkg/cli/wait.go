package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// waitFor maps --for's values to "wait for the deletion": kubectl wait
// spells it delete, nftpolicy's first releases deleted.
var waitFor = map[string]bool{"programmed": false, "delete": true, "deleted": true}

// Wait runs `wait`.
func Wait(args []string, stdout, stderr io.Writer) int {
	var f ClusterFlags
	var forWhat, output string
	exitCode := true
	fs := pflag.NewFlagSet("wait", pflag.ContinueOnError)
	f.Add(fs, "give up after this long (exit 1)")
	fs.StringVar(&forWhat, "for", "programmed", "programmed, or delete (also deleted)")
	fs.StringVarP(&output, "output", "o", "text", "text, json or yaml (json and yaml: the policy's status row)")
	fs.BoolVar(&exitCode, "exit-code", true, "exit 1 on timeout; false: exit 0 (the output still says it timed out)")
	if code, ok := ParseFlags(fs, args, stderr, waitUsage); !ok {
		return code
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "nftpolicy wait: %v\n", err)
		return code
	}
	deleted, okFor := waitFor[forWhat]
	if fs.NArg() != 1 || !okFor || output == "wide" || !outputs[output] {
		return fail(ExitBadInput, errors.New("want one KIND/NAME, --for=programmed or --for=delete, and -o text, json or yaml"))
	}
	c, err := f.Clients()
	if err != nil {
		return fail(ExitBadInput, err)
	}
	ref, err := ParseRef(fs.Arg(0), f.Namespace())
	if err != nil {
		return fail(ExitBadInput, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
	defer cancel()
	row, err := status.Wait(ctx, c, f.Agents, ref, deleted)
	var lag *status.LaggingError
	switch {
	case errors.As(err, &lag):
		fmt.Fprintf(stderr, "nftpolicy wait: %s: timed out after %v: %v\n", ref, f.Timeout, err)
		return FailCode(exitCode)
	case err != nil:
		return fail(resolveErrorCode(err), fmt.Errorf("%s: %w", ref, err))
	}
	if output == "json" || output == "yaml" {
		if err := PrintStructured(stdout, row, output); err != nil {
			return fail(ExitFailure, err)
		}
		return ExitOK
	}
	what := "programmed"
	if deleted {
		what = "deleted"
	}
	fmt.Fprintf(stdout, "%s %s on %d/%d nodes after %v (the agents' change-to-enforced latency: %s)\n",
		ref, what, len(row.Programmed), row.Nodes, time.Since(start).Round(time.Millisecond), latencyText(row.Latency))
	for _, w := range row.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	return ExitOK
}
