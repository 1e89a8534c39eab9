package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
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
	"sync"
	"syscall"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Agent is the `nftpolicy agent` process of one node. It runs inside the
// node's network namespace (`ip netns exec`), reaches the API server through
// the node's relay and serves /metrics and /readyz on 127.0.0.1 of that
// namespace.
type Agent struct {
	Node string
	// MetricsAddr and HealthAddr are the agent's listen addresses inside
	// the node namespace. An empty MetricsAddr, set before Start, leaves
	// the flag out: the agent's default (Metrics cannot scrape it then).
	MetricsAddr, HealthAddr string
	// LogPath is the agent's log file; every start appends to it.
	LogPath string
	// Kubeconfig authenticates as kube-system/nftpolicy via the relay.
	Kubeconfig string
	// PreviewSocket is the agent's --preview-socket, as install.yaml's
	// emptyDir would hold it (`nftpolicy preview --local --socket`).
	PreviewSocket string
	// ExtraArgs are more flags of this node's agent, after the cluster's
	// AgentArgs (set before Start).
	ExtraArgs []string

	// saDir holds the ServiceAccount files of an EnforcerKNP agent.
	saDir string

	c     *Cluster
	relay *relay
	http  *http.Client

	mu     sync.Mutex
	proc   *agentProc
	starts int
}

type agentProc struct {
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed once the process has been reaped
	err     error         // Wait's result, valid after done
}

// Addresses inside every node namespace. The namespace is private to its
// node, so fixed ports are free by construction (newAgent checks); they lie
// below the ephemeral range, so no client socket of the agent or of the
// harness can hold them when the agent restarts.
const (
	RelayAddr   = "127.0.0.1:6443" // the API server, as the agents see it
	MetricsAddr = "127.0.0.1:9402"
	HealthAddr  = "127.0.0.1:9403"
)

