package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBudgetFlagsRefuseNonPositive: a zero, negative or malformed cost
// budget is bad input (exit 2, the flag named), not a silent return to the
// default.
func TestBudgetFlagsRefuseNonPositive(t *testing.T) {
	scenario := "../../pkg/compile/testdata/golden/deny-and-allow.yaml"
	for _, arg := range []string{"--policy-cost-budget=0", "--namespace-cost-budget=-5", "--cluster-policy-cost-budget=x"} {
		var stdout, stderr bytes.Buffer
		code := runExplain([]string{arg, "--scenario", scenario, "y/client", "x/web"}, &stdout, &stderr)
		flag := strings.SplitN(strings.TrimPrefix(arg, "--"), "=", 2)[0]
		if code != 2 || !strings.Contains(stderr.String(), flag) {
			t.Errorf("%s: exit %d, stderr %q; want 2 naming %s", arg, code, stderr.String(), flag)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := runExplain([]string{"--policy-cost-budget=5000", "--scenario", scenario, "y/client", "x/web"}, &stdout, &stderr); code == 2 {
		t.Errorf("a positive budget refused: %s", stderr.String())
	}
}
