package main

import (
	"math"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

func TestConfigureVerify(t *testing.T) {
	for _, tc := range []struct {
		rate       float64
		group      uint16
		perMillion uint32
		err        string
	}{
		{rate: 0, group: 102},
		{rate: 0.01, group: 102, perMillion: 10_000},
		{rate: 1, group: 102, perMillion: compile.VerifyPerMillion},
		// A rate too small for the scale samples one in a million, not none.
		{rate: 1e-9, group: 102, perMillion: 1},
		{rate: 1.5, group: 102, err: "a fraction from 0 to 1"},
		{rate: -0.1, group: 102, err: "a fraction from 0 to 1"},
		{rate: math.NaN(), group: 102, err: "a fraction from 0 to 1"},
		{rate: 0.5, group: 0, err: "must not be 0"},
	} {
		o := verifyOptions{rate: tc.rate, group: tc.group, kernelRate: 7}
		var render compile.RenderConfig
		err := o.configureVerify(&render)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("rate %v group %d: error %v, want %q", tc.rate, tc.group, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("rate %v: %v", tc.rate, err)
			continue
		}
		if render.Verify.PerMillion != tc.perMillion || (tc.perMillion != 0 && (render.Verify.Group != tc.group || render.Verify.SourceRate != 7 || render.Verify.SourceBurst != 14)) {
			t.Errorf("rate %v: %+v", tc.rate, render.Verify)
		}
	}
}
