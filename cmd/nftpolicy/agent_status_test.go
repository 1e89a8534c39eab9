package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// TestStatusReporterWithoutTheAPI: while the NodeEnforcement API is not
// served, the writes fail and are retried, counted as errors and logged
// once as the missing API; once it is served the write succeeds.
func TestStatusReporterWithoutTheAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	var served atomic.Bool
	for _, verb := range []string{"patch", "create"} {
		dyn.PrependReactor(verb, status.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			if !served.Load() {
				return true, nil, apierrors.NewNotFound(status.GVR.GroupResource(), "")
			}
			return false, nil, nil
		})
	}
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{})
	reg := prometheus.NewRegistry()
	s := newStatusReporter(ctx, "n1", dyn, reg, log)
	s.cfg.RetryDelay = 5 * time.Millisecond
	s.programmed(status.Publication{Watermarks: status.Watermarks{NetworkPolicies: "5"}, At: time.Now()})
	failed := s.writes.WithLabelValues("error")
	for testutil.ToFloat64(failed) < 4 {
		select {
		case <-ctx.Done():
			t.Fatalf("%v failed writes, want retries", testutil.ToFloat64(failed))
		case <-time.After(5 * time.Millisecond):
		}
	}
	served.Store(true)
	for testutil.ToFloat64(s.writes.WithLabelValues("ok")) < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("no write after the API was served")
		case <-time.After(5 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	missing := 0
	for _, l := range lines {
		if strings.Contains(l, "NodeEnforcement API is not served") {
			missing++
		}
	}
	if missing != 1 {
		t.Errorf("the missing API was logged %d times, want once:\n%s", missing, strings.Join(lines, "\n"))
	}
	if n, err := testutil.GatherAndCount(reg, "nftpolicy_status_writes_total"); err != nil || n != 2 {
		t.Errorf("nftpolicy_status_writes_total: %d series (%v), want ok and error", n, err)
	}
}
