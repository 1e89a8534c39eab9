package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/config"
)

// The agent runs on the host network: its health and metrics ports are
// reachable from every pod of the node (and beyond, unless a firewall says
// otherwise). Each server therefore bounds what one peer can hold: the time
// a connection may spend sending its request, idling between requests or
// reading the answer, the size of the request's header, and how many
// connections are open at once (limitListener).

// serverConfig bounds one of the agent's HTTP servers.
type serverConfig struct {
	name                                                      string
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
	// maxHeaderBytes is http.Server.MaxHeaderBytes (net/http allows 4 KiB
	// more for the request line).
	maxHeaderBytes int
	limits         connLimits
}

// healthServer answers the kubelet's probes. The kubelet sends its request
// as soon as it is connected, gives up after the probe's timeoutSeconds (1
// s by default) and does not reuse probe connections, so a legitimate
// connection lives well under a second: 2 s for the header and 5 s for the
// whole exchange leave room for a loaded node, and an idle keep-alive
// connection is closed after 5 s. Probes come from the node itself (the
// pod's address is the node's), which has a share of the connections of
// its own (limits.local) that no pod can take: 16 is many times the two
// probes a kubelet has in flight. Remote peers (pods, other hosts) share
// 16, at most 2 each.
var healthServer = serverConfig{
	name:              "health",
	readHeaderTimeout: 2 * time.Second,
	readTimeout:       5 * time.Second,
	writeTimeout:      5 * time.Second,
	idleTimeout:       5 * time.Second,
	maxHeaderBytes:    4 << 10,
	limits:            connLimits{local: 16, remote: 16, perSource: 2},
}

// metricsServer serves /metrics and, with --profiling, /debug/pprof/.
// Prometheus sends its request at once and keeps its connection between
// scrapes (every 15-60 s typically): the idle timeout of 90 s keeps it,
// an idle attacker's connection is closed after 90 s at most and, before
// its first request, after 5 s. The write timeout of 60 s is far past a
// scrape's (Prometheus' scrape_timeout is 10 s by default) and lets
// CPU profiles and traces of up to 59 s through (net/http/pprof refuses
// longer ones). The header holds a bearer token with --metrics-auth
// delegated (a ServiceAccount token is about 1 KiB; OIDC tokens can be
// several): 16 KiB. Connections: 32 from this host (a scraper on the host
// network, or the loopback default), 64 from elsewhere, 4 per address.
var metricsServer = serverConfig{
	name:              "metrics",
	readHeaderTimeout: 5 * time.Second,
	readTimeout:       10 * time.Second,
	writeTimeout:      60 * time.Second,
	idleTimeout:       90 * time.Second,
	maxHeaderBytes:    16 << 10,
	limits:            connLimits{local: 32, remote: 64, perSource: 4},
}

// metricsMaxInFlight bounds concurrent /metrics scrapes (each gathers every
// collector, the nft counters among them); more get 503 at once.
const metricsMaxInFlight = 4

// servingOptions are the flags of the metrics server's protection.
type servingOptions struct {
	metricsAuth string
	certFile    string
	keyFile     string
}

// The values of --metrics-auth (pkg/config validates them).
const (
	metricsAuthNone      = config.MetricsAuthNone
	metricsAuthDelegated = config.MetricsAuthDelegated
)

// healthChecker is what /healthz and /readyz ask (the controller).
type healthChecker interface {
	Healthy(budget time.Duration) bool
	Ready() bool
}

