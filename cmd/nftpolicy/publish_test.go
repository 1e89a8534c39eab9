package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestPublishRefusesBadFlags: settings the publisher cannot run with are
// refused before it touches the API (exit 2, the reason named).
func TestPublishRefusesBadFlags(t *testing.T) {
	t.Setenv("POD_NAME", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--identity", "p"}, ""},
		{[]string{}, "no identity"},
		{[]string{"--identity", "p", "--batch-window", "1s"}, "window 1s is not within"},
		{[]string{"--identity", "p", "--batch-window", "-1ms"}, "window -1ms is not within"},
		{[]string{"--identity", "p", "extra"}, "unexpected arguments"},
	} {
		if tc.want == "" {
			o := &publishOptions{}
			if err := publishFlagSet(o).Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			o.cfg.Defaults()
			if err := o.cfg.Validate(); err != nil {
				t.Errorf("%q: %v", tc.args, err)
			}
			continue
		}
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"publish"}, tc.args...), &stdout, &stderr); code != exitBadInput || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want %d and %q", tc.args, code, stderr.String(), exitBadInput, tc.want)
		}
	}
}
