package redteam

import (
	"context"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// labTimeout bounds one attack's lab: its set-up, the attack and the
// checks.
const labTimeout = 3 * time.Minute

// requireLab skips (or, under NFTPOLICY_REQUIRE_TOOLS, fails) an attack on
// a machine that cannot build its lab, and returns the attack's context.
func requireLab(t *testing.T) context.Context {
	t.Helper()
	testenv.Require(t, "red-team tests", testenv.Root("create network namespaces, veths, nftables rulesets and conntrack entries"), testenv.Binaries("ip", "nft"))
	ctx, cancel := context.WithTimeout(context.Background(), labTimeout)
	t.Cleanup(cancel)
	return ctx
}

// openFQDNLab starts the lab's FQDN lab (x/a on node-1 with rule
// "web"'s names, the DNS servers on node-2), closed when the test ends.
func openFQDNLab(t *testing.T) (context.Context, *lab.FQDNLab) {
	t.Helper()
	ctx := requireLab(t)
	fl, err := lab.NewFQDNLab(ctx, lab.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fl.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return ctx, fl
}
