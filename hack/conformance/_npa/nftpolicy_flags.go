// This file is added to sigs.k8s.io/network-policy-api/conformance/utils/flags
// (v0.3.0) when hack/conformance/npa-tools.sh builds the suite's test binary
// in a copy of the module. Upstream's entry point has no way to leave tests out
// that the report then counts as skipped: -test.run and -test.skip make
// t.Run return true for the tests they filter, which the report counts as
// passed. These flags feed the suite's own SkipTests option instead, and let a
// cluster whose kernel has no SCTP sockets skip the SCTP probes that other
// tests make, saying so, rather than failing them on a missing protocol.

package flags

import (
	"flag"
	"fmt"
	"regexp"
	"strings"
)

var (
	// SkipTestNames lists tests (by ShortName) not to run; the report counts them as skipped.
	SkipTestNames = flag.String("skip-tests", "", "Comma-separated ShortNames of tests not to run (reported as skipped)")
	// RunTests selects the tests to run by ShortName; the others are skipped (and reported so).
	RunTests = flag.String("run-tests", "", "Regular expression: run only the tests whose ShortName matches, skip the others (reported as skipped)")
	// NoSCTP, when not empty, is why SCTP probes cannot run: each SCTP probe is then skipped and logged with it.
	NoSCTP = flag.String("no-sctp", "", "When set, the reason why SCTP probes cannot run here: every SCTP probe is logged as skipped instead of run")
)

// TestsToSkip returns the ShortNames among all that --skip-tests names or
// that --run-tests does not match. A name in --skip-tests that is not a test
// is an error, so that a typo does not silently run a test meant to be left out.
func TestsToSkip(all []string) ([]string, error) {
	known := make(map[string]bool, len(all))
	for _, n := range all {
		known[n] = true
	}
	skip := map[string]bool{}
	for _, n := range strings.Split(*SkipTestNames, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !known[n] {
			return nil, fmt.Errorf("--skip-tests: no conformance test is named %q", n)
		}
		skip[n] = true
	}
	if *RunTests != "" {
		re, err := regexp.Compile(*RunTests)
		if err != nil {
			return nil, fmt.Errorf("--run-tests: %w", err)
		}
		for _, n := range all {
			if !re.MatchString(n) {
				skip[n] = true
			}
		}
	}
	var out []string
	for _, n := range all {
		if skip[n] {
			out = append(out, n)
		}
	}
	return out, nil
}
