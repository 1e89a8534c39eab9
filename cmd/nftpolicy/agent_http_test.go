package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
)

// TestServingFlagDefaults: metrics on loopback unless asked otherwise
// (pods reach every other address of the host network), health on every
// address (the kubelet probes the node's), no authentication by default.
func TestServingFlagDefaults(t *testing.T) {
	o := parseAgentFlags(t, &stubProber{})
	if !isLoopbackAddr(o.metricsAddr) {
		t.Errorf("--metrics-bind-address defaults to %q, which pods can reach; want a loopback address", o.metricsAddr)
	}
	if o.healthAddr != ":9403" {
		t.Errorf("--health-bind-address defaults to %q, want :9403", o.healthAddr)
	}
	if o.serving.metricsAuth != metricsAuthNone {
		t.Errorf("--metrics-auth defaults to %q", o.serving.metricsAuth)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--metrics-auth=delegated"}, ""},
		{[]string{"--metrics-auth=delegated", "--metrics-tls-cert-file=c"}, "or neither"},
		{[]string{"--metrics-tls-cert-file=c", "--metrics-tls-private-key-file=k"}, "need metrics.auth delegated"},
		{[]string{"--metrics-auth=basic"}, `supported values: "none", "delegated"`},
	} {
		var stderr strings.Builder
		_, ok := parseAgentArgs(&agentOptions{}, tc.args, &stderr, "usage")
		if ok != (tc.wantErr == "") || !strings.Contains(stderr.String(), tc.wantErr) {
			t.Errorf("%v: %q, want an error containing %q", tc.args, stderr.String(), tc.wantErr)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:9402": true, "[::1]:9402": true, "localhost:9402": true, ":9402": false, "0.0.0.0:9402": false, "10.0.0.1:9402": false} {
		if got := isLoopbackAddr(addr); got != want {
			t.Errorf("isLoopbackAddr(%q) = %v", addr, got)
		}
	}
}

// fakeConn is a connection with the given addresses.
type fakeConn struct {
	net.Conn
	local, remote net.Addr
	closed        atomic.Int32
}

func (c *fakeConn) LocalAddr() net.Addr  { return c.local }
func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed.Add(1); return nil }

func tcp(s string) *net.TCPAddr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func newTestHTTPMetrics(t *testing.T) *httpMetrics {
	t.Helper()
	m, err := newHTTPMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLimitListenerAdmits checks the three limits and their counters: a
// pod's connections (remote, one address) stop at perSource, all remote
// ones at remote, and the host's own (loopback, or from the address it
// connects to, as the kubelet's probe of a host-network pod) have their
// share, which remote peers cannot take.
func TestLimitListenerAdmits(t *testing.T) {
	m := newTestHTTPMetrics(t)
	l := newLimitListener(nil, "health", connLimits{local: 2, remote: 3, perSource: 2}, m, klog.Background())
	node := "10.0.0.1:9403"
	conn := func(from string) *fakeConn { return &fakeConn{local: tcp(node), remote: tcp(from)} }
	var held []net.Conn
	admit := func(from string, want bool) {
		t.Helper()
		c := l.admit(conn(from))
		if (c != nil) != want {
			t.Fatalf("connection from %s admitted: %v, want %v", from, c != nil, want)
		}
		if c != nil {
			held = append(held, c)
		}
	}
	admit("10.244.1.5:1000", true)
	admit("10.244.1.5:1001", true)
	admit("10.244.1.5:1002", false) // source
	admit("10.244.1.6:1000", true)
	admit("10.244.1.7:1000", false) // remote
	admit("10.0.0.1:5000", true)    // the node itself
	admit("127.0.0.1:5000", true)
	admit("127.0.0.1:5001", false) // local
	refused := func(limit string) float64 {
		return testutil.ToFloat64(m.refused.WithLabelValues("health", limit))
	}
	if refused("source") != 1 || refused("remote") != 1 || refused("local") != 1 {
		t.Errorf("refused: source %v, remote %v, local %v; want 1 each", refused("source"), refused("remote"), refused("local"))
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("health", "remote")); got != 3 {
		t.Errorf("open remote connections: %v, want 3", got)
	}
	// Closing gives the slot back, once however often Close is called.
	held[0].Close()
	held[0].Close()
	admit("10.244.1.7:1000", true)
	admit("10.244.1.8:1000", false)
	for _, c := range held {
		c.Close()
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("health", "remote")); got != 0 || len(l.perSource) != 0 || l.local != 0 {
		t.Errorf("after every close: open %v, per-source entries %d, local %d", got, len(l.perSource), l.local)
	}
}

// TestServerClosesIdleConnections serves the health handler with short
// timeouts: a keep-alive connection left idle after its request, and one
// that never sends, are closed by the server; over the loopback limit,
// connections are refused at once.
func TestServerClosesIdleConnections(t *testing.T) {
	cfg := healthServer
	cfg.readHeaderTimeout, cfg.readTimeout, cfg.writeTimeout, cfg.idleTimeout = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	cfg.limits = connLimits{local: 3, remote: 1, perSource: 1}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := newTestHTTPMetrics(t)
	go func() { done <- serveOn(ctx, cfg, ln, healthMux(fakeHealth{}, time.Second), nil, m) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := ln.Addr().String()

	keepAlive, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer keepAlive.Close()
	fmt.Fprint(keepAlive, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(keepAlive)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	third, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	// The fourth is past the local limit: closed before anything is read.
	// (On loopback the reset may arrive before connect returns.)
	if over, err := net.Dial("tcp", addr); err == nil {
		defer over.Close()
		if err := waitClosed(over, nil, time.Second); err != nil {
			t.Errorf("the connection over the limit: %v", err)
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"idle keep-alive": keepAlive, "silent": silent} {
		var br *bufio.Reader
		if c == keepAlive {
			br = r
		}
		if err := waitClosed(c, br, 2*time.Second); err != nil {
			t.Errorf("the %s connection: %v", name, err)
		}
	}
}

type fakeHealth struct{}

func (fakeHealth) Healthy(time.Duration) bool { return true }
func (fakeHealth) Ready() bool                { return true }

// waitClosed waits until the peer closed c (EOF or reset).
func waitClosed(c net.Conn, r *bufio.Reader, within time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(within))
	var err error
	if r != nil {
		_, err = r.ReadByte()
	} else {
		_, err = c.Read(make([]byte, 1))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("still open after %v", within)
	}
	if err == nil {
		return errors.New("the server sent data")
	}
	return nil
}

// fakeReviews answers TokenReviews (token "good" is user "prometheus",
// "nobody" is user "nobody", anything else unauthenticated) and
// SubjectAccessReviews (prometheus may get /metrics only), counting them.
func fakeReviews() (*fake.Clientset, *atomic.Int32) {
	cl := fake.NewClientset()
	var n atomic.Int32
	cl.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		switch tr.Spec.Token {
		case "good":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "prometheus", Groups: []string{"g"}}}
		case "nobody":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "nobody"}}
		case "broken":
			return true, nil, errors.New("the API server is down")
		}
		return true, tr, nil
	})
	cl.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "prometheus" && na != nil && na.Path == "/metrics" && na.Verb == "get"
		return true, sar, nil
	})
	return cl, &n
}

