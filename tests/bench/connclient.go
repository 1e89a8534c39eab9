package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"
)

// ConnClientEnv, set in a process's environment, makes it the connection
// benchmark's client process: nftbench (and this package's test binary)
// run ConnClientMain instead of their own main when they find it.
const ConnClientEnv = "NFTBENCH_CONN_CLIENT"

// clientWire is one client thread's result as the client process writes it.
type clientWire struct {
	OK, Failed int
	LatNS      []int64
	Reasons    map[string]int `json:",omitempty"`
	Err        string         `json:",omitempty"`
}

// clientRun is what the client process writes: its threads' results and
// the wall time from the first thread's start to the last one's end.
type clientRun struct {
	ElapsedNS int64
	Threads   []clientWire
}

// ConnClientMain runs the connection benchmark's clients in this process
// (the flags say where to and for how long) and writes their results to
// stdout as JSON. It returns the process's exit code.
func ConnClientMain(args []string) int {
	fs := flag.NewFlagSet("conn-client", flag.ContinueOnError)
	ns := fs.String("ns", "", "the client pod's network namespace (a path)")
	dst := fs.String("dst", "", "server address:port")
	duration := fs.Duration("duration", 150*time.Millisecond, "time bound")
	maxConns := fs.Int("max-conns", 50000, "connection bound")
	workers := fs.Int("workers", 1, "client threads")
	timeout := fs.Duration("timeout", time.Second, "bound of one connection")
	reply := fs.Bool("reply", false, "read one byte from the server")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*dst)
	if err != nil || *ns == "" || *workers < 1 {
		fmt.Fprintf(os.Stderr, "conn-client: need --ns, --dst address:port and --workers >= 1 (dst %q: %v)\n", *dst, err)
		return 2
	}
	results := runClients(*ns, ap, *duration, *maxConns, *workers, *timeout, *reply)
	run := clientRun{ElapsedNS: int64(results.elapsed)}
	for _, r := range results.threads {
		w := clientWire{OK: r.ok, Failed: r.failed, Reasons: r.reasons, LatNS: make([]int64, len(r.lat))}
		for i, d := range r.lat {
			w.LatNS[i] = int64(d)
		}
		if r.err != nil {
			w.Err = r.err.Error()
		}
		run.Threads = append(run.Threads, w)
	}
	if err := json.NewEncoder(os.Stdout).Encode(run); err != nil {
		fmt.Fprintf(os.Stderr, "conn-client: %v\n", err)
		return 1
	}
	return 0
}

type clientsResult struct {
	elapsed time.Duration
	threads []clientResult
}

// runClients runs workers client threads against dst until duration has
// passed or maxConns connections were made.
func runClients(nsPath string, dst netip.AddrPort, duration time.Duration, maxConns, workers int, timeout time.Duration, reply bool) clientsResult {
	deadline := time.Now().Add(duration)
	var budget atomic.Int64
	budget.Store(int64(maxConns))
	out := clientsResult{threads: make([]clientResult, workers)}
	var wg sync.WaitGroup
	start := time.Now()
	for w := range out.threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out.threads[w] = runClient(nsPath, dst, deadline, &budget, timeout, maxConns, reply)
		}()
	}
	wg.Wait()
	out.elapsed = time.Since(start)
	return out
}

// execClients runs the clients in a process of their own: exe with
// ConnClientEnv set.
func execClients(exe, nsPath string, dst netip.AddrPort, cfg ConnConfig) (clientsResult, error) {
	cmd := exec.Command(exe,
		"--ns", nsPath, "--dst", dst.String(), "--duration", cfg.Duration.String(),
		fmt.Sprintf("--max-conns=%d", cfg.MaxConns), fmt.Sprintf("--workers=%d", cfg.Workers),
		"--timeout", cfg.Timeout.String(), fmt.Sprintf("--reply=%t", cfg.Reply))
	cmd.Env = append(os.Environ(), ConnClientEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return clientsResult{}, fmt.Errorf("client process: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var run clientRun
	if err := json.Unmarshal(stdout.Bytes(), &run); err != nil {
		return clientsResult{}, fmt.Errorf("client process output: %w", err)
	}
	out := clientsResult{elapsed: time.Duration(run.ElapsedNS)}
	for _, w := range run.Threads {
		r := clientResult{ok: w.OK, failed: w.Failed, reasons: w.Reasons, lat: make([]time.Duration, len(w.LatNS))}
		for i, ns := range w.LatNS {
			r.lat[i] = time.Duration(ns)
		}
		if w.Err != "" {
			r.err = errors.New(w.Err)
		}
		out.threads = append(out.threads, r)
	}
	return out, nil
}
