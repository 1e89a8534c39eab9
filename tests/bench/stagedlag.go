package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// StagedLagConfig configures RunStagedLag.
type StagedLagConfig struct {
	// Conns is the number of connections timed per path (same node,
	// across nodes).
	Conns int
	// Interval is the time from one connection to the next: under the
	// kernel's per-source limit on staged copies (the agent's default,
	// compile.DefaultStagedLogRate a second, burst the same here), so
	// that every connection is copied.
	Interval time.Duration
	// Logf receives progress lines; nil means none.
	Logf func(format string, args ...any)
}

// stagedLagWait bounds the wait for one connection's line: a line later
// than this counts as missing (staged_log_missing), not as a lag.
const stagedLagWait = time.Second

// RunStagedLag measures the staged log's lag: from a connection's
// connect(2) to the agent's "Staged verdict" line about it, in hybrid mode
// with the agent's kernel defaults. A client connects, one connection at a
// time, to a server on its node and to one on the other node; the servers
// are isolated by no enforced policy and by a staged one that would deny
// every connection to them: each connection succeeds and is logged "would
// deny" by the server's node. The readers'
// userspace limits (one line per connection per interval, lines per
// second) are lifted so that every connection has its line; what is
// timed is the copy, the read, both decisions and the write.
//
// Figures: staged_log_lag_ms_p50/p99/max over both paths, staged_log_lag_ms_p99_<path>, staged_log_lines and
// staged_log_missing (connections without a line within stagedLagWait).
func RunStagedLag(ctx context.Context, cfg StagedLagConfig) (*Result, error) {
	if cfg.Conns <= 0 {
		cfg.Conns = 200
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second / (compile.DefaultStagedLogRate - 1)
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	const group = staged.DefaultGroup
	l, err := lab.New(ctx, nil, lab.Config{StagedLogGroup: group, StagedLogRate: compile.DefaultStagedLogRate})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	l.Namespace(benchNSName, map[string]string{compile.NamespaceNameLabel: benchNSName})
	client := lab.PodSpec{Namespace: benchNSName, Name: "client", Node: 0, IP: lab.PodIP(0, 0), Labels: map[string]string{"app": "client"}}
	servers := map[string]lab.PodSpec{
		PathSame:  {Namespace: benchNSName, Name: "server-a", Node: 0, IP: lab.PodIP(0, 1), Labels: map[string]string{"app": "server"}, TCPPorts: []uint16{connPort}},
		PathCross: {Namespace: benchNSName, Name: "server-b", Node: 1, IP: lab.PodIP(1, 0), Labels: map[string]string{"app": "server"}, TCPPorts: []uint16{connPort}},
	}
	for _, p := range []lab.PodSpec{client, servers[PathSame], servers[PathCross]} {
		if err := l.StartPod(p); err != nil {
			return nil, err
		}
		l.Know(p)
	}
	// The servers are not isolated (every connection is allowed); the
	// staged policy would isolate them with no rule admitting anything.
	l.SetPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: benchNSName, Name: "staged-deny-all",
		Annotations: map[string]string{compile.StagedAnnotation: "true"}},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	if err := l.Publish(ctx); err != nil {
		return nil, err
	}

	clock := &lineClock{match: []byte(`"Staged verdict"`), lines: make(chan time.Time, 16)}
	for _, n := range l.Nodes() {
		stop, err := l.RunStagedLog(ctx, n, staged.Config{Config: denylog.Config{Group: group, FlowInterval: time.Nanosecond, LinesPerSecond: 1 << 20}},
			staged.NewMetrics(), clock)
		if err != nil {
			return nil, err
		}
		defer func() { _ = stop() }()
	}

	// connect times one connection to dst: its line's lag, or false when
	// no line came within stagedLagWait.
	connect := func(dst string) (time.Duration, bool, error) {
		next := time.Now().Add(cfg.Interval)
		defer func() { time.Sleep(time.Until(next)) }()
		clock.drain()
		start := time.Now()
		if err := l.Net().InNetns(client.Endpoint(), func() error {
			c, err := net.DialTimeout("tcp", dst, time.Second)
			if err != nil {
				return err
			}
			return c.Close()
		}); err != nil {
			return 0, false, fmt.Errorf("staged lag: connection to %s: %w", dst, err)
		}
		select {
		case at := <-clock.lines:
			return at.Sub(start), true, nil
		case <-time.After(stagedLagWait):
			return 0, false, nil
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
	// The readers bind their groups as they start: the first copies may
	// come before. Untimed connections until one is logged on each path.
	for _, path := range ConnPaths {
		dst := netip.AddrPortFrom(servers[path].IP, connPort).String()
		for i := 0; ; i++ {
			_, ok, err := connect(dst)
			if err != nil {
				return nil, err
			}
			if ok {
				break
			}
			if i == 10 {
				return nil, fmt.Errorf("staged lag: no staged log line for 10 connections to %s", dst)
			}
		}
	}

	res := &Result{}
	var all []time.Duration
	missing := 0
	for _, path := range ConnPaths {
		dst := netip.AddrPortFrom(servers[path].IP, connPort).String()
		var lags []time.Duration
		for range cfg.Conns {
			lag, ok, err := connect(dst)
			if err != nil {
				return nil, err
			}
			if !ok {
				missing++
				continue
			}
			lags = append(lags, lag)
		}
		cfg.Logf("staged lag: %s: %d lines of %d connections, p99 %v", path, len(lags), cfg.Conns, Percentile(lags, 99))
		res.Set("staged_log_lag_ms_p99_"+path, millis(Percentile(lags, 99)))
		all = append(all, lags...)
	}
	res.Set("staged_log_lag_ms_p50", millis(Percentile(all, 50)))
	res.Set("staged_log_lag_ms_p99", millis(Percentile(all, 99)))
	res.Set("staged_log_lag_ms_max", millis(Percentile(all, 100)))
	res.Set("staged_log_lines", len(all))
	res.Set("staged_log_missing", missing)
	return res, nil
}

// lineClock is the staged log readers' output: it notes when each line
// matching match is written (textlogger writes a line per call).
type lineClock struct {
	match []byte
	lines chan time.Time
}

func (c *lineClock) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.match) {
		select {
		case c.lines <- time.Now():
		default: // a line nobody waits for (a late one)
		}
	}
	return len(p), nil
}

// drain forgets lines of earlier connections that came after their wait.
func (c *lineClock) drain() {
	for {
		select {
		case <-c.lines:
		default:
			return
		}
	}
}
