package compile_test

import (
	"fmt"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

var renderSink *compile.Ruleset

// BenchmarkRender is a full render of a built program, configured as the
// agent's hybrid mode (the known-pods sets included) on one node of 50:
// what a full sync spends between Build and the kernel. It reports the
// rendered sets' elements.
func BenchmarkRender(b *testing.B) {
	for _, c := range []struct{ pods, policies int }{{10000, 1000}, {50000, 1000}} {
		b.Run(fmt.Sprintf("pods=%d/policies=%d", c.pods, c.policies), func(b *testing.B) {
			in := benchInput(c.pods, c.policies)
			in.NodeName = "node-0"
			prog := compile.Build(in)
			cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
			b.ReportAllocs()
			for b.Loop() {
				rs, err := compile.Render(prog, cfg)
				if err != nil {
					b.Fatal(err)
				}
				renderSink = rs
			}
			n := 0
			for _, s := range renderSink.Sets {
				n += len(s.Elements)
			}
			b.ReportMetric(float64(n), "set-elements")
		})
	}
}
