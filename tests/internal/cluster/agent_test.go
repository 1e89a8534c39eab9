package cluster

import (
	"os/exec"
	"syscall"
	"testing"
)

// TestKilledBy: Stop accepts the peer's exit by SIGTERM's default action
// and nothing else: not another signal, not an exit status.
func TestKilledBy(t *testing.T) {
	for _, tc := range []struct {
		script string
		sig    syscall.Signal
		want   bool
	}{
		{"kill -TERM $$", syscall.SIGTERM, true},
		{"kill -KILL $$", syscall.SIGTERM, false},
		{"exit 143", syscall.SIGTERM, false},
		{"exit 0", syscall.SIGTERM, false},
	} {
		err := exec.Command("sh", "-c", tc.script).Run()
		if got := killedBy(err, tc.sig); got != tc.want {
			t.Errorf("%q (err %v): killedBy %v = %v, want %v", tc.script, err, tc.sig, got, tc.want)
		}
	}
}
