//go:build !linux

package evaluate_test

import "time"

// threadCPU is unknown here: cpu-ns/op is not reported.
func threadCPU() time.Duration { return 0 }
