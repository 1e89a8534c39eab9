// Package testenv decides, in one place, what a test does when something it
// needs from the machine is missing: root, a binary such as nft or ip, or
// the kube-apiserver/etcd/kubectl that hack/tools.sh builds.
//
// By default the test is skipped and the skip message says what is missing
// and how to get it, so that `go test ./...` on a developer machine runs what
// it can. With NFTPOLICY_REQUIRE_TOOLS set to a non-empty value (`make test`
// and CI set it) the same test fails with the same message instead: a run
// that was meant to check everything cannot pass by skipping.
//
// Every suite (tests/kernel, tests/agent, tests/e2e, tests/bench,
// tests/internal/..., and pkg/queue's runtime tests) calls Require. The
// package is not under tests/internal so that tests in pkg/ can import it;
// it imports nothing of nftpolicy and the product must not import it.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireToolsEnv names the environment variable that turns a missing
// prerequisite from a skip into a failure.
const RequireToolsEnv = "NFTPOLICY_REQUIRE_TOOLS"

// Strict reports whether RequireToolsEnv is set: missing prerequisites fail
// tests instead of skipping them.
func Strict() bool { return os.Getenv(RequireToolsEnv) != "" }

// Check looks for one prerequisite and returns why it is missing, or nil.
type Check func() error

// Require runs the checks in order and stops tb at the first one that
// reports a missing prerequisite: with Fatal when Strict, with Skip
// otherwise. who names the suite or helper for the message ("kernel
// tests", "cluster"). It returns only when every check passed.
func Require(tb testing.TB, who string, checks ...Check) {
	tb.Helper()
	for _, c := range checks {
		err := c()
		if err == nil {
			continue
		}
		if Strict() {
			tb.Fatalf("%s: %v (%s is set, so a missing prerequisite is a failure)", who, err, RequireToolsEnv)
		}
		tb.Skipf("%s: skipped: %v (set %s=1 to fail instead of skip)", who, err, RequireToolsEnv)
	}
}

// Root requires an effective user id of 0; why says what needs it.
func Root(why string) Check {
	return func() error {
		if euid := os.Geteuid(); euid != 0 {
			return fmt.Errorf("needs root to %s (running as uid %d)", why, euid)
		}
		return nil
	}
}

// Binaries requires each name to be found in PATH; hack/deps.sh installs
// them on Debian.
func Binaries(names ...string) Check {
	return func() error {
		var missing []string
		var errs []error
		for _, n := range names {
			if _, err := exec.LookPath(n); err != nil {
				missing = append(missing, n)
				errs = append(errs, err)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		return fmt.Errorf("needs %s in PATH (install with: bash hack/deps.sh): %w", strings.Join(missing, ", "), errors.Join(errs...))
	}
}

// Err turns an error found by the caller (a tool lookup, say) into a Check.
func Err(err error) Check { return func() error { return err } }
