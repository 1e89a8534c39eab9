package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"syscall"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// CostAmpConfig configures RunCostAmp.
type CostAmpConfig struct {
	// Pods in the cluster (default 20,000), Policies the benchmark
	// cluster's other NetworkPolicies (default 1,000), Peers the attacking
	// policy's (default 2,300), Runs the builds timed each way (default 5).
	Pods, Policies, Peers, Runs int
	Logf                        func(format string, args ...any)
}

func (c *CostAmpConfig) defaults() {
	if c.Pods <= 0 {
		c.Pods = 20000
	}
	if c.Policies <= 0 {
		c.Policies = 1000
	}
	if c.Peers <= 0 {
		c.Peers = 2300
	}
	if c.Runs <= 0 {
		c.Runs = 5
	}
}

// RunCostAmp measures what issue 43's cost amplification adds to an
// agent's build: one NetworkPolicy whose Peers peers each select every pod
// (compiletest.CostAmplificationPolicy), among the benchmark cluster's
// policies (compiletest.Cluster). The agent's full build (Tracker.Rebuild:
// Build and Render, hybrid mode, one node's view of all pods) runs in this
// process, Runs times without the policy and Runs times with it,
// alternately; before each, the heap is collected and returned to the OS
// and the peak RSS reset (clear_refs). Figures, at <pods/1000>k pods:
// cost_amp_build_ms_* (the median build time with the policy minus the
// median without), cost_amp_build_cpu_ms_* (the same for the process's
// CPU time, which other work on the machine does not inflate),
// cost_amp_rss_extra_mb_* (the same for the RSS peak
// during the build, above the RSS before it), cost_amp_build_base_ms_*
// (the median without) and cost_amp_charged_* (what the policy was
// charged). It fails when the policy is not rejected.
func RunCostAmp(cfg CostAmpConfig) (*Result, error) {
	cfg.defaults()
	in := compiletest.Cluster(cfg.Pods, cfg.Policies, 10)
	in.NodeName = "node-0"
	attacked := in
	attacked.Policies = append(slices.Clone(in.Policies), compiletest.CostAmplificationPolicy("ns-0001", "amplify", "app-1", cfg.Peers))
	cfg.Logf("costamp: %d pods, %d policies; the attack says %d (MaxPolicyCost %d) and would make %d elements",
		cfg.Pods, len(in.Policies), compile.NetworkPolicyCost(attacked.Policies[len(attacked.Policies)-1]), compile.MaxPolicyCost, cfg.Peers*cfg.Pods)
	tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat})
	if err != nil {
		return nil, err
	}
	type run struct {
		ms, cpuMS, peakMB float64
	}
	build := func(in compile.Input) (run, *compile.Program, error) {
		runtime.GC()
		debug.FreeOSMemory()
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			return run{}, nil, fmt.Errorf("resetting the peak RSS: %w", err)
		}
		before, err := procStatus(os.Getpid())
		if err != nil {
			return run{}, nil, err
		}
		cpu0, start := processCPU(), time.Now()
		prog, _, err := tr.Rebuild(in)
		d, cpu := time.Since(start), processCPU()-cpu0
		if err != nil {
			return run{}, nil, err
		}
		after, err := procStatus(os.Getpid())
		if err != nil {
			return run{}, nil, err
		}
		return run{ms: millis(d), cpuMS: millis(cpu), peakMB: (after["VmHWM"] - before["VmRSS"]) / 1024}, prog, nil
	}
	if _, _, err := build(in); err != nil { // warm: the runtime's own first growth
		return nil, err
	}
	var base, attack []run
	charged := 0
	for i := range cfg.Runs {
		b, _, err := build(in)
		if err != nil {
			return nil, err
		}
		a, prog, err := build(attacked)
		if err != nil {
			return nil, err
		}
		pol := findAttack(prog.Policies)
		if pol == nil || !pol.Rejected {
			return nil, fmt.Errorf("costamp: the attacking policy was not rejected")
		}
		charged = pol.Cost
		cfg.Logf("costamp: run %d: without %.0f ms (CPU %.0f ms), peak +%.1f MiB; with %.0f ms (CPU %.0f ms), peak +%.1f MiB",
			i, b.ms, b.cpuMS, b.peakMB, a.ms, a.cpuMS, a.peakMB)
		base, attack = append(base, b), append(attack, a)
	}
	med := func(rs []run, f func(run) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	ms := func(r run) float64 { return r.ms }
	cpu := func(r run) float64 { return r.cpuMS }
	peak := func(r run) float64 { return r.peakMB }
	sz := fmt.Sprintf("%dk_pods", cfg.Pods/1000)
	res := &Result{}
	res.Set("cost_amp_build_ms_"+sz, round(max(0, med(attack, ms)-med(base, ms)), 1))
	res.Set("cost_amp_build_cpu_ms_"+sz, round(max(0, med(attack, cpu)-med(base, cpu)), 1))
	res.Set("cost_amp_rss_extra_mb_"+sz, round(max(0, med(attack, peak)-med(base, peak)), 1))
	res.Set("cost_amp_build_base_ms_"+sz, round(med(base, ms), 1))
	res.Set("cost_amp_charged_"+sz, float64(charged))
	return res, nil
}

// processCPU is the CPU time this process has used (user and system, all
// threads: the build's and the garbage collector's).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// findAttack returns the attacking policy of RunCostAmp's program.
func findAttack(pols []compile.Policy) *compile.Policy {
	for i := range pols {
		if pols[i].Key == "ns-0001/amplify" {
			return &pols[i]
		}
	}
	return nil
}
