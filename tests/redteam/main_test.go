package redteam

import (
	"os"
	"testing"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestMain removes the agent binary that tests of the real agent build
// when NFTPOLICY_BIN does not name one.
func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}