// TestDelegatedAuth: only a token the API server authenticates, of a user
// it authorizes for the path, gets through; answers are cached; a peer
// making up tokens is throttled after its burst; profiles follow the same
// rule as metrics.
func TestDelegatedAuth(t *testing.T) {
	cl, reviews := fakeReviews()
	m := newTestHTTPMetrics(t)
	reg := prometheus.NewRegistry()
	h := newDelegatedAuth(cl, m.auth, klog.Background()).wrap(metricsMux(reg, true))
	get := func(from, path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, "https://node:9402"+path, nil)
		req.RemoteAddr = from
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "forged", http.StatusUnauthorized},
		{"/metrics", "nobody", http.StatusForbidden},
		{"/debug/pprof/heap", "good", http.StatusForbidden},
		{"/metrics", "good", http.StatusOK},
		{"/metrics", "broken", http.StatusInternalServerError},
	} {
		if got := get("10.244.1.5:1000", tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d", tc.path, tc.token, got, tc.want)
		}
	}
	before := reviews.Load()
	for range 5 {
		if got := get("10.244.1.5:1000", "/metrics", "good"); got != http.StatusOK {
			t.Fatalf("cached: %d", got)
		}
	}
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("%d reviews for a token and path answered before: the cache is not used", n)
	}
	// A peer making up tokens: its burst, then 429; another peer is not
	// affected.
	throttled := 0
	for i := range 3 * authReviewBurst {
		if get("10.244.1.9:1000", "/metrics", fmt.Sprintf("made-up-%d", i)) == http.StatusTooManyRequests {
			throttled++
		}
	}
	if throttled < authReviewBurst {
		t.Errorf("%d of %d made-up tokens throttled; want at least %d", throttled, 3*authReviewBurst, authReviewBurst)
	}
	if got := get("10.244.1.10:1000", "/metrics", "nobody"); got != http.StatusForbidden {
		t.Errorf("another peer while one is throttled: %d, want 403", got)
	}
	if got := testutil.ToFloat64(m.auth.WithLabelValues("throttled")); got != float64(throttled) {
		t.Errorf("throttled counter %v, want %d", got, throttled)
	}
}

// TestMetricsServerTLS serves metrics with delegated authentication over
// a real listener: HTTPS with the self-signed certificate, HTTP/1.1 only,
// and plain HTTP gets nothing.
func TestMetricsServerTLS(t *testing.T) {
	cl, _ := fakeReviews()
	m := newTestHTTPMetrics(t)
	certs, err := newCertSource("", "", "node-1", []string{"10.0.0.1"}, klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h := newDelegatedAuth(cl, m.auth, klog.Background()).wrap(metricsMux(prometheus.NewRegistry(), false))
	go func() { done <- serveOn(ctx, metricsServer, ln, h, serverTLSConfig(certs), m) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}, ForceAttemptHTTP2: true}}
	for token, want := range map[string]int{"": http.StatusUnauthorized, "good": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+ln.Addr().String()+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.ProtoMajor != 1 {
			t.Errorf("token %q: %s %d, want HTTP/1.1 %d", token, resp.Proto, resp.StatusCode, want)
		}
		if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || !strings.Contains(strings.Join(resp.TLS.PeerCertificates[0].DNSNames, ","), "node-1") {
			t.Errorf("certificate: %+v", resp.TLS)
		}
	}
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP: %d", resp.StatusCode)
		}
	}
}
