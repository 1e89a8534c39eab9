package redteam

import (
	"os"
	"testing"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// TestMain lets this test binary be the share flood's flooder process
// (lab.ShareFloodConfig.Exec), and removes the agent binary that tests of
// the real agent build when NFTPOLICY_BIN does not name one.
func TestMain(m *testing.M) {
	if os.Getenv(lab.FloodClientEnv) != "" {
		os.Exit(lab.FloodClientMain(os.Args[1:]))
	}
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}
