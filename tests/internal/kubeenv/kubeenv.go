package kubeenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

const (
	// DefaultToolsDir is where hack/tools.sh puts the binaries unless
	// NFTPOLICY_TOOLS says otherwise.
	DefaultToolsDir = "/var/cache/nftpolicy/tools"
	// ToolsEnv overrides DefaultToolsDir.
	ToolsEnv = "NFTPOLICY_TOOLS"
	// DefaultServiceCIDR is the --service-cluster-ip-range.
	DefaultServiceCIDR = "10.0.0.0/24"
	// ServiceAccountIssuer is the --service-account-issuer (and the audience
	// of tokens by default).
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

	// DefaultStopGrace is how long Cleanup waits after SIGTERM before it
	// sends SIGKILL.
	DefaultStopGrace = 2 * time.Second
)

// ToolsDir returns the directory hack/tools.sh builds into:
// $NFTPOLICY_TOOLS, or /var/cache/nftpolicy/tools.
func ToolsDir() string {
	if d := os.Getenv(ToolsEnv); d != "" {
		return d
	}
	return DefaultToolsDir
}

// Binary returns the path of a tool built by hack/tools.sh ("kube-apiserver",
// "kubectl" or "etcd"), or an error if it is not there.
func Binary(name string) (string, error) {
	p := filepath.Join(ToolsDir(), "bin", name)
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%s not found in %s (build it with: bash hack/tools.sh): %w", name, ToolsDir(), err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file (rebuild with: bash hack/tools.sh)", p)
	}
	return p, nil
}

// toolNames are the binaries hack/tools.sh builds that Start runs.
var toolNames = []string{"etcd", "kube-apiserver", "kubectl"}

// Tools is the testenv check for hack/tools.sh's binaries, for tests that
// want to skip (or fail, in strict mode) before building anything else.
func Tools() testenv.Check {
	return func() error {
		for _, name := range toolNames {
			if _, err := Binary(name); err != nil {
				return err
			}
		}
		return nil
	}
}

// Env is a running etcd + kube-apiserver.
type Env struct {
	// AdminKubeconfig is the path of a kubeconfig for a system:masters user.
	AdminKubeconfig string
	// Client is an admin clientset.
	Client kubernetes.Interface
	// KubectlPath is the kubectl binary (same version as the apiserver).
	KubectlPath string
	// Server is the apiserver URL, https://127.0.0.1:<port>.
	Server string
	// CAData is the PEM CA certificate that signed the apiserver's serving
	// certificate (and the client certificates).
	CAData []byte
	// ServiceCIDR is the --service-cluster-ip-range.
	ServiceCIDR string
	// Dir holds certificates, kubeconfigs, etcd data and process logs. It is
	// removed when the test ends.
	Dir string

	restConfig *rest.Config
	etcd       *proc
	apiserver  *proc
	stopGrace  time.Duration
	httpClient *http.Client // Client's; its idle connections are closed before stopping
	etcdReady  time.Time

	// What startProcesses ran, for the restarts of outage tests.
	bins          map[string]string
	etcdArgs      []string
	etcdURL       string
	apiserverArgs []string
	startTimeout  time.Duration
}

// Option configures Start.
type Option func(*options)

type options struct {
	apiserverArgs []string
	serviceCIDR   string
	timeout       time.Duration
	stopGrace     time.Duration
}

// WithAPIServerArgs appends flags to the kube-apiserver command line (a flag
// given twice takes its last value, so this can also override defaults).
func WithAPIServerArgs(args ...string) Option {
	return func(o *options) { o.apiserverArgs = append(o.apiserverArgs, args...) }
}

// WithServiceCIDR sets --service-cluster-ip-range (default 10.0.0.0/24).
func WithServiceCIDR(cidr string) Option {
	return func(o *options) { o.serviceCIDR = cidr }
}

// WithStartTimeout bounds how long Start waits for /readyz (default 90s).
func WithStartTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithStopGrace sets how long Cleanup waits between SIGTERM and SIGKILL
// (default DefaultStopGrace). kube-apiserver's graceful shutdown waits up to
// --request-timeout (1m) for clients' keep-alive connections (Cleanup closes
// those of Env.Client, not those of clients a test made itself), and the
// data is thrown away anyway, so a longer wait only slows tests down.
func WithStopGrace(d time.Duration) Option {
	return func(o *options) { o.stopGrace = d }
}

