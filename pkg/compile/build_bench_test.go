package compile_test

import (
	"net/netip"

	"fmt"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"runtime"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

func benchInput(nPods, nPolicies int) compile.Input { return compiletest.Cluster(nPods, nPolicies, 50) }

var buildSink *compile.Program

func BenchmarkBuild(b *testing.B) {
	for _, c := range []struct{ pods, policies int }{{10000, 1000}, {50000, 1000}} {
		b.Run(fmt.Sprintf("pods=%d/policies=%d", c.pods, c.policies), func(b *testing.B) {
			in := benchInput(c.pods, c.policies)
			if p := compile.Build(in); len(p.Problems) > 0 {
				b.Fatalf("problems: %v", p.Problems[0])
			}
			// The heap the program keeps alive once built; the input's own
			// objects (labels maps are shared with it) are not counted.
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			prog := compile.Build(in)
			runtime.GC()
			runtime.ReadMemStats(&after)
			retained := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
			runtime.KeepAlive(prog)

			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				buildSink = compile.Build(in)
			}
			b.ReportMetric(retained, "retained-MB")
		})
	}
}

// BenchmarkBuildCached is a rebuild after one pod changed, with the cache
// the agent keeps between syncs.
func BenchmarkBuildCached(b *testing.B) {
	for _, c := range []struct{ pods, policies int }{{10000, 1000}, {50000, 1000}} {
		b.Run(fmt.Sprintf("pods=%d/policies=%d", c.pods, c.policies), func(b *testing.B) {
			in := benchInput(c.pods, c.policies)
			cache := compile.NewCache()
			compile.BuildCached(in, cache)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := in.Pods[i%len(in.Pods)].DeepCopy()
				p.Labels = map[string]string{"app": "changed"}
				in.Pods[i%len(in.Pods)] = p
				compile.BuildCached(in, cache)
			}
		})
	}
}

func TestBuildCachedEqualsBuild(t *testing.T) {
	in := benchInput(2000, 100)
	cache := compile.NewCache()
	compile.BuildCached(in, cache)
	// Change some pods (new objects, as informers deliver), drop one, keep the rest.
	for i := 0; i < len(in.Pods); i += 97 {
		p := in.Pods[i].DeepCopy()
		p.Labels = map[string]string{"app": "app-3", "tier": "db"}
		p.Status.PodIPs = p.Status.PodIPs[:1]
		in.Pods[i] = p
	}
	in.Pods = in.Pods[1:]
	got := compile.BuildCached(in, cache)
	want := compile.Build(in)
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(compile.Program{}), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("cached build differs (-want +got):\n%s", diff)
	}
}
