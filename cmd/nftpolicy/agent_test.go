package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
)

// stubProber answers as a kernel with the given features would.
type stubProber struct {
	native, compat bool
	err            error
	asked          int
}

func (p *stubProber) NativeQueue(context.Context) (bool, error) { p.asked++; return p.native, p.err }
func (p *stubProber) CompatQueue(context.Context) (bool, error) { p.asked++; return p.compat, p.err }

// parseAgentFlags returns the agent's options for args, with prober.
func parseAgentFlags(t *testing.T, prober queuerule.QueueProber, args ...string) *agentOptions {
	t.Helper()
	o := &agentOptions{queueProber: prober}
	var stderr strings.Builder
	if _, ok := parseAgentArgs(o, args, &stderr, "usage"); !ok {
		t.Fatal(stderr.String())
	}
	return o
}

// TestAgentFailsWithoutQueueSupport starts the agent in queue mode on a
// kernel (as the prober reports it) with neither queue variant: it must
// stop at startup, before any API or kernel work, saying why.
func TestAgentFailsWithoutQueueSupport(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	// Nothing listens there: the agent must fail before it dials.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &stubProber{}
	o := parseAgentFlags(t, p, "--kubeconfig", kubeconfig, "--hostname-override", "n1", "--mode", "queue",
		"--metrics-bind-address", "", "--health-bind-address", "")
	err := agent(context.Background(), o)
	if !errors.Is(err, queuerule.ErrNoQueueSupport) {
		t.Fatalf("agent() = %v; want an error wrapping ErrNoQueueSupport", err)
	}
	for _, want := range []string{"--queue-variant auto", "neither", "CONFIG_NFT_QUEUE", "NFQUEUE", "--mode hybrid"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not mention %q", err, want)
		}
	}
	if p.asked != 2 {
		t.Errorf("prober asked %d times, want 2 (native, then xt-compat)", p.asked)
	}
}

func TestChooseQueueVariantFlag(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		flag      string
		p         stubProber
		want      compile.QueueVariant
		wantErr   string
		wantAsked bool
	}{
		{flag: "native", want: compile.QueueNative},
		{flag: "xt-compat", want: compile.QueueXTCompat},
		{flag: "auto", p: stubProber{native: true}, want: compile.QueueNative, wantAsked: true},
		{flag: "auto", p: stubProber{compat: true}, want: compile.QueueXTCompat, wantAsked: true},
		{flag: "auto", wantErr: "neither", wantAsked: true},
		{flag: "auto", p: stubProber{err: errors.New("permission denied")}, wantErr: "permission denied", wantAsked: true},
		{flag: "nfqueue", wantErr: "must be auto, native or xt-compat"},
	} {
		got, err := chooseQueueVariant(ctx, tc.flag, &tc.p)
		if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s with %+v: %q, %v; want %q, error containing %q", tc.flag, tc.p, got, err, tc.want, tc.wantErr)
		}
		if (tc.p.asked > 0) != tc.wantAsked {
			t.Errorf("%s: prober asked %d times", tc.flag, tc.p.asked)
		}
	}
}

// TestProfilingFlag checks that Go's profiles are served on the metrics
// address only with --profiling, and /metrics either way.
func TestProfilingFlag(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftpolicy_test_gauge", Help: "test"}))
	for _, tc := range []struct {
		args      []string
		pprofCode int
	}{
		{nil, http.StatusNotFound},
		{[]string{"--profiling"}, http.StatusOK},
	} {
		o := parseAgentFlags(t, &stubProber{}, tc.args...)
		mux := metricsMux(reg, o.profiling)
		for path, want := range map[string]int{
			"/metrics":                  http.StatusOK,
			"/debug/pprof/":             tc.pprofCode,
			"/debug/pprof/heap?debug=1": tc.pprofCode,
		} {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != want {
				t.Errorf("%v: GET %s: %d, want %d", tc.args, path, rec.Code, want)
			}
			if path == "/metrics" && !strings.Contains(rec.Body.String(), "nftpolicy_test_gauge") {
				t.Errorf("%v: /metrics does not serve the registry:\n%s", tc.args, rec.Body.String())
			}
		}
	}
}
