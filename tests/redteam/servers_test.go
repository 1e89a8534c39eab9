package redteam

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// The agent's health and metrics ports as install.yaml's DaemonSet has
// them (host network: the node's addresses).
const (
	serversHealthPort  = 9403
	serversMetricsPort = 9402
)

// serversInstallArgs returns install.yaml's settings that decide how the
// agent serves health and metrics (addresses, protection), from its
// ConfigMap's agent configuration and then its DaemonSet's args (a flag
// there overrides the file), as flags: the value of
// --metrics-bind-address, and the others.
func serversInstallArgs(t *testing.T) (string, []string) {
	t.Helper()
	c, err := cluster.InstallAgentConfig()
	if err != nil {
		t.Fatal(err)
	}
	metrics := c.Metrics.BindAddress
	out := []string{"--metrics-auth=" + c.Metrics.Auth, "--health-bind-address=" + c.HealthBindAddress}
	if c.Metrics.TLSCertFile != "" {
		out = append(out, "--metrics-tls-cert-file="+c.Metrics.TLSCertFile, "--metrics-tls-private-key-file="+c.Metrics.TLSPrivateKeyFile)
	}
	if c.Metrics.Profiling {
		out = append(out, "--profiling")
	}
	docs, err := cluster.InstallDocuments("DaemonSet")
	if err != nil || len(docs) != 1 {
		t.Fatalf("install.yaml's DaemonSet: %d documents, %v", len(docs), err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(docs[0]), &ds); err != nil {
		t.Fatal(err)
	}
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
		if v, found := strings.CutPrefix(a, "--metrics-bind-address="); found {
			metrics = v
			continue
		}
		for _, p := range []string{"--metrics-", "--health-", "--profiling"} {
			if strings.HasPrefix(a, p) {
				out = append(out, a)
			}
		}
	}
	if metrics == "" {
		t.Fatal("install.yaml's agent serves no metrics")
	}
	return metrics, out
}

// serversLab is a one- or two-node cluster whose agents serve health and
// metrics on the node's addresses as configured, with an attacker pod per
// node.
type serversLab struct {
	c        *cluster.Cluster
	attacker map[string]netlab.Endpoint // by node
}

func (l *serversLab) nodeAddr(node string, port int) string {
	return netip.AddrPortFrom(l.c.NodeIPs(node)[0], uint16(port)).String()
}

// serversDialIn opens n TCP connections to addr from inside ep's network
// namespace (the sockets are created there, one after the other); it
// returns those connected and how many were reset before connect
// returned (refused at once by the server).
func serversDialIn(l *netlab.Lab, ep netlab.Endpoint, addr string, n int) ([]net.Conn, int, error) {
	var conns []net.Conn
	reset := 0
	err := l.InNetns(ep, func() error {
		for i := range n {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if errors.Is(err, syscall.ECONNRESET) {
				reset++
				continue
			}
			if err != nil {
				return fmt.Errorf("connection %d to %s: %w", i+1, addr, err)
			}
			conns = append(conns, c)
		}
		return nil
	})
	return conns, reset, err
}

// serversHTTPClient is an HTTP client whose sockets are created in ep's
// namespace; TLS without verification (the agent's certificate is
// self-signed, and the attacker does not care).
func serversHTTPClient(l *netlab.Lab, ep netlab.Endpoint, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = l.InNetns(ep, func() error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}}
}

// serversGet fetches url with an optional bearer token; the body is
// truncated to 64 KiB.
func serversGet(ctx context.Context, cl *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), err
}

// serversSockets counts the TCP sockets of the agent's network namespace
// with local port port, by state (the kernel's hex state: "01"
// established, ...).
func serversSockets(pid, port int) (map[string]int, error) {
	out := map[string]int{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || !strings.HasSuffix(fields[1], want) {
				continue
			}
			if fields[3] == "0A" { // the listener
				continue
			}
			out[fields[3]]++
		}
	}
	return out, nil
}

func serversFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// serversStillOpen counts the connections the server has not closed:
// a read that times out (rather than EOF or a reset) is an open one.
func serversStillOpen(conns []net.Conn, readers []*bufio.Reader) int {
	var open atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for i, c := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			var err error
			if readers != nil && readers[i] != nil {
				_, err = readers[i].ReadByte()
			} else {
				_, err = c.Read(make([]byte, 1))
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(open.Load())
}

// serversBareAgent is a real `nftpolicy agent` process in a lab node's
// namespace, with an attacker pod on that node, and no API server (its
// kubeconfig names one that refuses connections): the agent serves health
// and metrics as soon as it starts, /healthz answers 200 while it waits
// for the API's first lists, and in kernel mode nothing is queued.
type serversBareAgent struct {
	lab      *netlab.Lab
	node     string
	nodeIP   netip.Addr
	attacker netlab.Endpoint
	cmd      *exec.Cmd
	logPath  string
}

func startServersBareAgent(t *testing.T, ctx context.Context, args ...string) *serversBareAgent {
	t.Helper()
	testenv.Require(t, "redteam servers", testenv.Root("create network namespaces and run an nftpolicy agent in one"), testenv.Binaries("ip", "nft"))
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	const node = "node-1"
	lab, err := netlab.New(netlab.Config{Prefix: netlab.RandomPrefix("rts"), Nodes: []netlab.NodeSpec{{Name: node}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("closing the lab: %v", err)
		}
	})
	if err := lab.AddPod(netlab.PodSpec{Name: "intruder", Node: node, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.66")}}); err != nil {
		t.Fatal(err)
	}
	ips, err := lab.IPs(netlab.Node(node))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &serversBareAgent{lab: lab, node: node, nodeIP: ips[0], attacker: netlab.Pod("intruder"), logPath: filepath.Join(dir, "agent.log")}
	argv := append([]string{bin, "agent", "--kubeconfig", kc, "--hostname-override", node, "--mode", "kernel",
		"--state-dir", filepath.Join(dir, "state"), "--v", "2"}, args...)
	a.cmd, err = lab.Command(context.Background(), netlab.Node(node), argv...)
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(a.logPath)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent: %s", strings.Join(argv, " "))
	exited := make(chan struct{})
	go func() { _ = a.cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("agent log tail:\n%s", a.logTail(30))
		}
	})
	cl := serversHTTPClient(lab, netlab.Node(node), time.Second)
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", serversHealthPort)
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		code, _, err := serversGet(ctx, cl, url, "")
		if err == nil && code == http.StatusOK {
			break
		}
		select {
		case <-exited:
			t.Fatalf("the agent exited; log tail:\n%s", a.logTail(30))
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("the agent's %s does not answer: %d %v; log tail:\n%s", url, code, err, a.logTail(30))
		}
	}
	return a
}

