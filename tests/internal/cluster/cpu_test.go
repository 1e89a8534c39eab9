package cluster

import (
	"testing"
	"time"
)

func TestParseProcStatCPU(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want time.Duration
		ok   bool
	}{
		// utime 250 and stime 30 ticks; the command name holds a space and ')'.
		{"4242 (a b) c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 30 0 0 20 0 12 0 100 0 0", 2800 * time.Millisecond, true},
		{"1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0", 0, true},
		{"1 (init) S 0 1", 0, false},
		{"1 init S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0", 0, false},
		{"1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 x 0 0 0 20 0 1 0 1 0 0", 0, false},
	} {
		got, err := parseProcStatCPU(tc.stat)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseProcStatCPU(%q) = %v, %v; want %v, ok %v", tc.stat, got, err, tc.want, tc.ok)
		}
	}
}
