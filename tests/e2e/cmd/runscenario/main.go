// Command runscenario runs a scenario (docs/scenario-format.md) end to end:
// a real kube-apiserver and etcd, the scenario's nodes (or node-1 and
// node-2) as network namespaces with their listed addresses and labels and
// one real `nftpolicy agent` each, its namespaces, pods, NetworkPolicies and
// ClusterNetworkPolicies created through the API, and every probe (pods,
// nodes, external hosts) tried as a real connection once the agents report
// the policies programmed. It prints one JSON line per probe, {"probe":i,"allowed":b},
// and tears everything down. hack/run-scenario.sh builds and runs it.
//
// Exit status: 0 when every probe was decided, 2 for a bad scenario
// (unreadable, invalid, or an object the API server rejects), 1 for any
// other failure: the cluster did not come up, a probe could not be decided
// (its line then carries "error" and allowed false), or the scenario uses
// what the runner cannot simulate (hostNetwork pods, a node's agent ports).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/e2e"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// line is one output line.
type line struct {
	Probe   int    `json:"probe"`
	Allowed bool   `json:"allowed"`
	Error   string `json:"error,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("run-scenario", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", string(compile.ModeHybrid), "agent mode: hybrid or queue (kernel works too)")
	timeout := fs.Duration("timeout", e2e.DefaultProbeTimeout, "first try of a probe; a denied probe takes this long")
	retry := fs.Duration("retry-timeout", e2e.DefaultRetryTimeout, "second try of a probe whose first try timed out (negative: none)")
	deadline := fs.Duration("deadline", 10*time.Minute, "give up after this long")
	verbose := fs.BoolP("verbose", "v", false, "print the harness' progress lines on stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: run-scenario FILE [--mode hybrid|queue] [-v]\n\nPrints one JSON line per probe: {\"probe\":i,\"allowed\":b}. Needs root and hack/tools.sh's binaries.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "run-scenario: %v\n", err)
		return exitBadInput
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitBadInput
	}
	m, err := compile.ParseMode(*mode)
	if err != nil {
		fmt.Fprintf(stderr, "run-scenario: %v\n", err)
		return exitBadInput
	}
	path := fs.Arg(0)
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "run-scenario: reading scenario: %v\n", err)
		return exitBadInput
	}
	s, err := scenario.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "run-scenario: %s: %v\n", path, err)
		return exitBadInput
	}
	if err := e2e.Supported(s); err != nil {
		fmt.Fprintf(stderr, "run-scenario: %s: %v\n", path, err)
		return exitFailure
	}

	// Ctrl-C cancels what is in progress; the cleanups still run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *deadline)
	defer cancel()
	tb := cluster.NewProgramTB("run-scenario")
	tb.Out, tb.Err, tb.Verbose = stderr, stderr, *verbose
	code := exitOK
	err = tb.Run(func(tb *cluster.ProgramTB) {
		out, err := e2e.RunScenario(ctx, tb, s, e2e.RunConfig{Mode: m, Timeout: *timeout, RetryTimeout: *retry, Logf: tb.Logf})
		if err != nil {
			code = exitFailure
			if se := (*scenario.Error)(nil); errors.As(err, &se) {
				code = exitBadInput
			}
			fmt.Fprintf(stderr, "run-scenario: %s: %v\n", path, err)
			return
		}
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		for _, o := range out {
			l := line{Probe: o.Probe, Allowed: o.Allowed}
			if o.Err != nil {
				l.Allowed, l.Error = false, fmt.Sprintf("%v: %v", o.Spec, o.Err)
				code = exitFailure
			}
			if err := enc.Encode(l); err != nil {
				fmt.Fprintf(stderr, "run-scenario: writing: %v\n", err)
				code = exitFailure
				return
			}
		}
	})
	if err != nil {
		fmt.Fprintf(stderr, "run-scenario: %v\n", err)
		if code == exitOK {
			code = exitFailure
		}
	}
	return code
}
