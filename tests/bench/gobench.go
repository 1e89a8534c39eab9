package bench

import (
	"math"
	"regexp"
	"strconv"
	"strings"
)

// GoBench holds `go test -bench` results: benchmark name (without the
// -GOMAXPROCS suffix) -> unit -> one value per run (-count).
type GoBench map[string]map[string][]float64

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

// ParseGoBench reads the output of `go test -bench`; other lines are ignored.
func ParseGoBench(text string) GoBench {
	out := GoBench{}
	for _, line := range strings.Split(text, "\n") {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if out[m[1]] == nil {
				out[m[1]] = map[string][]float64{}
			}
			out[m[1]][f[i+1]] = append(out[m[1]][f[i+1]], v)
		}
	}
	return out
}

// median of a benchmark's unit over its runs; NaN when absent.
func (g GoBench) median(name, unit string) float64 { return Median(g[name][unit]) }

func (g GoBench) min(name, unit string) float64 {
	vs := g[name][unit]
	if len(vs) == 0 {
		return math.NaN()
	}
	m := vs[0]
	for _, v := range vs {
		m = math.Min(m, v)
	}
	return m
}

// Results maps the benchmarks hack/bench.sh runs to name=value lines:
//
//	eval_ns, eval_ns_min                     BenchmarkEvaluate/policies=10000 (median, min over -count)
//	eval_hot_ns, eval_worst_ns               BenchmarkEvaluateHot/Worst at 10000 policies
//	except_compile_ms_16000                  BenchmarkExceptCompile/excepts=16000 (median)
//	compile_cmd_ms_16000_except              BenchmarkCompileCommand/excepts=16000 (median)
//	sync_<backend>_<kind>_ms_<pods>          BenchmarkSync: build+render+transaction per sync
//	sync_<backend>_<kind>_{build,render,tx}_ms_<pods>, ..._ops_<pods>
//
// with <kind> full, incr (one remote pod: full build and diff) or
// incr_local, pods or pods_local (the same change through the incremental
// compiler, the agent's path), pods_new_chain (a local pod that creates,
// then deletes, its policy's chains), <pods> 1k, 10k, 100k.
func (g GoBench) Results() *Result {
	r := &Result{}
	const ev = "BenchmarkEvaluate/policies=10000"
	if _, ok := g[ev]; ok {
		r.Set("eval_ns", round(g.median(ev, "ns/op"), 1))
		r.Set("eval_ns_min", round(g.min(ev, "ns/op"), 1))
		r.Set("eval_runs", len(g[ev]["ns/op"]))
	}
	if _, ok := g["BenchmarkEvaluateHot/policies=10000"]; ok {
		r.Set("eval_hot_ns", round(g.median("BenchmarkEvaluateHot/policies=10000", "ns/op"), 1))
	}
	if _, ok := g["BenchmarkEvaluateWorst/policies=10000"]; ok {
		r.Set("eval_worst_ns", round(g.median("BenchmarkEvaluateWorst/policies=10000", "ns/op"), 1))
	}
	if _, ok := g["BenchmarkExceptCompile/excepts=16000"]; ok {
		r.Set("except_compile_ms_16000", round(g.median("BenchmarkExceptCompile/excepts=16000", "ns/op")/1e6, 1))
	}
	if _, ok := g["BenchmarkCompileCommand/excepts=16000"]; ok {
		r.Set("compile_cmd_ms_16000_except", round(g.median("BenchmarkCompileCommand/excepts=16000", "ns/op")/1e6, 1))
	}
	kinds := [][2]string{{"full", "full"}, {"incremental-remote", "incr"}, {"incremental-local", "incr_local"},
		{"pods-remote", "pods"}, {"pods-local", "pods_local"}, {"pods-new-chain", "pods_new_chain"}}
	for _, backend := range []string{"fake", "kernel"} {
		for _, pods := range []int{1000, 10000, 100000} {
			for _, kk := range kinds {
				k, short := kk[0], kk[1]
				name := "BenchmarkSync/" + backend + "/pods=" + strconv.Itoa(pods) + "/" + k
				if _, ok := g[name]; !ok {
					continue
				}
				p := "sync_" + backend + "_" + short
				sz := "_" + sizeName(pods)
				r.Set(p+"_ms"+sz, round(g.median(name, "total-ms"), 2))
				r.Set(p+"_build_ms"+sz, round(g.median(name, "build-ms"), 2))
				r.Set(p+"_render_ms"+sz, round(g.median(name, "render-ms"), 2))
				r.Set(p+"_tx_ms"+sz, round(g.median(name, "tx-ms"), 2))
				if v := g.median(name, "tx-cpu-ms"); !math.IsNaN(v) {
					r.Set(p+"_tx_cpu_ms"+sz, round(v, 2))
				}
				r.Set(p+"_ops"+sz, g.median(name, "tx-ops"))
				r.Set("sync_set_elements"+sz, g.median(name, "set-elements"))
			}
		}
	}
	return r
}