// Start starts etcd and kube-apiserver and waits until the apiserver's
// /readyz is "ok". Everything is stopped and removed by t.Cleanup. If the
// binaries are missing it skips the test, or fails it when
// NFTPOLICY_REQUIRE_TOOLS is set (testenv.Require).
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	o := options{serviceCIDR: DefaultServiceCIDR, timeout: 90 * time.Second, stopGrace: DefaultStopGrace}
	for _, opt := range opts {
		opt(&o)
	}

	testenv.Require(t, "kubeenv", Tools())
	bins := map[string]string{}
	for _, name := range toolNames {
		p, err := Binary(name)
		if err != nil {
			t.Fatalf("kubeenv: %v", err) // Tools found it a moment ago
		}
		bins[name] = p
	}

	began := time.Now()
	e := &Env{Dir: t.TempDir(), KubectlPath: bins["kubectl"], ServiceCIDR: o.serviceCIDR, stopGrace: o.stopGrace}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs(t, 40)
		}
		stopped := time.Now()
		killed := e.stop()
		t.Logf("kubeenv: stopped in %v (SIGKILLed: %v)", time.Since(stopped).Round(time.Millisecond), killed)
	})

	if err := e.writePKI(); err != nil {
		t.Fatalf("kubeenv: certificates: %v", err)
	}

	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = e.startProcesses(bins, o); err == nil {
			break
		}
		t.Logf("kubeenv: start attempt %d failed: %v", attempt, err)
		e.dumpLogs(t, 20)
		e.stop()
		// Retry with new ports only if one picked by freePorts was taken
		// meanwhile; other failures would just repeat.
		if !e.logsMention("address already in use") {
			break
		}
	}
	if err != nil {
		t.Fatalf("kubeenv: could not start the control plane: %v", err)
	}
	t.Logf("kubeenv: kube-apiserver ready at %s in %v (etcd after %v; dir %s)", e.Server,
		time.Since(began).Round(time.Millisecond), e.etcdReady.Sub(began).Round(time.Millisecond), e.Dir)
	return e
}

// pkiFiles are the PEM files in e.Dir/pki.
type pkiFiles struct {
	caCert, serverCert, serverKey, saKey, saPub string
}

func (e *Env) pkiPaths() pkiFiles {
	d := filepath.Join(e.Dir, "pki")
	return pkiFiles{
		caCert:     filepath.Join(d, "ca.crt"),
		serverCert: filepath.Join(d, "apiserver.crt"),
		serverKey:  filepath.Join(d, "apiserver.key"),
		saKey:      filepath.Join(d, "sa.key"),
		saPub:      filepath.Join(d, "sa.pub"),
	}
}

func (e *Env) writePKI() error {
	p := e.pkiPaths()
	if err := os.MkdirAll(filepath.Dir(p.caCert), 0o700); err != nil {
		return err
	}
	ca, err := newCertAuthority("kubeenv-ca")
	if err != nil {
		return err
	}
	svcIP, err := firstServiceIP(e.ServiceCIDR)
	if err != nil {
		return err
	}
	srvCert, srvKey, err := ca.issue("kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, svcIP},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	admCert, admKey, err := ca.issue("kubeenv-admin", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	saKey, saPub, err := newServiceAccountKey()
	if err != nil {
		return err
	}
	for path, data := range map[string][]byte{
		p.caCert: ca.certPEM, p.serverCert: srvCert, p.serverKey: srvKey, p.saKey: saKey, p.saPub: saPub,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	e.CAData = ca.certPEM
	e.restConfig = &rest.Config{
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.certPEM, CertData: admCert, KeyData: admKey},
		QPS:             200,
		Burst:           400,
		Timeout:         60 * time.Second,
	}
	return nil
}

func firstServiceIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	ip := make(net.IP, len(n.IP))
	copy(ip, n.IP)
	ip[len(ip)-1]++
	return ip, nil
}

func (e *Env) startProcesses(bins map[string]string, o options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	etcdDir := filepath.Join(e.Dir, "etcd")
	_ = os.RemoveAll(etcdDir)
	for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
		_ = os.Remove(filepath.Join(e.Dir, name)) // a failed attempt's
	}

	e.bins, e.etcdURL, e.startTimeout = bins, clientURL, o.timeout
	e.etcdArgs = []string{
		"--name=kubeenv",
		"--data-dir=" + etcdDir,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubeenv=" + peerURL,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync", // throw-away data: no need to pay for fsync
		"--log-level=warn",
	}
	deadline := time.Now().Add(o.timeout)
	if err := e.startEtcd(deadline); err != nil {
		return err
	}
	e.etcdReady = time.Now()

	p := e.pkiPaths()
	e.Server = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	args := []string{
		"--etcd-servers=" + clientURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + filepath.Join(e.Dir, "apiserver-certs"),
		"--tls-cert-file=" + p.serverCert,
		"--tls-private-key-file=" + p.serverKey,
		"--client-ca-file=" + p.caCert,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + e.ServiceCIDR,
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// The lease endpoint reconciler refuses a loopback advertise address
		// ("cannot use public IP 127.0.0.1 with endpoint reconciler"); with
		// "none" the default/kubernetes Service simply has no endpoints.
		"--endpoint-reconciler-type=none",
	}
	e.apiserverArgs = append(args, o.apiserverArgs...)
	e.restConfig.Host = e.Server
	if err := e.startAPIServer(deadline); err != nil {
		return err
	}

	cfg := e.RESTConfig()
	e.httpClient, err = rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	e.Client, err = kubernetes.NewForConfigAndClient(cfg, e.httpClient)
	if err != nil {
		return err
	}
	e.AdminKubeconfig = filepath.Join(e.Dir, "admin.kubeconfig")
	return os.WriteFile(e.AdminKubeconfig, kubeconfig(e.Server, e.CAData, "admin",
		"    client-certificate-data: "+b64(e.restConfig.CertData)+"\n"+
			"    client-key-data: "+b64(e.restConfig.KeyData)+"\n"), 0o600)
}