func (a *serversBareAgent) logTail(n int) string {
	data, _ := os.ReadFile(a.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (a *serversBareAgent) addr(port int) string {
	return netip.AddrPortFrom(a.nodeIP, uint16(port)).String()
}

// TestRedTeamIdleConnections: a pod opens thousands of connections to the
// agent's health and metrics ports on the node's address and leaves them
// idle: to the health port after one request each (keep-alive, as a
// client that never sends its next request), to the metrics port without
// sending anything. The agent must keep a bounded number of them (its file
// descriptors and established sockets stay small), close the idle ones
// after its timeouts, and answer the kubelet's probe of /healthz, on the
// node's address, within the probe's 1 s throughout.
func TestRedTeamIdleConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const healthConns, metricsConns = 2000, 1000
	metricsFlag, args := serversInstallArgs(t)
	a := startServersBareAgent(t, ctx, append(args, "--metrics-bind-address="+metricsFlag)...)
	pid := a.cmd.Process.Pid
	healthAddr, metricsAddr := a.addr(serversHealthPort), a.addr(serversMetricsPort)
	baseFDs := serversFDs(pid)
	lab := a.lab

	// The kubelet's probe: from the node itself, to the node's address.
	kubelet := serversHTTPClient(lab, netlab.Node(a.node), 5*time.Second)
	probe := func(when string) {
		t.Helper()
		code, body, err := serversGet(ctx, kubelet, "http://"+healthAddr+"/healthz", "")
		if err != nil || code != http.StatusOK {
			t.Errorf("%s: the kubelet's /healthz probe: %d %q %v; want 200", when, code, strings.TrimSpace(body), err)
		}
	}
	probe("before the attack")

	ep := a.attacker
	began := time.Now()
	hc, hReset, err := serversDialIn(lab, ep, healthAddr, healthConns)
	defer func() {
		for _, c := range hc {
			c.Close()
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	// One request each, answered, then nothing: an idle keep-alive client.
	readers := make([]*bufio.Reader, len(hc))
	answered := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, c := range hc {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
				return
			}
			r := bufio.NewReader(c)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_ = c.SetDeadline(time.Time{})
			readers[i] = r
			mu.Lock()
			answered++
			mu.Unlock()
		}()
	}
	wg.Wait()
	mc, mReset, err := serversDialIn(lab, ep, metricsAddr, metricsConns)
	defer func() {
		for _, c := range mc {
			c.Close()
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attack: %d connections to %s (%d reset while connecting; %d answered, then idle) and %d silent ones to %s (%d reset while connecting), in %v",
		healthConns, healthAddr, hReset, answered, metricsConns, metricsAddr, mReset, time.Since(began).Round(time.Millisecond))

	// During the attack.
	probe("during the attack")
	// The bounds: the listeners' limits for remote peers (health 16,
	// metrics 64), with room for the agent's own sockets. Connections the
	// kernel completed but the agent has not accepted (and reset) yet are
	// established too: a loaded node may take a moment to drain them.
	const slack = 20
	var hs, ms map[string]int
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if hs, err = serversSockets(pid, serversHealthPort); err != nil {
			t.Fatal(err)
		}
		if ms, err = serversSockets(pid, serversMetricsPort); err != nil {
			t.Fatal(err)
		}
		if (hs["01"] <= 16+slack && ms["01"] <= 64+slack) || time.Now().After(end) {
			break
		}
	}
	fds := serversFDs(pid)
	hOpen, mOpen := serversStillOpen(hc, readers), serversStillOpen(mc, nil)
	t.Logf("during the attack: agent fds %d (before %d); established sockets: health %d, metrics %d; attacker's connections still open: health %d/%d, metrics %d/%d",
		fds, baseFDs, hs["01"], ms["01"], hOpen, healthConns, mOpen, metricsConns)
	if fds-baseFDs > 16+64+slack {
		t.Errorf("the agent holds %d more file descriptors during the attack (%d before): its connections are not bounded", fds-baseFDs, baseFDs)
	}
	if hs["01"] > 16+slack || ms["01"] > 64+slack {
		t.Errorf("established sockets during the attack: health %d, metrics %d; want at most %d and %d", hs["01"], ms["01"], 16+slack, 64+slack)
	}
	probe("during the attack, after counting")

	// After the timeouts (health: 5 s idle; metrics: 5 s for the TLS
	// handshake or the request's header), every idle connection is closed.
	deadline := time.Now().Add(20 * time.Second)
	for {
		hOpen, mOpen = serversStillOpen(hc, readers), serversStillOpen(mc, nil)
		if hOpen+mOpen == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if hOpen+mOpen > 0 {
		t.Errorf("%v after the attack began, the agent still holds %d idle health and %d idle metrics connections of the attacker", time.Since(began).Round(time.Second), hOpen, mOpen)
	}
	probe("after the attack")
	// Each refusal is counted (nftpolicy_http_connections_refused_total,
	// checked in cmd/nftpolicy's tests) and logged at most once a minute.
	for _, server := range []string{"health", "metrics"} {
		if !strings.Contains(a.logTail(1000), `"Connection refused: too many open connections" logger="agent.`+server+`-server" limit="source"`) {
			t.Errorf("the agent did not log refusing the attacker's connections to its %s server", server)
		}
	}
}

// startServersLabWith starts a cluster (real API server and agents) with
// args for every agent (after the harness' own, so they win), each node's
// --metrics-bind-address from metricsAddr ("": the flag left out, its
// default), and an attacker pod per node.
func startServersLabWith(t *testing.T, ctx context.Context, nodes []string, args []string, metricsAddr map[string]string) *serversLab {
	t.Helper()
	c := cluster.Start(t, cluster.Config{Nodes: nodes, NoAgents: true, AgentArgs: args})
	l := &serversLab{c: c, attacker: map[string]netlab.Endpoint{}}
	if err := c.EnsureNamespace(ctx, "attacker", nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		a := c.Agent(n)
		a.MetricsAddr = metricsAddr[n]
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := c.Agent(n).WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		name := "intruder-" + n
		if _, err := c.CreatePod(ctx, cluster.Pod{Namespace: "attacker", Name: name, Node: n}); err != nil {
			t.Fatal(err)
		}
		ep, err := c.PodEndpoint("attacker/" + name)
		if err != nil {
			t.Fatal(err)
		}
		l.attacker[n] = ep
	}
	// The agents learn the pods (until then their connections wait as
	// an unknown pod's): the health port answers the pod.
	for _, n := range nodes {
		serversWaitKnown(t, ctx, l, l.attacker[n], n)
	}
	return l
}

// serversScraperToken returns the token of a ServiceAccount allowed to get
// /metrics only (as a Prometheus would be bound), creating it once.
func serversScraperToken(t *testing.T, ctx context.Context, l *serversLab) string {
	t.Helper()
	cl := l.c.Client
	if _, err := cl.CoreV1().ServiceAccounts("attacker").Get(ctx, "scraper", metav1.GetOptions{}); err != nil {
		if _, err := cl.CoreV1().ServiceAccounts("attacker").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "servers-metrics-reader"},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "servers-metrics-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "servers-metrics-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "attacker", Name: "scraper"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return l.c.Env.ServiceAccountToken(t, "attacker", "scraper")
}

func trimServers(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// TestRedTeamMetricsUnreachable: a pod tries to read its node agent's
// metrics (every policy named, with its counters) and profiles on the
// node's address.
//   - default-address: the flag's default (with --profiling): nothing
//     listens there; the agent serves on the node's loopback (the control).
//   - install.yaml: install.yaml's flags (with --profiling), no API
//     server: no token gets 401, a forged one nothing readable.
//   - install.yaml-api: the same against a real API server: no token and
//     a forged one get 401, a valid token of a ServiceAccount without the
//     grant 403; a metrics reader's token reads /metrics, from a pod too (a
//     Prometheus can scrape), but not /debug/pprof/ (403).
func TestRedTeamMetricsUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	metricsFlag, installArgs := serversInstallArgs(t)
	paths := []string{"/metrics", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=2"}
	forged := "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06bmZ0cG9saWN5In0.c2lnbmF0dXJl"

	t.Run("default-address", func(t *testing.T) {
		a := startServersBareAgent(t, ctx, "--health-bind-address=:9403", "--profiling")
		pod := serversHTTPClient(a.lab, a.attacker, 3*time.Second)
		for _, path := range paths {
			if what, ok := serversPodReads(ctx, pod, a.addr(serversMetricsPort), path, ""); ok {
				t.Errorf("a pod read %s of its node's agent (default --metrics-bind-address) at %s: %s", path, a.addr(serversMetricsPort), what)
			}
		}
		host := serversHTTPClient(a.lab, netlab.Node(a.node), 5*time.Second)
		if what, ok := serversPodReads(ctx, host, fmt.Sprintf("127.0.0.1:%d", serversMetricsPort), "/metrics", ""); !ok {
			t.Errorf("the agent does not serve /metrics on the node's loopback: %s", what)
		}
	})

	t.Run("install.yaml", func(t *testing.T) {
		a := startServersBareAgent(t, ctx, append(installArgs, "--metrics-bind-address="+metricsFlag, "--profiling")...)
		pod := serversHTTPClient(a.lab, a.attacker, 5*time.Second)
		addr := a.addr(serversMetricsPort)
		for _, path := range paths {
			for who, token := range map[string]string{"no token": "", "a forged token": forged} {
				if what, ok := serversPodReads(ctx, pod, addr, path, token); ok {
					t.Errorf("a pod with %s read %s of its node's agent (install.yaml) at %s: %s", who, path, addr, what)
				}
			}
			code, body, err := serversGet(ctx, pod, "https://"+addr+path, "")
			if err != nil || code != http.StatusUnauthorized {
				t.Errorf("GET https://%s%s from a pod without a token: %d %q %v; want 401", addr, path, code, trimServers(body), err)
			}
		}
	})

	t.Run("install.yaml-api", func(t *testing.T) {
		l := startServersLabWith(t, ctx, []string{"node-1"}, append(installArgs, "--profiling"), map[string]string{"node-1": metricsFlag})
		scraper := serversScraperToken(t, ctx, l)
		if _, err := l.c.Client.CoreV1().ServiceAccounts("attacker").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		intruder := l.c.Env.ServiceAccountToken(t, "attacker", "intruder")
		pod := serversHTTPClient(l.c.Lab, l.attacker["node-1"], 5*time.Second)
		addr := l.nodeAddr("node-1", serversMetricsPort)
		for _, tc := range []struct {
			who, token, path string
			want             int
		}{
			{"no token", "", "/metrics", http.StatusUnauthorized},
			{"a forged token", forged, "/metrics", http.StatusUnauthorized},
			{"a valid token without the grant", intruder, "/metrics", http.StatusForbidden},
			{"a valid token without the grant", intruder, "/debug/pprof/heap", http.StatusForbidden},
			{"the metrics reader's token", scraper, "/debug/pprof/heap", http.StatusForbidden},
			{"the metrics reader's token", scraper, "/debug/pprof/goroutine", http.StatusForbidden},
			{"the metrics reader's token", scraper, "/metrics", http.StatusOK},
		} {
			if tc.want != http.StatusOK {
				if what, ok := serversPodReads(ctx, pod, addr, tc.path, tc.token); ok {
					t.Errorf("a pod with %s read %s of its node's agent (install.yaml) at %s: %s", tc.who, tc.path, addr, what)
					continue
				}
			}
			code, body, err := serversGet(ctx, pod, "https://"+addr+tc.path, tc.token)
			if err != nil || code != tc.want {
				t.Errorf("GET https://%s%s from a pod with %s: %d %q %v; want %d", addr, tc.path, tc.who, code, trimServers(body), err, tc.want)
			} else {
				t.Logf("GET %s with %s: %d", tc.path, tc.who, code)
			}
		}
	})
}

// serversPodReads tries plain HTTP and HTTPS: whether a GET of path on
// addr from the client's namespace answered 200 with the agent's metrics or profiles.
func serversPodReads(ctx context.Context, cl *http.Client, addr, path, token string) (string, bool) {
	var seen []string
	for _, scheme := range []string{"http", "https"} {
		code, body, err := serversGet(ctx, cl, scheme+"://"+addr+path, token)
		if err == nil && code == http.StatusOK {
			return fmt.Sprintf("%s: 200, %d bytes: %q", scheme, len(body), trimServers(body)), true
		}
		seen = append(seen, fmt.Sprintf("%s: %d %v", scheme, code, err))
	}
	return strings.Join(seen, "; "), false
}

// TestRedTeamMetricsLockout is issue 43's lockout of the scraper (item
// 7): more addresses than the agent kept review buckets for (256) each
// send one request with a made-up token to the node's metrics port
// (install.yaml's flags, a real API server answering the reviews); then
// a Prometheus rescheduled to a new pod scrapes with a valid token and
// must get the metrics, not 429.
func TestRedTeamMetricsLockout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	metricsFlag, installArgs := serversInstallArgs(t)
	l := startServersLabWith(t, ctx, []string{"node-1"}, installArgs, map[string]string{"node-1": metricsFlag})
	token, err := l.c.MetricsReaderToken(ctx, "monitoring", "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.c.CreatePod(ctx, cluster.Pod{Namespace: "monitoring", Name: "prometheus", Node: "node-1"}); err != nil {
		t.Fatal(err)
	}
	scraper, err := l.c.PodEndpoint("monitoring/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	serversWaitKnown(t, ctx, l, scraper, "node-1")
	r, err := l.c.RunMetricsLockout(ctx, cluster.MetricsLockout{Node: "node-1", Addr: l.nodeAddr("node-1", serversMetricsPort),
		Sources: 300, Scraper: scraper, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the crowd's 300 addresses got (status: count) %v", r.Crowd)
	if r.Crowd[http.StatusUnauthorized] == 0 {
		t.Errorf("no made-up token of the crowd was refused with 401: %v (the attack did not reach the agent)", r.Crowd)
	}
	if !r.ScrapeOK() {
		t.Errorf("a valid scrape from a new pod after 300 addresses sent made-up tokens: %d %s; want 200", r.ScrapeCode, r.ScrapeError)
	}
}

// serversWaitKnown waits until node's agent knows the pod at ep: its
// health port answers the pod (until then its connections wait as an
// unknown pod's).
func serversWaitKnown(t *testing.T, ctx context.Context, l *serversLab, ep netlab.Endpoint, node string) {
	t.Helper()
	cl := serversHTTPClient(l.c.Lab, ep, time.Second)
	url := "http://" + l.nodeAddr(node, serversHealthPort) + "/healthz"
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		code, _, err := serversGet(ctx, cl, url, "")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%v on %s cannot reach %s: %d %v", ep, node, url, code, err)
		}
	}
}