// healthMux serves /healthz (progress within budget) and /readyz (a sync
// committed, and no outside change of the table waiting for its repair).
func healthMux(c healthChecker, budget time.Duration) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Healthy(budget) {
			http.Error(w, fmt.Sprintf("no progress within %v: the sync loop is stuck", budget), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Ready() {
			http.Error(w, "no sync committed yet, or the table is being repaired after an outside change", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// httpMetrics are the servers' own counters.
type httpMetrics struct {
	refused *prometheus.CounterVec
	open    *prometheus.GaugeVec
	auth    *prometheus.CounterVec
}

func newHTTPMetrics(reg prometheus.Registerer) (*httpMetrics, error) {
	m := &httpMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_http_connections_refused_total",
			Help: "Connections to the agent's HTTP servers closed at once because a limit was reached, by server (health, metrics) and limit: local (peers on this host), remote (all other peers) or source (one remote address)."},
			[]string{"server", "limit"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftpolicy_http_open_connections",
			Help: "Open connections of the agent's HTTP servers, by server and peer (local: this host; remote: any other)."},
			[]string{"server", "peer"}),
		auth: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftpolicy_metrics_auth_requests_total",
			Help: "Requests to the metrics server with --metrics-auth=delegated, by result: allowed, unauthenticated (401), forbidden (403), throttled (429: too many token or access reviews from one address) or error (the API server could not be asked)."},
			[]string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.refused, m.open, m.auth} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// startServers starts the metrics and health servers the flags ask for;
// each sends its error, if it fails, to errs.
func (o *agentOptions) startServers(ctx context.Context, reg *prometheus.Registry, health healthChecker, client kubernetes.Interface, node string, errs chan<- error) error {
	log := klog.FromContext(ctx)
	m, err := newHTTPMetrics(reg)
	if err != nil {
		return err
	}
	if o.metricsAddr != "" {
		var h http.Handler = metricsMux(reg, o.profiling)
		var tlsConfig *tls.Config
		if o.serving.metricsAuth == metricsAuthDelegated {
			certs, err := newCertSource(o.serving.certFile, o.serving.keyFile, node, o.nodeIPs, log.WithName("metrics-tls"))
			if err != nil {
				return err
			}
			tlsConfig = serverTLSConfig(certs)
			h = newDelegatedAuth(client, m.auth, log.WithName("metrics-auth")).wrap(h)
		} else if !isLoopbackAddr(o.metricsAddr) {
			log.Info("WARNING: metrics are served without authentication on an address pods may reach; every policy is named there with its counters. Bind them to loopback (the default) or use --metrics-auth=delegated",
				"address", o.metricsAddr, "profiling", o.profiling)
		}
		go func() {
			errs <- wrapErr("metrics server", serveHTTP(ctx, metricsServer, o.metricsAddr, h, tlsConfig, m))
		}()
	}
	if o.healthAddr != "" {
		h := healthMux(health, o.livenessBudget)
		configz, err := configzHandler(o.cfg)
		if err != nil {
			return err
		}
		h.Handle("/configz", configz)
		go func() { errs <- wrapErr("health server", serveHTTP(ctx, healthServer, o.healthAddr, h, nil, m)) }()
	}
	return nil
}

// isLoopbackAddr reports whether a listen address (host:port) is on a
// loopback address only; an empty host is every address.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// serveHTTP serves h on addr, bounded by cfg, over TLS when tlsConfig is
// set, until ctx ends.
func serveHTTP(ctx context.Context, cfg serverConfig, addr string, h http.Handler, tlsConfig *tls.Config, m *httpMetrics) error {
	ln, err := listenRetry(ctx, addr)
	if err != nil {
		return err
	}
	return serveOn(ctx, cfg, ln, h, tlsConfig, m)
}

// serveOn is serveHTTP on a listener, which it closes.
func serveOn(ctx context.Context, cfg serverConfig, ln net.Listener, h http.Handler, tlsConfig *tls.Config, m *httpMetrics) error {
	log := klog.FromContext(ctx).WithName(cfg.name + "-server")
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		// Per-connection errors (bad handshakes, timeouts) are a peer's
		// doing: never at the default verbosity, which a peer could flood.
		ErrorLog: stdlog.New(klogWriter{log.V(4)}, "", 0),
		// HTTP/1.1 only: HTTP/2 multiplexes streams on one connection past
		// the connection limits (and had its rapid-reset floods); neither a
		// probe nor a scrape needs it.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	ln = newLimitListener(ln, cfg.name, cfg.limits, m, log)
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// klogWriter writes net/http's error log lines to a logger (at a
// verbosity).
type klogWriter struct{ log klog.Logger }

func (w klogWriter) Write(p []byte) (int, error) {
	w.log.Info("HTTP server", "msg", string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}

// connLimits caps a listener's open connections. Peers on this host
// (loopback, or connecting from the very address they connect to, as the
// kubelet probing a host-network pod does) count against local; all
// others against remote, and each remote address against perSource. A pod
// cannot connect from the node's address (its handshake's answers would be
// delivered to the node, not to the pod), so it cannot take local's share.
type connLimits struct {
	local, remote, perSource int
}

// limitListener refuses, by closing them at once with a reset, the
// connections past its limits, before net/http spends a goroutine or a
// buffer on them; each refusal is counted and logged at most once a
// minute.
type limitListener struct {
	net.Listener
	limits  connLimits
	refused map[string]prometheus.Counter // by limit
	open    map[bool]prometheus.Gauge     // by local
	log     klog.Logger
	now     func() time.Time

	mu        sync.Mutex
	local     int
	remote    int
	perSource map[netip.Addr]int
	lastLog   time.Time
	unlogged  int
}

// refusalLogEvery is how often a listener logs refusals.
const refusalLogEvery = time.Minute

func newLimitListener(ln net.Listener, server string, limits connLimits, m *httpMetrics, log klog.Logger) *limitListener {
	l := &limitListener{Listener: ln, limits: limits, log: log, now: time.Now, perSource: map[netip.Addr]int{},
		refused: map[string]prometheus.Counter{}, open: map[bool]prometheus.Gauge{}}
	for _, limit := range []string{"local", "remote", "source"} {
		l.refused[limit] = m.refused.WithLabelValues(server, limit)
	}
	l.open[true] = m.open.WithLabelValues(server, "local")
	l.open[false] = m.open.WithLabelValues(server, "remote")
	return l
}

// Accept returns the next connection within the limits.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.admit(c); lc != nil {
			return lc, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset: no state left behind
		}
		_ = c.Close()
	}
}