// startEtcd starts etcd with e.etcdArgs (its log appended to) and waits
// until it is healthy.
func (e *Env) startEtcd(deadline time.Time) error {
	var err error
	e.etcd, err = startProc("etcd", e.bins["etcd"], e.etcdArgs, filepath.Join(e.Dir, "etcd.log"))
	if err != nil {
		return err
	}
	if err := waitFor(deadline, e.etcd, func() error {
		return httpOK(http.DefaultClient, e.etcdURL+"/health", `"health":"true"`)
	}); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

// startAPIServer starts kube-apiserver with e.apiserverArgs (its log
// appended to) and waits until its /readyz is "ok".
func (e *Env) startAPIServer(deadline time.Time) error {
	var err error
	e.apiserver, err = startProc("kube-apiserver", e.bins["kube-apiserver"], e.apiserverArgs, filepath.Join(e.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	tlsCfg, err := e.tlsConfig()
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer hc.CloseIdleConnections()
	if err := waitFor(deadline, e.apiserver, func() error {
		return httpOK(hc, e.Server+"/readyz", "")
	}); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after the stop
// grace) and leaves etcd running: every client's connections are cut and
// new ones refused until StartAPIServer. It is a no-op when stopped.
func (e *Env) StopAPIServer() {
	if e.httpClient != nil {
		utilnet.CloseIdleConnectionsFor(e.httpClient.Transport)
	}
	if e.apiserver != nil {
		e.apiserver.stop(e.stopGrace)
		e.apiserver = nil
	}
}

// StartAPIServer starts kube-apiserver again, on the same address with the
// same flags, and waits until it is ready. Clients made before (Client,
// kubeconfigs, tokens) work again.
func (e *Env) StartAPIServer() error {
	if e.apiserver != nil {
		return errors.New("kubeenv: kube-apiserver is running")
	}
	return e.startAPIServer(time.Now().Add(e.startTimeout))
}

// RestartEtcd stops etcd (SIGTERM, then SIGKILL after the stop grace) and
// starts it again on the same ports with the same data, and waits until it
// is healthy. kube-apiserver keeps running; its requests fail meanwhile.
func (e *Env) RestartEtcd() error {
	if e.etcd != nil {
		e.etcd.stop(e.stopGrace)
		e.etcd = nil
	}
	return e.startEtcd(time.Now().Add(e.startTimeout))
}

// EtcdRevision returns etcd's current revision (the newest
// resourceVersion of any object).
func (e *Env) EtcdRevision(ctx context.Context) (int64, error) {
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// A range over one key that need not exist: the header carries the
	// revision.
	if err := e.etcdPost(ctx, "/v3/kv/range", `{"key":"`+b64([]byte("kubeenv-revision"))+`"}`, &out); err != nil {
		return 0, err
	}
	return strconv.ParseInt(out.Header.Revision, 10, 64)
}

// CompactEtcd compacts etcd's history up to its current revision and
// returns that revision: watches and lists from an older resourceVersion
// that reach etcd are answered 410 Gone ("too old resource version").
func (e *Env) CompactEtcd(ctx context.Context) (int64, error) {
	rev, err := e.EtcdRevision(ctx)
	if err != nil {
		return 0, err
	}
	body := fmt.Sprintf(`{"revision":"%d","physical":true}`, rev)
	return rev, e.etcdPost(ctx, "/v3/kv/compaction", body, nil)
}

// etcdPost calls etcd's gRPC gateway and decodes its JSON answer into out
// (unless nil).
func (e *Env) etcdPost(ctx context.Context, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.etcdURL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

func (e *Env) tlsConfig() (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(e.CAData) {
		return nil, errors.New("bad CA PEM")
	}
	cert, err := tls.X509KeyPair(e.restConfig.CertData, e.restConfig.KeyData)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// RESTConfig returns a copy of the admin client configuration.
func (e *Env) RESTConfig() *rest.Config { return rest.CopyConfig(e.restConfig) }

// Kubectl runs kubectl with the admin kubeconfig and returns its stdout. On
// failure the error includes stderr. Pass "--kubeconfig", path as the first
// arguments to act as another user (the last --kubeconfig wins).
func (e *Env) Kubectl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"--kubeconfig=" + e.AdminKubeconfig, "--cache-dir=" + filepath.Join(e.Dir, "kubectl-cache")}, args...)
	cmd := exec.CommandContext(ctx, e.KubectlPath, full...)
	cmd.Env = envWithout(os.Environ(), "KUBECONFIG")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// CreateNamespace creates a namespace and its "default" ServiceAccount (which
// a controller-manager would create; Pods cannot be created without it).
func (e *Env) CreateNamespace(t testing.TB, name string) *corev1.Namespace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeenv: create namespace %s: %v", name, err)
	}
	_, err = e.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubeenv: create default ServiceAccount in %s: %v", name, err)
	}
	return ns
}

// ServiceAccountToken returns a fresh token (TokenRequest API, 1h) for an
// existing ServiceAccount.
func (e *Env) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exp := int64(3600)
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeenv: token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// ServiceAccountConfig returns a client configuration that authenticates as
// an existing ServiceAccount (bearer token from the TokenRequest API).
func (e *Env) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	return &rest.Config{
		Host:            e.Server,
		BearerToken:     e.ServiceAccountToken(t, namespace, name),
		TLSClientConfig: rest.TLSClientConfig{CAData: e.CAData},
		QPS:             200,
		Burst:           400,
		Timeout:         60 * time.Second,
	}
}

