package agent_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// livenessBudget is the agent's --liveness-timeout in this test: short, so
// that lists held a few times longer keep the test short.
const livenessBudget = 3 * time.Second

// TestHealthyWhileListsAreSlow starts the agent against the real API server
// through a proxy that holds every initial list of pods, namespaces and
// NetworkPolicies, as the API server of a large cluster is slow to answer
// them. While the lists are held, longer than the liveness budget several
// times over, /healthz must answer 200 (the agent is making progress: a
// kubelet must not restart it) and /readyz 503 (nothing committed yet).
// Once the lists are answered, both answer 200.
func TestHealthyWhileListsAreSlow(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1"}, NoAgents: true,
		AgentArgs: []string{"--liveness-timeout", livenessBudget.String()}})
	ctx := testContext(t, 3*time.Minute)
	a := c.Agent("node-1")
	p := startListHoldingProxy(t, c, "node-1")
	a.Kubeconfig = p.kubeconfig(t, c)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}

	// Every informer waits for its first list.
	deadline := time.Now().Add(time.Minute)
	for p.held() < 3 {
		if time.Now().After(deadline) || !a.Running() {
			t.Fatalf("the agent did not list pods, namespaces and NetworkPolicies through the proxy (held: %v, running: %v); log tail:\n%s",
				p.heldPaths(), a.Running(), a.LogTail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("lists held: %v", p.heldPaths())
	waitFor := 4 * livenessBudget
	for end := time.Now().Add(waitFor); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		code, body, err := a.Get(ctx, a.HealthAddr, "/healthz")
		if err != nil || code != http.StatusOK {
			t.Fatalf("/healthz while the lists are held: status %d, %q, %v; want 200", code, strings.TrimSpace(body), err)
		}
		if code, err := a.Ready(ctx); err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz while the lists are held: status %d, %v; want 503", code, err)
		}
	}
	if !a.Running() {
		t.Fatalf("the agent exited while the lists were held; log tail:\n%s", a.LogTail(30))
	}

	p.release()
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body, err := a.Get(ctx, a.HealthAddr, "/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz after the first sync: status %d, %q, %v; want 200", code, strings.TrimSpace(body), err)
	}
	t.Logf("lists held for %v (liveness budget %v); the agent stayed healthy and turned ready after they were answered", waitFor, livenessBudget)
}

// listHoldingProxy is a TLS reverse proxy to the API server, listening on
// 127.0.0.1 of a node's namespace, that holds the initial lists the
// agent's informers ask for until release; everything else (later
// watches, the Node lookup, Events) passes at once.
type listHoldingProxy struct {
	srv  *httptest.Server
	gate chan struct{}

	mu    sync.Mutex
	paths []string
	once  sync.Once
}

func startListHoldingProxy(t *testing.T, c *cluster.Cluster, node string) *listHoldingProxy {
	t.Helper()
	target, err := url.Parse(c.Env.Server)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.Env.CAData) {
		t.Fatal("the API server's CA does not parse")
	}
	p := &listHoldingProxy{gate: make(chan struct{})}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true},
		FlushInterval: -1, // watches stream
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isInformerList(r) {
			p.mu.Lock()
			p.paths = append(p.paths, r.URL.Path)
			p.mu.Unlock()
			select {
			case <-p.gate:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	// The listening socket is made inside the node's namespace, where the
	// agent runs; the proxy's own connections leave from the test's.
	var ln net.Listener
	if err := c.Lab.InNode(node, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p.srv.Listener = ln
	p.srv.StartTLS()
	t.Cleanup(func() {
		p.release()
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

// isInformerList reports whether r is the initial list of one of the
// collections the agent's informers watch: a LIST, or a watch that streams
// the initial state first (sendInitialEvents, client-go's WatchList).
func isInformerList(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	q := r.URL.Query()
	if w := q.Get("watch"); (w == "true" || w == "1") && q.Get("sendInitialEvents") != "true" {
		return false
	}
	for _, suffix := range []string{"/pods", "/namespaces", "/networkpolicies"} {
		if strings.HasSuffix(r.URL.Path, suffix) {
			return true
		}
	}
	return false
}

func (p *listHoldingProxy) release() { p.once.Do(func() { close(p.gate) }) }

func (p *listHoldingProxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.paths)
}

func (p *listHoldingProxy) heldPaths() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paths...)
}

// kubeconfig writes a kubeconfig for the nftpolicy ServiceAccount that
// reaches the API server through the proxy, and returns its path.
func (p *listHoldingProxy) kubeconfig(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	token := c.Env.ServiceAccountToken(t, "kube-system", "nftpolicy")
	path := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: proxied
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: nftpolicy
  user:
    token: %q
contexts:
- name: nftpolicy
  context: {cluster: proxied, user: nftpolicy}
current-context: nftpolicy
`, p.srv.URL, base64.StdEncoding.EncodeToString(ca), token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
