package evaluate_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	. "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// TestEvaluateAllocs checks that deciding a connection allocates nothing,
// whatever the verdict and whichever side decides it.
func TestEvaluateAllocs(t *testing.T) {
	g := GridState{Pods: []string{"x/a", "x/b", "x/c", "y/a", "y/b"}}
	prog := compile.Build(g.Input(List(
		NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress()),
		NetPol("x", "a-ingress", Sel("pod", "a"), Ingress(
			Peers(PodNSPeer(Sel("pod", "b"), Sel(NSName, "y"))).On(NamedPort("serve-80-tcp", "")),
			Peers(IPPeer("192.0.2.0/24", "192.0.2.128/25")).On(PortRange(80, 90, "")))),
		NetPol("x", "b-egress", Sel("pod", "b"), Types(PEg), Egress(
			Peers(NSPeer(Sel(NSName, "y"))).On(NamedPort("serve-81-tcp", ""), Port(53, "UDP")),
			Peers(IPPeer("198.51.100.0/24")))),
	), nil))
	ext := netip.MustParseAddr("192.0.2.7")
	var ev evaluate.Evaluator
	ev.Swap(prog)
	for _, c := range []struct {
		name     string
		src, dst netip.Addr
		port     uint16
		want     evaluate.Verdict
	}{
		{"ingress allowed by named port", GridIP("y/b"), GridIP("x/a"), 80, evaluate.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"ingress allowed by ipBlock", ext, GridIP("x/a"), 85, evaluate.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"ingress denied", GridIP("y/a"), GridIP("x/a"), 80, evaluate.Verdict{Ingress: false, Egress: true}},
		{"egress allowed", GridIP("x/b"), GridIP("y/a"), 81, evaluate.Verdict{Allowed: true, Ingress: true, Egress: true}},
		{"egress denied", GridIP("x/b"), GridIP("y/a"), 80, evaluate.Verdict{Ingress: true, Egress: false}},
		{"egress denied to an external host", GridIP("x/c"), ext, 80, evaluate.Verdict{Ingress: true, Egress: false}},
		{"not isolated", GridIP("y/a"), GridIP("y/b"), 80, evaluate.Verdict{Allowed: true, Ingress: true, Egress: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var v evaluate.Verdict
			if n := testing.AllocsPerRun(1000, func() { v = evaluate.Evaluate(prog, c.src, c.dst, TCP, c.port) }); n != 0 {
				t.Errorf("Evaluate: %v allocs per run, want 0", n)
			}
			if v.Allowed != c.want.Allowed || v.Ingress != c.want.Ingress || v.Egress != c.want.Egress {
				t.Errorf("verdict allowed=%v ingress=%v egress=%v, want %v %v %v: %s",
					v.Allowed, v.Ingress, v.Egress, c.want.Allowed, c.want.Ingress, c.want.Egress, v.Reason())
			}
			conn := evaluate.Conn{Src: c.src, Dst: c.dst, Proto: TCP, Port: c.port}
			var ok bool
			if n := testing.AllocsPerRun(1000, func() { ok, _ = ev.Decide(conn) }); n != 0 {
				t.Errorf("Evaluator.Decide: %v allocs per run, want 0", n)
			}
			if ok != c.want.Allowed {
				t.Errorf("Evaluator.Decide: %v, want %v", ok, c.want.Allowed)
			}
		})
	}
}

// benchCluster is compiletest's synthetic cluster (see compiletest.Cluster)
// with 10000 pods in 100 namespaces over 50 nodes and nPolicies policies,
// the same objects the compile and sync benchmarks use.
func benchCluster(nPolicies int) compile.Input { return Cluster(10000, nPolicies, 50) }

type benchPair struct {
	src, dst netip.Addr
	port     uint16
}

// benchPairs picks connections between random pods, half of them to pods
// isolated for ingress, on ports that some rules allow.
func benchPairs(prog *compile.Program, n int) []benchPair {
	rng := rand.New(rand.NewPCG(1, 2))
	var isolated []compile.PodID
	for i := range prog.Pods {
		if len(prog.Pods[i].IngressPolicies) > 0 {
			isolated = append(isolated, compile.PodID(i))
		}
	}
	ports := []uint16{8080, 8081, 9090, 8050, 50051, 443}
	out := make([]benchPair, n)
	for i := range out {
		src := &prog.Pods[rng.IntN(len(prog.Pods))]
		dst := &prog.Pods[rng.IntN(len(prog.Pods))]
		if i%2 == 0 && len(isolated) > 0 {
			dst = &prog.Pods[isolated[rng.IntN(len(isolated))]]
		}
		out[i] = benchPair{src.IPs[0], dst.IPs[0], ports[rng.IntN(len(ports))]}
	}
	return out
}

var benchSink evaluate.Verdict

func BenchmarkEvaluate(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			if len(prog.Problems) > 0 {
				b.Fatalf("problems: %v", prog.Problems[0])
			}
			pairs := benchPairs(prog, 4096)
			allowedN := 0
			for _, p := range pairs {
				if evaluate.Evaluate(prog, p.src, p.dst, TCP, p.port).Allowed {
					allowedN++
				}
			}
			evaluateLoop(b, prog, pairs)
			b.ReportMetric(100*float64(allowedN)/float64(len(pairs)), "allowed-%")
		})
	}
}

// BenchmarkEvaluateHot cycles through 16 connections only, so the
// program's parts they touch stay in the CPU caches: the difference from
// BenchmarkEvaluate is the cost of cache misses.
func BenchmarkEvaluateHot(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			pairs := benchPairs(prog, 16)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p := &pairs[i%len(pairs)]
				benchSink = evaluate.Evaluate(prog, p.src, p.dst, TCP, p.port)
			}
		})
	}
}

// BenchmarkEvaluateWorst decides a connection from a pod to the pod selected
// by the most policies that every rule denies, so that every rule, selector
// and port is tried.
func BenchmarkEvaluateWorst(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(benchCluster(n))
			worst := compile.PodID(0)
			for i := range prog.Pods {
				if len(prog.Pods[i].IngressPolicies) > len(prog.Pods[worst].IngressPolicies) {
					worst = compile.PodID(i)
				}
			}
			dst := prog.Pods[worst].IPs[0]
			src := netip.MustParseAddr("192.0.2.1")
			for i := range prog.Pods {
				if v := evaluate.Evaluate(prog, prog.Pods[i].IPs[0], dst, TCP, 8080); !v.Ingress && len(prog.Pods[i].EgressPolicies) == 0 {
					src = prog.Pods[i].IPs[0]
					break
				}
			}
			if evaluate.Evaluate(prog, src, dst, TCP, 8080).Allowed && n > 10 {
				b.Fatal("worst case is allowed")
			}
			b.ReportAllocs()
			for b.Loop() {
				benchSink = evaluate.Evaluate(prog, src, dst, TCP, 8080)
			}
			rules := 0
			for _, id := range prog.Pods[worst].IngressPolicies {
				rules += len(prog.Policies[id].Ingress)
			}
			b.ReportMetric(float64(rules), "rules-tried")
		})
	}
}
