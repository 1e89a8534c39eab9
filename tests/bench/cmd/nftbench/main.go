// Command nftbench runs nftpolicy's benchmarks that need more than `go test
// -bench`: real connections through enforcing network namespaces, a real
// API server with tens of thousands of pods and a real agent process. Each
// subcommand prints name=value lines on stdout (progress goes to stderr);
// `report` turns the collected lines into the markdown table of
// docs/performance.md. hack/bench.sh drives it.
//
//	nftbench conn  [--rounds N] [--duration D] [--max-conns N] [--workers N] [--reply] [--client-in-process]
//	nftbench scale [--pods 1000,10000,50000,100000,150000] [--policies 1000] [--local-pods 4] [--policy-scale 10000:100]
//	nftbench delay [--cycles 5] [--interval 2ms] [--mode hybrid]
//	nftbench faults [--repeats 20] [--interval 2ms] [--outage 5m] [--relist-pods 50000]
//	nftbench churn [--pods 5000] [--policies 1000] [--peers 200] [--interval 100ms] [--changes 20]
//	nftbench newpod [--pods 200] [--informer-delay 30ms] [--revocations 20]
//	nftbench queueflood [--rounds 3]
//	nftbench dns   [--lookups 1000] [--conns 100]
//	nftbench revoke [--entries 200000]
//	nftbench metricsauth [--sources 300]
//	nftbench costamp [--pods 20000] [--policies 1000] [--peers 2300] [--runs 5]
//	nftbench stagedlag [--conns 200]
//	nftbench status [--nodes 1000] [--policies 100] [--changes 16] [--runs 9] [--burst 10] [--burst-window 50ms] [--wait-rounds 20] [--admin-writes]
//	nftbench contention [--name N] [--duration D]   (contention, cpu_speed and wakeup_rtt_us lines)
//	nftbench gobench [FILE...]   (go test -bench output -> name=value lines)
//	nftbench report [--quick] FILE...
//	nftbench chart FILE...       (the scale section's lines -> SVG chart)
//	nftbench comparechart FILE... (hack/compare.sh's lines -> SVG chart of connection rate and latency)
//
// It needs root; it creates its own network namespaces (prefixes npb*, npc*)
// and never touches the caller's namespace.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/status"

	"github.com/nftpolicy/nftpolicy/tests/bench"
)

