package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// writeHugeExceptScenario writes a scenario of two pods on node-1 and
// one NetworkPolicy whose ipBlock has n scattered /32 exceptions
// (compiletest.HugeExceptPolicy, the red-team test's attack) and returns
// its path.
func writeHugeExceptScenario(tb testing.TB, n int) string {
	tb.Helper()
	np := compiletest.HugeExceptPolicy("tenant", "huge", "a", n, 80)
	np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
	sc := map[string]any{
		"namespaces": []any{map[string]any{"name": "tenant"}},
		"pods": []any{
			map[string]any{"namespace": "tenant", "name": "a", "labels": map[string]string{"app": "a"}, "ip": "10.244.1.10", "node": "node-1"},
			map[string]any{"namespace": "tenant", "name": "client", "labels": map[string]string{"role": "client"}, "ip": "10.244.1.11", "node": "node-1"},
		},
		"policies": []any{np},
	}
	b, err := json.Marshal(sc)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "huge-except.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// BenchmarkCompileCommand is the whole `nftpolicy compile` command
// (reading the scenario, Build, Render and printing the ruleset) of one
// policy with n scattered /32 exceptions. hack/bench.sh reports the 16,000
// case as compile_cmd_ms_16000_except.
func BenchmarkCompileCommand(b *testing.B) {
	for _, n := range []int{1000, 16000} {
		b.Run(fmt.Sprintf("excepts=%d", n), func(b *testing.B) {
			path := writeHugeExceptScenario(b, n)
			for b.Loop() {
				if code := run([]string{"compile", "--scenario", path, "--node", "node-1"}, io.Discard, io.Discard); code != exitOK {
					b.Fatalf("exit %d", code)
				}
			}
		})
	}
}