// ServiceAccountKubeconfig creates a token for an existing ServiceAccount via
// the TokenRequest API and writes a kubeconfig that uses it; it returns the
// file's path.
func (e *Env) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	token := e.ServiceAccountToken(t, namespace, name)
	path := filepath.Join(e.Dir, fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	user := "system:serviceaccount:" + namespace + ":" + name
	if err := os.WriteFile(path, kubeconfig(e.Server, e.CAData, user, "    token: "+strconv.Quote(token)+"\n"), 0o600); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	return path
}

func kubeconfig(server string, caPEM []byte, user, userBody string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeenv
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %q
  user:
%scontexts:
- name: kubeenv
  context:
    cluster: kubeenv
    user: %q
current-context: kubeenv
`, server, b64(caPEM), user, userBody, user))
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func envWithout(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// stop terminates the apiserver and etcd: SIGTERM, then SIGKILL after
// e.stopGrace (kube-apiserver can take 40s+ to shut down gracefully, which a
// throw-away control plane does not need).
func (e *Env) stop() (killed []string) {
	// An open keep-alive connection makes kube-apiserver's graceful shutdown
	// wait for --request-timeout (1m): close the admin client's.
	if e.httpClient != nil {
		utilnet.CloseIdleConnectionsFor(e.httpClient.Transport)
	}
	// The apiserver first: etcd's graceful stop waits for its clients.
	for _, p := range []*proc{e.apiserver, e.etcd} {
		if p != nil {
			p.stop(e.stopGrace)
		}
	}
	for _, p := range []*proc{e.apiserver, e.etcd} {
		if p != nil && p.killed {
			killed = append(killed, p.name)
		}
	}
	e.apiserver, e.etcd = nil, nil
	return killed
}

func (e *Env) logsMention(s string) bool {
	for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
		if data, err := os.ReadFile(filepath.Join(e.Dir, name)); err == nil && bytes.Contains(data, []byte(s)) {
			return true
		}
	}
	return false
}

func (e *Env) dumpLogs(t testing.TB, lines int) {
	for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
		data, err := os.ReadFile(filepath.Join(e.Dir, name))
		if err != nil || len(data) == 0 {
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		t.Logf("kubeenv: last %d lines of %s:\n%s", len(all), name, strings.Join(all, "\n"))
	}
}

// proc is a child process whose output goes to a log file.
type proc struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited
	err    error         // Wait's result, valid after done
	killed bool          // stop had to use SIGKILL
}

func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	// Appended to: a restarted process (StartAPIServer, RestartEtcd) keeps
	// its earlier log.
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.killed = true
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitFor polls check until it succeeds, the deadline passes or p exits.
func waitFor(deadline time.Time, p *proc, check func() error) error {
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited early (%v); last check: %v", p.name, p.err, last)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready before the deadline: %v", last)
		}
	}
}

// httpOK GETs url and wants 200; if want is "" the body must be exactly
// "ok", otherwise it must contain want.
func httpOK(c *http.Client, url, want string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if want == "" && strings.TrimSpace(string(body)) != "ok" || want != "" && !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: unexpected body %q", url, body)
	}
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are only
// free at the time of the call; Start retries if one was taken meanwhile.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