// peerOf returns c's remote address and whether it is on this host.
func peerOf(c net.Conn) (netip.Addr, bool) {
	remote, local := tcpAddr(c.RemoteAddr()), tcpAddr(c.LocalAddr())
	return remote, remote.IsLoopback() || (remote.IsValid() && remote == local)
}

func tcpAddr(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func (l *limitListener) admit(c net.Conn) net.Conn {
	src, local := peerOf(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	limit := ""
	switch {
	case local:
		if l.local >= l.limits.local {
			limit = "local"
		}
	case l.perSource[src] >= l.limits.perSource:
		limit = "source"
	case l.remote >= l.limits.remote:
		limit = "remote"
	}
	if limit != "" {
		l.refusedLocked(limit, src)
		return nil
	}
	if local {
		l.local++
	} else {
		l.remote++
		l.perSource[src]++
	}
	l.open[local].Inc()
	return &limitedConn{Conn: c, l: l, src: src, local: local}
}

func (l *limitListener) refusedLocked(limit string, src netip.Addr) {
	l.refused[limit].Inc()
	now := l.now()
	if !l.lastLog.IsZero() && now.Sub(l.lastLog) < refusalLogEvery {
		l.unlogged++
		return
	}
	l.log.Info("Connection refused: too many open connections", "limit", limit, "peer", src,
		"limits", fmt.Sprintf("local %d, remote %d, per remote address %d", l.limits.local, l.limits.remote, l.limits.perSource),
		"refusedWithoutLog", l.unlogged)
	l.lastLog, l.unlogged = now, 0
}

func (l *limitListener) release(src netip.Addr, local bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if local {
		l.local--
	} else {
		l.remote--
		if l.perSource[src]--; l.perSource[src] <= 0 {
			delete(l.perSource, src)
		}
	}
	l.open[local].Dec()
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	src   netip.Addr
	local bool
	once  sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src, c.local) })
	return err
}