func (c *Cluster) newAgent(node, token string) (*Agent, error) {
	a := &Agent{Node: node, c: c, LogPath: filepath.Join(c.logDir, "agent-"+node+".log"),
		MetricsAddr: MetricsAddr, HealthAddr: HealthAddr}
	if err := checkFreeIn(c.Lab, node, MetricsAddr, HealthAddr); err != nil {
		return nil, err
	}
	var err error
	if a.relay, err = newRelay(c.Lab, node, RelayAddr, strings.TrimPrefix(c.Env.Server, "https://")); err != nil {
		return nil, err
	}
	if c.cfg.Enforcer == EnforcerKNP {
		a.saDir = filepath.Join(c.logDir, "serviceaccount-"+node)
		if err := writeKNPServiceAccount(a.saDir, token, c.Env.CAData); err != nil {
			return nil, err
		}
		a.http = nodeHTTPClient(c.Lab, node)
		return a, nil
	}
	a.Kubeconfig = filepath.Join(c.logDir, node+".kubeconfig")
	a.PreviewSocket = filepath.Join(c.logDir, "preview-"+node, "preview.sock")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeenv
  cluster:
    server: https://%s
    certificate-authority-data: %s
users:
- name: system:serviceaccount:kube-system:nftpolicy
  user:
    token: %q
contexts:
- name: nftpolicy
  context: {cluster: kubeenv, user: "system:serviceaccount:kube-system:nftpolicy"}
current-context: nftpolicy
`, a.relay.addr(), base64.StdEncoding.EncodeToString(c.Env.CAData), token)
	if err := os.WriteFile(a.Kubeconfig, []byte(kc), 0o600); err != nil {
		return nil, err
	}
	a.http = nodeHTTPClient(c.Lab, node)
	return a, nil
}

// nodeHTTPClient is an HTTP client whose sockets are created inside the
// node namespace, so that they reach its loopback.
func nodeHTTPClient(lab *netlab.Lab, node string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
				err = lab.InNode(node, func() error {
					var d net.Dialer
					conn, err = d.DialContext(ctx, network, addr)
					return err
				})
				return conn, err
			},
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     10 * time.Second,
		},
	}
}

// StateDir is the agent's --state-dir, where it keeps the snapshot of its
// program (on a node, a tmpfs that a reboot empties).
func (a *Agent) StateDir() string { return filepath.Join(a.c.logDir, "state-"+a.Node) }

// Args returns the agent's command line after "nftpolicy agent".
func (a *Agent) Args() []string {
	args := []string{
		"--kubeconfig", a.Kubeconfig,
		"--hostname-override", a.Node,
		"--mode", string(a.c.cfg.Mode),
		"--health-bind-address", a.HealthAddr,
		"--v", strconv.Itoa(a.c.cfg.Verbosity),
		// One state directory per node, as a DaemonSet's hostPath would be.
		"--state-dir", a.StateDir(),
		"--preview-socket", a.PreviewSocket,
		// The lab's nodes have no default route: their underlay (a veth)
		// and the external hosts' veths are the uplinks.
		"--uplink-interfaces", "eth0,ext*",
	}
	if a.MetricsAddr != "" {
		args = append(args, "--metrics-bind-address", a.MetricsAddr)
	}
	return append(append(args, a.c.cfg.AgentArgs...), a.ExtraArgs...)
}

// Start starts the agent process; it returns once the process is started,
// not when it is ready (see WaitReady).
func (a *Agent) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc != nil && !a.proc.exited() {
		return fmt.Errorf("cluster: the agent of %s is already running (pid %d)", a.Node, a.proc.cmd.Process.Pid)
	}
	p, err := a.startProc()
	if err != nil {
		return err
	}
	a.proc = p
	return nil
}

// Update replaces the running agent the way a DaemonSet update with
// maxSurge does: it starts a second agent process on the node, calls
// successorUp (which returns once the successor is in charge), sends the
// old process SIGTERM and waits up to grace for it to exit. From then on
// the successor is the node's agent. Both processes log to LogPath.
func (a *Agent) Update(successorUp func() error, grace time.Duration) error {
	a.mu.Lock()
	old := a.proc
	if old == nil || old.exited() {
		a.mu.Unlock()
		return fmt.Errorf("cluster: the agent of %s is not running", a.Node)
	}
	p, err := a.startProc()
	a.mu.Unlock()
	if err != nil {
		return err
	}
	killNew := func() { _ = p.cmd.Process.Signal(syscall.SIGKILL); <-p.done }
	if err := successorUp(); err != nil {
		killNew()
		return fmt.Errorf("cluster: the successor agent of %s: %w", a.Node, err)
	}
	err = a.Stop(grace)
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cluster: stopping the old agent of %s: %w", a.Node, err)
	}
	return nil
}

// UpdateStoppedFirst replaces the running agent the way a DaemonSet update
// with maxSurge can when the new pod is reported ready before the new agent
// listens (its readiness probe reaches the old agent on their shared host
// port): the old process gets SIGTERM first, the successor starts lead
// later, and the old one has up to grace to exit. From then on the
// successor is the node's agent.
func (a *Agent) UpdateStoppedFirst(lead, grace time.Duration) error {
	old := a.current()
	if old == nil || old.exited() {
		return fmt.Errorf("cluster: the agent of %s is not running", a.Node)
	}
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	time.Sleep(lead)
	a.mu.Lock()
	p, err := a.startProc()
	if err == nil {
		a.proc = p
	}
	a.mu.Unlock()
	if err != nil {
		return err
	}
	return a.awaitExit(old, grace)
}

// startProc starts one agent process; a.mu is held.
func (a *Agent) startProc() (*agentProc, error) {
	logf, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	a.starts++
	argv := append([]string{a.c.bin, "agent"}, a.Args()...)
	if a.c.cfg.Enforcer == EnforcerKNP {
		argv = a.knpArgv()
	}
	fmt.Fprintf(logf, "=== cluster: start #%d of the agent of %s at %s: %s\n", a.starts, a.Node,
		time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd, err := a.c.Lab.Command(context.Background(), netlab.Node(a.Node), argv...)
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if a.c.cfg.Enforcer == EnforcerKNP {
		cmd.Env = a.knpEnv()
	}
	// The agent dies with the test process, even on a crash or timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("cluster: starting the agent of %s: %w", a.Node, err)
	}
	p := &agentProc{cmd: cmd, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(logf, "=== cluster: the agent of %s (pid %d) exited at %s: %v\n", a.Node, cmd.Process.Pid, time.Now().Format(time.RFC3339Nano), exitText(p.err))
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (p *agentProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (a *Agent) current() *agentProc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc
}

// Running reports whether the agent process is alive.
func (a *Agent) Running() bool {
	p := a.current()
	return p != nil && !p.exited()
}

// Pid is the process id of the running agent, 0 when none.
func (a *Agent) Pid() int {
	if p := a.current(); p != nil && !p.exited() {
		return p.cmd.Process.Pid
	}
	return 0
}

// Kill sends SIGKILL and waits for the process to be reaped.
func (a *Agent) Kill() error {
	p := a.current()
	if p == nil || p.exited() {
		return fmt.Errorf("cluster: the agent of %s is not running", a.Node)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.done
	return nil
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs. It returns nil when
// the agent exited with status 0 by itself (or was not running), or, for
// kube-network-policies, which installs no SIGTERM handler (v0.8.0), when
// SIGTERM's default action ended it; an error for any other exit status or
// when SIGKILL was needed.
func (a *Agent) Stop(grace time.Duration) error {
	p := a.current()
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return a.awaitExit(p, grace)
}

// awaitExit waits up to grace for p, sent SIGTERM, to exit, then SIGKILLs
// it; nil when it exited with status 0 by itself.
func (a *Agent) awaitExit(p *agentProc, grace time.Duration) error {
	select {
	case <-p.done:
		if p.err != nil && !(a.c.cfg.Enforcer == EnforcerKNP && killedBy(p.err, syscall.SIGTERM)) {
			return fmt.Errorf("cluster: the agent of %s exited after SIGTERM: %w", a.Node, p.err)
		}
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("cluster: the agent of %s did not exit within %v of SIGTERM; killed", a.Node, grace)
}

// killedBy reports whether err is the exit of a process ended by sig.
func killedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Exec runs `nftpolicy args...` inside the node's namespace with stdin, as
// `kubectl exec` into the agent's pod would (`nftpolicy preview --local`),
// and returns its standard output and error.
func (a *Agent) Exec(ctx context.Context, stdin []byte, args ...string) (stdout, stderr []byte, err error) {
	cmd, err := a.c.Lab.Command(ctx, netlab.Node(a.Node), append([]string{a.c.bin}, args...)...)
	if err != nil {
		return nil, nil, err
	}
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

// HoldAPI makes the API server unreachable for this agent: open connections
// through the relay are cut and new ones wait (the client sees a TLS
// handshake that does not progress) until ReleaseAPI.
func (a *Agent) HoldAPI() { a.relay.hold() }

// ReleaseAPI undoes HoldAPI; waiting connections proceed.
func (a *Agent) ReleaseAPI() { a.relay.release() }

// Get fetches http://addr/path from inside the node namespace (addr is
// MetricsAddr or HealthAddr) and returns the status code and body.
func (a *Agent) Get(ctx context.Context, addr, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(body), err
}

// Metrics scrapes /metrics. Keys are the sample names with their labels as
// exposed, e.g. `nftpolicy_programmed_policies` or
// `nftpolicy_queue_rule_variant{variant="xt-compat"}`.
func (a *Agent) Metrics(ctx context.Context) (map[string]float64, error) {
	code, body, err := a.Get(ctx, a.MetricsAddr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d", code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// Ready reports /readyz's status code.
func (a *Agent) Ready(ctx context.Context) (int, error) {
	code, _, err := a.Get(ctx, a.HealthAddr, "/readyz")
	return code, err
}

// WaitReady polls /readyz until it answers 200. It fails early when the
// process exits.
func (a *Agent) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if a.c.cfg.Enforcer == EnforcerKNP {
		if a.current() == nil {
			return fmt.Errorf("cluster: the agent of %s was never started", a.Node)
		}
		return a.waitKNPReady(ctx)
	}
	var last string
	for {
		p := a.current()
		if p == nil {
			return fmt.Errorf("cluster: the agent of %s was never started", a.Node)
		}
		if p.exited() {
			return fmt.Errorf("cluster: the agent of %s exited (%s) before it was ready; log tail:\n%s", a.Node, exitText(p.err), a.LogTail(30))
		}
		code, err := a.Ready(ctx)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("status %d, err %v", code, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: the agent of %s is not ready (%s): %w; log tail:\n%s", a.Node, last, ctx.Err(), a.LogTail(30))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// LogTail returns the last n lines of the agent's log.
func (a *Agent) LogTail(n int) string {
	data, err := os.ReadFile(a.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", a.LogPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// checkFreeIn fails unless every address can be listened on inside the
// node namespace.
func checkFreeIn(lab *netlab.Lab, node string, addrs ...string) error {
	return lab.InNode(node, func() error {
		for _, addr := range addrs {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("cluster: %s in the namespace of %s: %w", addr, node, err)
			}
			l.Close()
		}
		return nil
	})
}

// relay forwards TCP connections accepted on 127.0.0.1 inside a node
// namespace to the API server in the caller's namespace.
type relay struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	closed  bool
	held    bool
	resume  chan struct{} // closed by release
	conns   map[net.Conn]struct{}
	waiting sync.WaitGroup
}

func newRelay(lab *netlab.Lab, node, listen, target string) (*relay, error) {
	r := &relay{target: target, conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	err := lab.InNode(node, func() error {
		var err error
		r.ln, err = net.Listen("tcp", listen)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: API relay in %s: %w", node, err)
	}
	r.waiting.Add(1)
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	defer r.waiting.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.waiting.Add(1)
		go func() {
			defer r.waiting.Done()
			r.forward(c)
		}()
	}
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *relay) forward(in net.Conn) {
	if !r.track(in) {
		in.Close()
		return
	}
	defer r.untrack(in)
	for {
		r.mu.Lock()
		held, resume, closed := r.held, r.resume, r.closed
		r.mu.Unlock()
		if closed {
			return
		}
		if !held {
			break
		}
		<-resume
	}
	out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	if !r.track(out) {
		out.Close()
		return
	}
	defer r.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

// hold cuts every open connection and makes new ones wait.
func (r *relay) hold() {
	r.mu.Lock()
	if !r.held {
		r.held = true
		r.resume = make(chan struct{})
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
}

func (r *relay) release() {
	r.mu.Lock()
	if r.held {
		r.held = false
		close(r.resume)
	}
	r.mu.Unlock()
}

// close stops accepting, cuts every connection and waits for the
// forwarding goroutines.
func (r *relay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
	if r.held {
		r.held = false
		close(r.resume)
	}
	r.mu.Unlock()
	r.waiting.Wait()
}
