package compile_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

var programSink *compile.Program

// BenchmarkTrackerPodProgram is one pod change through the tracker with
// its program published: the pod deleted, then added back (every pod
// after it renumbered twice), on node-0 of the benchmarks' cluster, with
// the ruleset's element changes and the derived program.
func BenchmarkTrackerPodProgram(b *testing.B) {
	for _, c := range []struct{ pods, policies int }{{10000, 1000}, {150000, 10000}} {
		b.Run(fmt.Sprintf("pods=%d/policies=%d", c.pods, c.policies), func(b *testing.B) {
			in := benchInput(c.pods, c.policies)
			in.NodeName = "node-0"
			tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := tr.Rebuild(in); err != nil {
				b.Fatal(err)
			}
			// A local pod in the middle of the pod list.
			var pod *corev1.Pod
			for _, p := range in.Pods[len(in.Pods)/2:] {
				if p.Spec.NodeName == in.NodeName {
					pod = p
					break
				}
			}
			key := pod.Namespace + "/" + pod.Name
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			n := 0
			for i := 0; b.Loop(); i++ {
				n++
				var p *corev1.Pod
				if i%2 == 1 {
					p = pod
				}
				if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
					b.Fatalf("fallback %s", f)
				}
				programSink = tr.Program()
			}
			// CPU rather than time: the machines the figures come from
			// are shared, and the collector's work counts.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Millisecond)/float64(n), "cpu-ms/op")
		})
	}
}

// processCPU is the CPU time the process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
