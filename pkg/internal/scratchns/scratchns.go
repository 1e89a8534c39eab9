// Package scratchns gives kernel tests a network namespace of their own, so
// that they never touch the machine's nftables ruleset.
package scratchns

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
)

// New creates a network namespace named after prefix (root only; the test is
// skipped, saying why, without root, nft or ip), deleted when the test ends,
// and returns its name and an open file of it.
func New(t testing.TB, prefix string) (string, *os.File) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test creates a network namespace")
	}
	for _, tool := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	name := fmt.Sprintf("nftpolicy-%s-%d-%d", prefix, os.Getpid(), rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return name, f
}