// readResults merges the name=value lines of files; it exits on a read error.
func readResults(files []string) *bench.Result {
	all := &bench.Result{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		all.Merge(bench.ParseLines(string(data)))
	}
	return all
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: nftbench conn|scale|delay|faults|churn|newpod|queueflood|dns|revoke|metricsauth|costamp|stagedlag|status|fanout|podsource|restart|contention|gobench|report|chart|comparechart [flags]")
	os.Exit(2)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[nftbench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	if os.Getenv(bench.ConnClientEnv) != "" {
		// conn's client process (bench.ConnConfig.ClientExec).
		os.Exit(bench.ConnClientMain(os.Args[1:]))
	}
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process to the file")
	defer func() {
		if *cpuprofile != "" {
			pprof.StopCPUProfile()
		}
	}()
	startProfile := func() {
		if *cpuprofile == "" {
			return
		}
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var (
		res *bench.Result
		err error
	)
	start := time.Now()
	switch cmd {
	case "conn":
		var c bench.ConnConfig
		fs.IntVar(&c.Rounds, "rounds", 40, "interleaved rounds (each measures every mode on both paths)")
		fs.DurationVar(&c.Duration, "duration", 150*time.Millisecond, "time bound of one measurement")
		fs.IntVar(&c.MaxConns, "max-conns", 50000, "connection bound of one measurement")
		fs.IntVar(&c.Workers, "workers", 1, "client threads, one connection in flight each")
		fs.DurationVar(&c.Timeout, "timeout", time.Second, "bound of one connection")
		fs.BoolVar(&c.Reply, "reply", false, "the server's threads wait in accept and answer each connection with a byte the client reads (the older method: their wake-up is timed inside connect)")
		modes := fs.String("modes", "control,conntrack,hybrid,hybrid_nosv,hybrid_denylog,hybrid_cnp,hybrid_staged,hybrid_staged_other,hybrid_verify1pct,queue", "modes to measure (control is always measured)")
		inProcess := fs.Bool("client-in-process", false, "run the client threads in this process, beside the in-process agents' queue readers (the older method), instead of a client process of their own")
		_ = fs.Parse(args)
		c.Modes = strings.Split(*modes, ",")
		if !*inProcess {
			if c.ClientExec, err = os.Executable(); err != nil {
				logf("conn: %v", err)
				os.Exit(1)
			}
		}
		c.Logf = logf
		startProfile()
		res, err = bench.RunConn(ctx, c)
	case "scale":
		var c bench.ScaleConfig
		var pods string
		fs.StringVar(&pods, "pods", "1000,10000,50000,100000,150000", "pod counts in the API, comma-separated, increasing")
		fs.IntVar(&c.Policies, "policies", 1000, "NetworkPolicies in the API")
		fs.IntVar(&c.LocalPods, "local-pods", 4, "pods on the agent's node")
		fs.IntVar(&c.Incremental, "incremental", 10, "one-pod label changes timed per size")
		fs.DurationVar(&c.Settle, "settle", 10*time.Second, "idle time over which RSS and CPU are read")
		fs.IntVar(&c.Parallel, "parallel", 48, "concurrent API writes while creating pods")
		fs.StringVar(&c.HeapProfile, "heapprofile", "", "after the last size, run the agent's controller in this process and write its heap profile here")
		fs.StringVar(&c.StartupCPUProfile, "startup-cpuprofile", "", "after the last size, run the agent's controller in this process and write a CPU profile of its start (to the first committed sync) here")
		policyScale := fs.String("policy-scale", "", "after the last size, over its pods: NETWORKPOLICIES:CLUSTERNETWORKPOLICIES (10000:100) replacing --policies; times the first sync, one NetworkPolicy change and one pod change")
		_ = fs.Parse(args)
		var perr error
		if c.PolicyScale, perr = bench.ParsePolicyScale(*policyScale); perr != nil {
			fmt.Fprintf(os.Stderr, "--policy-scale: %v\n", perr)
			os.Exit(2)
		}
		for _, s := range strings.Split(pods, ",") {
			n, perr := strconv.Atoi(strings.TrimSpace(s))
			if perr != nil {
				fmt.Fprintf(os.Stderr, "--pods: %v\n", perr)
				os.Exit(2)
			}
			c.Pods = append(c.Pods, n)
		}
		c.Logf = logf
		startProfile()
		res, err = bench.RunScale(ctx, c)
	case "delay":
		var c bench.DelayConfig
		fs.IntVar(&c.Cycles, "cycles", 5, "cycles of 5 changes (policy create, update x2, delete, new pod)")
		fs.DurationVar(&c.Interval, "interval", 2*time.Millisecond, "time between probes")
		fs.StringVar(&c.Mode, "mode", "hybrid", "agent mode")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunDelay(ctx, c)
	case "faults":
		var c bench.FaultsConfig
		fs.IntVar(&c.Repeats, "repeats", 20, "times each outside change is made")
		fs.DurationVar(&c.Interval, "interval", 2*time.Millisecond, "time between connections during a repair")
		var cp bench.ControlPlaneConfig
		fs.DurationVar(&cp.Outage, "outage", 5*time.Minute, "how long the API server is stopped (0: no control plane measurements)")
		fs.IntVar(&cp.Pods, "relist-pods", 50000, "pods in the API for the control plane measurements (the relist's size)")
		_ = fs.Parse(args)
		c.Logf, cp.Logf = logf, logf
		res, err = bench.RunFaults(ctx, c)
		if err == nil && cp.Outage > 0 {
			var more *bench.Result
			if more, err = bench.RunControlPlane(ctx, cp); err == nil {
				res.Merge(more)
			}
		}
	case "churn":
		var c bench.ChurnConfig
		fs.IntVar(&c.Pods, "pods", 5000, "pods in the API, on fake nodes")
		fs.IntVar(&c.Policies, "policies", 1000, "NetworkPolicies in the API besides the churning one")
		fs.IntVar(&c.Peers, "peers", 200, "peers of the churning policy, each selecting every pod")
		fs.DurationVar(&c.Interval, "interval", 100*time.Millisecond, "time between two edits of the churning policy")
		fs.IntVar(&c.Changes, "changes", 20, "another namespace's new policies timed, without the churn and then with it")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunChurn(ctx, c)
	case "newpod":
		var c bench.NewPodConfig
		fs.IntVar(&c.Pods, "pods", 200, "new pods created one after another, each connecting the moment its interface is up")
		fs.DurationVar(&c.InformerDelay, "informer-delay", 30*time.Millisecond, "how long after a pod is up the agents learn it")
		fs.IntVar(&c.Revocations, "revocations", 20, "established clients cut by a label change, one per change")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunNewPod(ctx, c)
	case "queueflood":
		var c bench.QueueFloodConfig
		fs.IntVar(&c.Rounds, "rounds", 3, "floods per fail mode (each 4.5 s, 10 new pods)")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunQueueFlood(ctx, c)
	case "dns":
		var c bench.DNSConfig
		fs.IntVar(&c.Lookups, "lookups", 1000, "UDP lookups timed")
		fs.IntVar(&c.Conns, "conns", 100, "connections to a learned address afterwards (none may be queued)")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunDNS(ctx, c)
	case "revoke":
		var c bench.RevokeConfig
		fs.IntVar(&c.Entries, "entries", 200000, "conntrack entries one revocation pass reads")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunRevoke(ctx, c)
	case "metricsauth":
		var c bench.MetricsAuthConfig
		fs.IntVar(&c.Sources, "sources", 300, "addresses that send a made-up token each before the valid scrape")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunMetricsAuth(ctx, c)
	case "costamp":
		var c bench.CostAmpConfig
		fs.IntVar(&c.Pods, "pods", 20000, "pods in the cluster")
		fs.IntVar(&c.Policies, "policies", 1000, "the cluster's other NetworkPolicies")
		fs.IntVar(&c.Peers, "peers", 2300, "peers of the attacking policy, each selecting every pod")
		fs.IntVar(&c.Runs, "runs", 5, "builds timed with and without the attacking policy")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunCostAmp(c)
	case "stagedlag":
		var c bench.StagedLagConfig
		fs.IntVar(&c.Conns, "conns", 200, "connections timed per path (same node, across nodes), one at a time")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunStagedLag(ctx, c)
	case "fanout":
		var c bench.FanoutConfig
		var agents string
		fs.StringVar(&agents, "agents", "100,250,500,1000", "numbers of simulated clients (agents, then kube-proxies), comma-separated, increasing")
		fs.IntVar(&c.Pods, "pods", 200, "pods while the changes are timed (every simulated agent reads them all)")
		fs.IntVar(&c.SliceSize, "slice-size", 50, "pods per Deployment: endpoints per EndpointSlice")
		fs.IntVar(&c.Changes, "changes", 100, "changes timed at each number of clients")
		fs.IntVar(&c.StartPods, "start-pods", 10000, "pods when the clients' starts are timed (extrapolated to 150,000)")
		fs.IntVar(&c.StartAgents, "start-agents", 5, "client starts timed, one after the other")
		fs.IntVar(&c.Nodes, "nodes", 0, "Node objects (0: start-pods/30, the density of 150,000 pods on 5,000 nodes)")
		fs.DurationVar(&c.Idle, "idle", 3*time.Second, "idle time over which the API server's own CPU is read at each number of clients")
		_ = fs.Parse(args)
		for _, s := range strings.Split(agents, ",") {
			n, perr := strconv.Atoi(strings.TrimSpace(s))
			if perr != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "nftbench fanout: --agents %q: want positive integers\n", agents)
				os.Exit(2)
			}
			c.Agents = append(c.Agents, n)
		}
		c.Logf = logf
		startProfile()
		res, err = bench.RunFanout(ctx, c)
	case "podsource":
		var c bench.PodSourceConfig
		fs.IntVar(&c.Pods, "pods", 3000, "pods (the fanout section's shape), in Deployments of --slice-size")
		fs.IntVar(&c.Nodes, "nodes", 100, "nodes the pods are spread over (the agent is on the first)")
		fs.IntVar(&c.SliceSize, "slice-size", 50, "pods per Deployment: pods per PodAddressSlice")
		fs.IntVar(&c.Starts, "starts", 3, "starts timed per source (the median is printed)")
		fs.IntVar(&c.RemoteChanges, "remote-changes", 20, "remote pod changes timed per source on a lab of two nodes (0: none)")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunPodSource(ctx, c)
	case "status":
		var c bench.StatusConfig
		fs.IntVar(&c.Nodes, "nodes", 1000, "simulated nodes: an agent pod and a status.Reporter each")
		fs.IntVar(&c.Policies, "policies", 100, "NetworkPolicies the client evaluates")
		fs.IntVar(&c.Runs, "runs", 9, "timed runs of Gather + Evaluate")
		fs.IntVar(&c.Changes, "changes", status.MaxChanges, "policy changes each node reports (its last ones; at most status.MaxChanges)")
		fs.IntVar(&c.Burst, "burst", 10, "policy changes of the burst, reaching every node")
		fs.DurationVar(&c.BurstWindow, "burst-window", 50*time.Millisecond, "time over which the burst's changes reach the nodes")
		fs.IntVar(&c.WaitRounds, "wait-rounds", 20, "policy create -> status.Wait rounds with two real agents (0: none)")
		fs.BoolVar(&c.AdminWrites, "admin-writes", false, "the simulated agents write as an admin (exempt from API Priority and Fairness) instead of install.yaml's ServiceAccount")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunStatus(ctx, c)
	case "restart":
		var c bench.RestartConfig
		fs.IntVar(&c.Restarts, "restarts", 5, "SIGKILLs of the agent (queue mode), each under its own load")
		fs.DurationVar(&c.Interval, "interval", 5*time.Millisecond, "time between connections of each client")
		fs.DurationVar(&c.Load, "load", 2*time.Second, "length of each load")
		_ = fs.Parse(args)
		c.Logf = logf
		startProfile()
		res, err = bench.RunRestart(ctx, c)
	case "contention":
		// wall/CPU of a fixed CPU-bound loop: how much of a CPU this machine
		// gives; the CPU's speed (MiB of SHA-256 per CPU-second); and the
		// cost of waking a thread (a pipe round trip between two threads)
		name := fs.String("name", "contention", "name of the value")
		d := fs.Duration("duration", time.Second, "length of the loop")
		_ = fs.Parse(args)
		ratio, speed := bench.Contention(*d)
		fmt.Printf("%s=%s\n", *name, bench.FormatFloat(ratio))
		// contention_<section> -> cpu_speed_<section>
		fmt.Printf("cpu_speed_%s=%s\n", strings.TrimPrefix(*name, "contention_"), bench.FormatFloat(speed))
		// and the median round trip between two threads over pipes
		wake, err := bench.WakeupRoundTrip(5000)
		if err != nil {
			fmt.Fprintf(os.Stderr, "nftbench contention: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("wakeup_rtt_us_%s=%s\n", strings.TrimPrefix(*name, "contention_"), bench.FormatFloat(wake))
		return
	case "gobench":
		// go test -bench output (files, or stdin) -> name=value lines
		_ = fs.Parse(args)
		var text []byte
		if fs.NArg() == 0 {
			text, err = io.ReadAll(os.Stdin)
		}
		for _, f := range fs.Args() {
			data, rerr := os.ReadFile(f)
			if rerr != nil {
				err = rerr
			}
			text = append(text, data...)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(bench.ParseGoBench(string(text)).Results().Lines())
		return
	case "chart", "comparechart":
		_ = fs.Parse(args)
		draw := bench.ScaleChart
		if cmd == "comparechart" {
			draw = bench.CompareChart
		}
		svg, cerr := draw(readResults(fs.Args()))
		if cerr != nil {
			fmt.Fprintln(os.Stderr, cerr)
			os.Exit(1)
		}
		fmt.Print(svg)
		return
	case "report":
		quick := fs.Bool("quick", false, "the results come from bench-quick")
		_ = fs.Parse(args)
		fmt.Print(bench.Report(readResults(fs.Args()), *quick))
		return
	default:
		usage()
	}
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
		*cpuprofile = ""
	}
	if err != nil {
		logf("%s failed after %v: %v", cmd, time.Since(start).Round(time.Millisecond), err)
		if res != nil {
			// What was measured before the failure (scale keeps it).
			fmt.Print(res.Lines())
		}
		os.Exit(1)
	}
	res.Set(cmd+"_wall_s", time.Since(start).Round(100*time.Millisecond).Seconds())
	fmt.Print(res.Lines())
}
