// Command npdiff is the differential tester: for each seed it generates a
// scenario (pkg/scenario/scenariogen), runs it on the real kernel in a
// lab of two nodes (tests/internal/lab) and compares every probe with
// the userspace evaluator's verdict on the cluster-wide program. It prints
// one line per seed and, last, "scenarios=N probes=M disagreements=D"; it
// exits 1 on any disagreement or harness error (2 on bad usage), after
// writing each disagreeing scenario, minimized on the kernel, to
// DIR/npdiff-seed-N.yaml. It needs root. Run it through hack/diff.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/kernel"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func parseSeeds(s string) (uint64, uint64, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	first, err1 := strconv.ParseUint(a, 10, 64)
	last, err2 := strconv.ParseUint(b, 10, 64)
	if err := errors.Join(err1, err2); err != nil || last < first {
		return 0, 0, fmt.Errorf("--seeds %q: want A-B with A <= B (or a single seed)", s)
	}
	return first, last, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("npdiff", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seeds := fs.String("seeds", "1-10", "seed range A-B (inclusive), or one seed")
	mode := fs.String("mode", "hybrid", "enforcement mode: hybrid, queue or kernel")
	variant := fs.String("queue-variant", "", "queue mode: native or xt-compat (default: what the kernel supports)")
	out := fs.String("out", os.TempDir(), "directory for the minimized scenarios (npdiff-seed-N.yaml)")
	timeout := fs.Duration("timeout", lab.DefaultProbeTimeout, "timeout of one probe (a denied probe takes all of it)")
	incremental := fs.Bool("incremental", false, "sync an earlier state of each cluster first (scenariogen.Predecessor), then the scenario incrementally: in hybrid mode as the agent does, the namespace and cluster policy changes rebuilt, then each changed NetworkPolicy and each changed pod on its own through the incremental compiler (compile.Tracker; pod-events and pod-rebuilds count both kinds)")
	noMin := fs.Bool("no-minimize", false, "write disagreeing scenarios as generated")
	verbose := fs.Bool("v", false, "print the minimizer's steps and every disagreement table")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	first, last, err := parseSeeds(*seeds)
	if err == nil {
		_, err = compile.ParseMode(*mode)
	}
	if err != nil {
		fmt.Fprintf(stderr, "npdiff: %v\n", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "npdiff: needs root (network namespaces, nftables, NFQUEUE)")
		return 1
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "npdiff: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg := lab.Config{Mode: compile.Mode(*mode), QueueVariant: compile.QueueVariant(*variant), ProbeTimeout: *timeout}
	var scenarios, probes, disagreements, harnessErrors, podEvents, podRebuilds int
	var total time.Duration
	for seed := first; seed <= last; seed++ {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		res, err := runSeed(ctx, seed, cfg, *out, *incremental, !*noMin, *verbose, stderr)
		took := time.Since(start)
		if err != nil && ctx.Err() != nil {
			fmt.Fprintf(stdout, "seed=%d interrupted\n", seed)
			break
		}
		if err != nil {
			fmt.Fprintf(stdout, "seed=%d error: %v\n", seed, err)
			harnessErrors++
			continue
		}
		scenarios++
		total += took
		probes += res.probes
		disagreements += res.disagreements
		harnessErrors += res.errors
		line := fmt.Sprintf("seed=%d mode=%s pods=%d policies=%d probes=%d allowed=%d disagreements=%d time=%.2fs",
			seed, res.mode, res.pods, res.policies, res.probes, res.allowed, res.disagreements, took.Seconds())
		if res.podEvents+res.podRebuilds > 0 {
			line += fmt.Sprintf(" pod-events=%d pod-rebuilds=%d", res.podEvents, res.podRebuilds)
			podEvents += res.podEvents
			podRebuilds += res.podRebuilds
		}
		if res.errors > 0 {
			line += fmt.Sprintf(" harness-errors=%d", res.errors)
		}
		if res.file != "" {
			line += " minimized=" + res.file
		}
		fmt.Fprintln(stdout, line)
	}
	if scenarios > 0 {
		fmt.Fprintf(stdout, "mean time per seed: %.2fs\n", total.Seconds()/float64(scenarios))
	}
	if harnessErrors > 0 {
		fmt.Fprintf(stdout, "harness-errors=%d\n", harnessErrors)
	}
	if podEvents+podRebuilds > 0 {
		fmt.Fprintf(stdout, "pod-events=%d pod-rebuilds=%d\n", podEvents, podRebuilds)
	}
	fmt.Fprintf(stdout, "scenarios=%d probes=%d disagreements=%d\n", scenarios, probes, disagreements)
	if ctx.Err() != nil {
		return 1
	}
	if disagreements > 0 || harnessErrors > 0 {
		return 1
	}
	return 0
}

type seedResult struct {
	mode                            string
	pods, policies, probes, allowed int
	disagreements, errors           int
	file                            string
	// podEvents and podRebuilds: see lab.Report.
	podEvents, podRebuilds int
}

func runSeed(ctx context.Context, seed uint64, cfg lab.Config, outDir string, incremental, minimize, verbose bool, stderr io.Writer) (_ *seedResult, err error) {
	s := scenariogen.Generate(seed)
	c, err := lab.New(ctx, s, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	var before *scenario.Scenario
	var rep *lab.Report
	if incremental {
		before = scenariogen.Predecessor(seed)
		rep, err = c.CheckPodEvents(ctx, before, s, nil)
	} else {
		rep, err = c.Check(ctx, s, false, nil)
	}
	if err != nil {
		return nil, err
	}
	res := &seedResult{mode: string(rep.Mode), pods: len(s.Pods), policies: len(s.Policies), probes: len(rep.Outcomes)}
	if rep.Variant != "" {
		res.mode += "/" + string(rep.Variant)
	}
	if incremental {
		res.mode += "/incremental"
		for n, r := range rep.Sync {
			if r.Full {
				return nil, fmt.Errorf("the sync of %s after the earlier state was full, not incremental", n)
			}
		}
		res.podEvents, res.podRebuilds = rep.PodEvents, rep.PodRebuilds
	}
	var bad []int
	for _, o := range rep.Outcomes {
		if o.Connected {
			res.allowed++
		}
		if o.Disagrees() {
			bad = append(bad, o.Index)
		}
	}
	res.disagreements = len(bad)
	res.errors = len(rep.Errors())
	if len(bad) == 0 && res.errors == 0 {
		return res, nil
	}
	fmt.Fprintf(stderr, "seed %d:\n%s\n", seed, rep.Table())
	if len(bad) == 0 {
		return res, nil
	}
	final, finalRep := s, rep
	note := fmt.Sprintf("npdiff seed %d, mode %s: %d of %d probes disagree (as generated; not minimized)", seed, res.mode, len(bad), len(s.Probes))
	if minimize {
		var logf func(string, ...any)
		if verbose {
			logf = func(f string, a ...any) { fmt.Fprintf(stderr, "seed %d: "+f+"\n", append([]any{seed}, a...)...) }
		}
		m, err := kernel.Minimize(ctx, c, s, bad, kernel.MinimizeOptions{Before: before, Logf: logf})
		if err != nil {
			fmt.Fprintf(stderr, "seed %d: minimizing: %v (writing the scenario as generated)\n", seed, err)
		} else {
			final, finalRep = m.Scenario, m.Report
			note = fmt.Sprintf("npdiff seed %d, mode %s: minimized on the kernel from %d policies/%d probes to %d/%d in %d steps",
				seed, res.mode, len(s.Policies), len(s.Probes), len(final.Policies), len(final.Probes), m.Steps)
			if verbose {
				fmt.Fprintf(stderr, "seed %d minimized:\n%s\n", seed, finalRep.Table())
			}
		}
	}
	note += "\n\n" + strings.TrimSpace(summary(finalRep))
	data, err := lab.MarshalScenario(final, note)
	if err != nil {
		return nil, err
	}
	res.file = filepath.Join(outDir, fmt.Sprintf("npdiff-seed-%d.yaml", seed))
	if before != nil {
		// The disagreement needs the earlier state synced first.
		bdata, err := lab.MarshalScenario(before, fmt.Sprintf("npdiff seed %d: earlier state, synced fully before %s, which is synced incrementally", seed, filepath.Base(res.file)))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(strings.TrimSuffix(res.file, ".yaml")+".before.yaml", bdata, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(res.file, data, 0o644); err != nil {
		return nil, err
	}
	return res, nil
}

// summary lists the disagreeing probes for the file's header.
func summary(r *lab.Report) string {
	var b strings.Builder
	for _, o := range r.Disagreements() {
		kernelWord, evalWord := "denied", "denied"
		if o.Connected {
			kernelWord = "allowed"
		}
		if o.Want {
			evalWord = "allowed"
		}
		fmt.Fprintf(&b, "probe %d %s -> %s %d/%s: kernel %s, evaluator %s (%s)\n",
			o.Index, o.Probe.From, o.Probe.To, o.Probe.Port, o.Probe.ProbeProtocol(), kernelWord, evalWord, o.WantReason)
	}
	return b.String()
}
