package main

import (
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestConfigureVerify: the rate becomes samples per million, at least one
// (pkg/config's TestValidate refuses rates out of 0-1 and group 0).
func TestConfigureVerify(t *testing.T) {
	for _, tc := range []struct {
		rate       float64
		group      uint16
		perMillion uint32
	}{
		{rate: 0, group: 102},
		{rate: 0.01, group: 102, perMillion: 10_000},
		{rate: 1, group: 102, perMillion: compile.VerifyPerMillion},
		// A rate too small for the scale samples one in a million, not none.
		{rate: 1e-9, group: 102, perMillion: 1},
	} {
		o := verifyOptions{rate: tc.rate, group: tc.group, kernelRate: 7}
		var render compile.RenderConfig
		o.configureVerify(&render)
		if render.Verify.PerMillion != tc.perMillion || (tc.perMillion != 0 && (render.Verify.Group != tc.group || render.Verify.SourceRate != 7 || render.Verify.SourceBurst != 14)) {
			t.Errorf("rate %v: %+v", tc.rate, render.Verify)
		}
	}
}
