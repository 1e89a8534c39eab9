package evaluate_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// cnpBenchInput is compiletest's synthetic cluster (10k pods, nPolicies
// NetworkPolicies) with ClusterNetworkPolicies in force on every pod:
//
//   - 50 Admin policies, each denying ingress and egress between all pods
//     and one team's namespaces on a port the traffic does not use, so a
//     connection walks all of them on both sides before anything decides;
//   - an Admin policy passing traffic from env=dev namespaces to port 8080
//     (the pass skips the rest of the Admin tier);
//   - 50 Baseline policies like the Admin ones, and a Baseline policy
//     denying ingress to grpc (named port) from env=dev namespaces, which
//     decides for the pods no NetworkPolicy isolates.
func cnpBenchInput(nPolicies int) compile.Input {
	in := compiletest.Cluster(10000, nPolicies, 50)
	all := compiletest.NamespacesSubject(compiletest.Sel())
	for _, tier := range []string{"Admin", "Baseline"} {
		for i := range 50 {
			team := compiletest.ToNamespaces(compiletest.Sel("team", fmt.Sprintf("t%d", i%10)))
			port := compiletest.Proto("TCP", int32(7000+i))
			in.ClusterPolicies = append(in.ClusterPolicies, compiletest.CNP(fmt.Sprintf("%s-%02d", tier, i), tier, int32(10+i), all,
				compiletest.CNPEgress(compiletest.CNPRule("no-team", "Deny", team).On(port)),
				compiletest.CNPIngress(compiletest.CNPRule("from-team", "Deny", team).On(port))))
		}
	}
	in.ClusterPolicies = append(in.ClusterPolicies, compiletest.DevCNPs()...)
	return in
}

// BenchmarkEvaluateCNP is BenchmarkEvaluate with ClusterNetworkPolicies in
// force on every pod: each side walks the Admin tier before its
// NetworkPolicies, and the Baseline tier when none isolates the pod.
func BenchmarkEvaluateCNP(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			prog := compile.Build(cnpBenchInput(n))
			if len(prog.Problems) > 0 {
				b.Fatalf("problems: %v", prog.Problems[0])
			}
			rng := rand.New(rand.NewPCG(3, 4))
			ports := []uint16{8080, 8081, 9090, 50051, 7003, 443}
			pairs := make([]benchPair, 4096)
			for i := range pairs {
				src, dst := &prog.Pods[rng.IntN(len(prog.Pods))], &prog.Pods[rng.IntN(len(prog.Pods))]
				pairs[i] = benchPair{src.IPs[0], dst.IPs[0], ports[rng.IntN(len(ports))]}
			}
			allowed, byCNP := 0, 0
			for _, p := range pairs {
				v := evaluate.Evaluate(prog, p.src, p.dst, compiletest.TCP, p.port)
				if v.Allowed {
					allowed++
				}
				if strings.Contains(v.Reason(), "ClusterNetworkPolicy") {
					byCNP++
				}
			}
			evaluateLoop(b, prog, pairs)
			b.ReportMetric(100*float64(allowed)/float64(len(pairs)), "allowed-%")
			b.ReportMetric(100*float64(byCNP)/float64(len(pairs)), "cnp-decided-%")
		})
	}
}

// evaluateLoop times Evaluate over the pairs, cycling through them. The
// setup's garbage (a whole build) is collected first, not while the loop
// runs. Besides ns/op (wall clock) it reports cpu-ns/op, the CPU time of
// the loop's thread per verdict, which a loaded machine inflates less.
func evaluateLoop(b *testing.B, prog *compile.Program, pairs []benchPair) {
	runtime.GC()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	start, n := threadCPU(), 0
	for i := 0; b.Loop(); i++ {
		p := &pairs[i%len(pairs)]
		benchSink = evaluate.Evaluate(prog, p.src, p.dst, compiletest.TCP, p.port)
		n++
	}
	if cpu := threadCPU() - start; cpu > 0 && n > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
	}
}
