package queue

// Real-kernel tests. They need root and create their own network namespaces
// (client -- router -- server, joined by veth pairs); the root namespace's
// firewall is never touched. All nftables rules live in the router namespace.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

const (
	testAllowMark = 0x20000
	testKubeMark  = 0x4000
	testQueueNum  = 7
	testTable     = "nftpolicy"
	testQueueCh   = "nfq"
)

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, "queue runtime tests", testenv.Root("create network namespaces, veth links and nftables rulesets"), testenv.Binaries("ip", "nft"))
}

func run(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func nsRun(t testing.TB, ns string, args ...string) string {
	t.Helper()
	return run(t, "", append([]string{"ip", "netns", "exec", ns}, args...)...)
}

func nft(t testing.TB, ns, script string) {
	t.Helper()
	run(t, script, "ip", "netns", "exec", ns, "nft", "-f", "-")
}

var nsSeq atomic.Int32

func newNetNS(t *testing.T, role string) string {
	t.Helper()
	name := fmt.Sprintf("nfpq-%s-%d-%d", role, os.Getpid(), nsSeq.Add(1))
	run(t, "", "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	nsRun(t, name, "ip", "link", "set", "lo", "up")
	return name
}

// inNS runs fn on a thread switched into the network namespace ns: sockets
// created by fn stay in ns.
func inNS[T any](ns string, fn func() (T, error)) (T, error) {
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		var zero T
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- res{zero, err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- res{zero, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{zero, err}
			return
		}
		v, err := fn()
		ch <- res{v, err}
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and exits with this goroutine
	}()
	r := <-ch
	return r.v, r.err
}

type topology struct {
	client, router, server string
	srv4, srv6             netip.Addr
}

func newTopology(t *testing.T) *topology {
	tp := &topology{
		client: newNetNS(t, "c"), router: newNetNS(t, "r"), server: newNetNS(t, "s"),
		srv4: netip.MustParseAddr("10.231.2.2"), srv6: netip.MustParseAddr("fd31:2::2"),
	}
	run(t, "", "ip", "-n", tp.client, "link", "add", "cr0", "type", "veth", "peer", "name", "rc0", "netns", tp.router)
	run(t, "", "ip", "-n", tp.server, "link", "add", "sr0", "type", "veth", "peer", "name", "rs0", "netns", tp.router)
	for _, c := range [][]string{
		{tp.client, "addr add 10.231.1.2/24 dev cr0", "addr add fd31:1::2/64 dev cr0 nodad", "link set cr0 up",
			"route add default via 10.231.1.1", "-6 route add default via fd31:1::1"},
		{tp.router, "addr add 10.231.1.1/24 dev rc0", "addr add fd31:1::1/64 dev rc0 nodad", "link set rc0 up",
			"addr add 10.231.2.1/24 dev rs0", "addr add fd31:2::1/64 dev rs0 nodad", "link set rs0 up"},
		{tp.server, "addr add 10.231.2.2/24 dev sr0", "addr add fd31:2::2/64 dev sr0 nodad", "link set sr0 up",
			"route add default via 10.231.2.1", "-6 route add default via fd31:2::1"},
	} {
		for _, cmd := range c[1:] {
			run(t, "", append([]string{"ip", "-n", c[0]}, strings.Fields(cmd)...)...)
		}
	}
	nsRun(t, tp.router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return tp
}

// routerRuleset is the router's inet table: the allow-mark rule first, then
// established and ct-mark-allowed traffic, then a jump to the dedicated queue
// chain, whose single xt rule InstallCompatQueueRule writes. prerouting sets
// kube-proxy's mark bit on every packet; postrouting counts the client's
// packets that leave towards the server.
func routerRuleset(kubeMark, markRule bool) string {
	pre := ""
	if kubeMark {
		pre = fmt.Sprintf("meta mark set %#x", testKubeMark)
	}
	first := fmt.Sprintf(`meta mark & %#[1]x == %#[1]x counter name "repeated" ct mark set ct mark or %#[1]x meta mark set meta mark and %#[2]x accept`,
		testAllowMark, ^uint32(testAllowMark))
	if !markRule {
		first = "# no allow-mark rule"
	}
	return fmt.Sprintf(`
table inet %[1]s {
	counter repeated { }
	counter ctallowed { }
	counter queued { }
	counter out_total { }
	counter out_kmark { }
	counter out_allowbit { }
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		%[2]s
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		%[4]s
		ct state established,related accept
		ct mark & %#[3]x == %#[3]x counter name "ctallowed" accept
		meta l4proto { tcp, udp } counter name "queued" jump %[5]s
	}
	chain %[5]s {
	}
	chain postrouting {
		type filter hook postrouting priority filter; policy accept;
		oifname != "rs0" return
		meta nfproto ipv4 ip saddr != 10.231.1.2 return
		meta nfproto ipv6 ip6 saddr != fd31:1::2 return
		counter name "out_total"
		meta mark & %#[6]x == %#[6]x counter name "out_kmark"
		meta mark & %#[3]x == %#[3]x counter name "out_allowbit"
	}
}
`, testTable, pre, testAllowMark, first, testQueueCh, testKubeMark)
}

func loadRouter(t *testing.T, tp *topology, kubeMark bool, qcfg queuerule.QueueRuleConfig) {
	t.Helper()
	loadRouterRules(t, tp, routerRuleset(kubeMark, true), qcfg)
}

func loadRouterRules(t *testing.T, tp *topology, ruleset string, qcfg queuerule.QueueRuleConfig) {
	t.Helper()
	nft(t, tp.router, fmt.Sprintf("table inet %s\ndelete table inet %s\n", testTable, testTable)+ruleset)
	installQueueRule(t, tp.router, qcfg)
}

func nftConn(t testing.TB, ns string) *nftables.Conn {
	t.Helper()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func installQueueRule(t testing.TB, ns string, qcfg queuerule.QueueRuleConfig) {
	t.Helper()
	c := nftConn(t, ns)
	if err := queuerule.InstallCompatQueueRule(c, testTable, testQueueCh, qcfg); err != nil {
		t.Fatal(err)
	}
	ok, err := queuerule.CheckCompatQueueRule(c, testTable, testQueueCh, qcfg)
	if err != nil || !ok {
		t.Fatalf("CheckCompatQueueRule after install = %v, %v", ok, err)
	}
}

func counter(t testing.TB, ns, name string) uint64 {
	t.Helper()
	out := nsRun(t, ns, "nft", "--json", "list", "counter", "inet", testTable, name)
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing counter %s: %v\n%s", name, err, out)
	}
	for _, o := range doc.Nftables {
		if o.Counter != nil {
			return o.Counter.Packets
		}
	}
	t.Fatalf("counter %s not found in %s", name, out)
	return 0
}

// echoServer listens on TCP addr in ns and echoes.
func echoServer(t *testing.T, ns, addr string) {
	t.Helper()
	l, err := inNS(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

// udpSink listens on UDP addr in ns, never replies, and counts datagrams.
func udpSink(t *testing.T, ns, addr string) *atomic.Int64 {
	t.Helper()
	pc, err := inNS(ns, func() (net.PacketConn, error) { return net.ListenPacket("udp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var n atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return &n
}

// tcpEcho connects from ns to addr, and checks that a message comes back.
func tcpEcho(ns, addr string, timeout time.Duration) error {
	_, err := inNS(ns, func() (struct{}, error) {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return struct{}{}, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		msg := []byte("hello through the router")
		if _, err := c.Write(msg); err != nil {
			return struct{}{}, err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return struct{}{}, err
		}
		if !bytes.Equal(got, msg) {
			return struct{}{}, fmt.Errorf("echo %q, want %q", got, msg)
		}
		return struct{}{}, nil
	})
	return err
}

// logBuf returns what a ktesting logger with BufferLogs has logged.
func logBuf(l klog.Logger) string {
	return l.GetSink().(ktesting.Underlier).GetBuffer().String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type flowKey struct {
	family, proto uint8
	dport         uint16
}

// countingDecider allows TCP 80 and UDP 53, denies everything else, and counts
// the packets it was asked about.
type countingDecider struct {
	mu   sync.Mutex
	seen map[flowKey]int
}

func (d *countingDecider) Decide(p Packet) (bool, string) {
	d.mu.Lock()
	if d.seen == nil {
		d.seen = map[flowKey]int{}
	}
	d.seen[flowKey{p.Family, p.Proto, p.DstPort}]++
	d.mu.Unlock()
	switch {
	case p.Proto == unix.IPPROTO_TCP && p.DstPort == 80, p.Proto == unix.IPPROTO_UDP && p.DstPort == 53:
		return true, "test: allowed port"
	}
	return false, fmt.Sprintf("test: port %d not allowed", p.DstPort)
}

func (d *countingDecider) count(family, proto uint8, dport uint16) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[flowKey{family, proto, dport}]
}

type countingObserver struct{ allow, deny atomic.Int64 }

func (o *countingObserver) ObserveVerdict(allow bool, proto, family uint8, d time.Duration) {
	if allow {
		o.allow.Add(1)
	} else {
		o.deny.Add(1)
	}
}

// startRuntime runs r.Run on a thread locked into ns (setns before the queue
// sockets are opened; they keep that namespace).
func startRuntime(t *testing.T, ns string, cfg RuntimeConfig, d Decider) *Runtime {
	t.Helper()
	r, err := NewRuntime(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			errc <- err
			return
		}
		errc <- r.Run(ctx)
	}()
	select {
	case <-r.Ready():
	case err := <-errc:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("runtime not ready after 10s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

func TestRuntimeKernel(t *testing.T) {
	requireRoot(t)
	tp := newTopology(t)
	qcfg := queuerule.QueueRuleConfig{QueueNum: testQueueNum, Queues: 2, Fanout: true, Bypass: false, Counter: true, Comment: "nftpolicy queue"}
	loadRouter(t, tp, true, qcfg)
	echoServer(t, tp.server, ":80") // IPv4 and IPv6
	echoServer(t, tp.server, ":81") // denied port, listener present
	sink := udpSink(t, tp.server, "10.231.2.2:53")

	dec := &countingDecider{}
	obs := &countingObserver{}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
	rt := startRuntime(t, tp.router, RuntimeConfig{
		QueueNum: testQueueNum, Queues: 2, AllowMark: testAllowMark, Logger: logger, Observer: obs,
	}, dec)

	t.Run("kernel queue stats", func(t *testing.T) {
		st, err := inNS(tp.router, ReadKernelQueueStats)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 2 {
			t.Fatalf("ReadKernelQueueStats() = %+v, want queues %d and %d", st, testQueueNum, testQueueNum+1)
		}
		for i, q := range st {
			if q.QueueNum != uint16(testQueueNum+i) || q.CopyMode != 2 || q.CopyRange != DefaultCopyRange || q.PeerPortID == 0 {
				t.Errorf("queue %d: %+v, want number %d, copy mode 2 (packet), copy range %d", i, q, testQueueNum+i, DefaultCopyRange)
			}
		}
	})

	t.Run("tcp 80 allowed", func(t *testing.T) {
		repeatedBefore := counter(t, tp.router, "repeated")
		if err := tcpEcho(tp.client, "10.231.2.2:80", 3*time.Second); err != nil {
			t.Fatalf("TCP 80: %v", err)
		}
		if n := dec.count(4, unix.IPPROTO_TCP, 80); n != 1 {
			t.Errorf("decider saw %d packets of the TCP 80 connection, want 1 (the SYN)", n)
		}
		// NF_REPEAT re-entered the base chain from the top, where the first
		// rule saw the verdict's mark: once per allowed connection.
		if d := counter(t, tp.router, "repeated") - repeatedBefore; d != 1 {
			t.Errorf("allow-mark rule matched %d times, want 1 (NF_REPEAT re-entry with the verdict mark)", d)
		}
	})

	t.Run("tcp 81 denied", func(t *testing.T) {
		err := tcpEcho(tp.client, "10.231.2.2:81", 1500*time.Millisecond)
		if err == nil {
			t.Fatal("TCP 81 connected, want it blocked")
		}
		if n := dec.count(4, unix.IPPROTO_TCP, 81); n < 1 {
			t.Errorf("decider saw %d packets for TCP 81, want >= 1", n)
		}
		if !strings.Contains(logBuf(logger), "port 81 not allowed") {
			t.Error("denial of TCP 81 not logged with its reason")
		}
	})

	t.Run("ipv6 tcp", func(t *testing.T) {
		if err := tcpEcho(tp.client, "[fd31:2::2]:80", 3*time.Second); err != nil {
			t.Errorf("IPv6 TCP 80: %v", err)
		}
		if n := dec.count(6, unix.IPPROTO_TCP, 80); n != 1 {
			t.Errorf("decider saw %d packets of the IPv6 TCP 80 connection, want 1", n)
		}
		if err := tcpEcho(tp.client, "[fd31:2::2]:81", 1500*time.Millisecond); err == nil {
			t.Error("IPv6 TCP 81 connected, want it blocked")
		}
		if n := dec.count(6, unix.IPPROTO_TCP, 81); n < 1 {
			t.Errorf("decider saw %d IPv6 TCP 81 packets, want >= 1", n)
		}
	})

	t.Run("udp flow queued once", func(t *testing.T) { checkUDPFlowQueuedOnce(t, tp, dec, sink) })

	t.Run("marks", func(t *testing.T) {
		total, kmark, allowbit := counter(t, tp.router, "out_total"), counter(t, tp.router, "out_kmark"), counter(t, tp.router, "out_allowbit")
		if total == 0 || kmark != total {
			t.Errorf("packets towards the server: %d, with mark 0x4000: %d; want all (the verdict must keep foreign mark bits)", total, kmark)
		}
		if allowbit != 0 {
			t.Errorf("%d packets left with the allow bit in the packet mark, want 0", allowbit)
		}
	})

	t.Run("stats", func(t *testing.T) { checkRuntimeStats(t, tp, rt, obs) })
}

// checkUDPFlowQueuedOnce sends a 5-datagram UDP flow without replies: only
// its first datagram is queued, the conntrack mark accepts the others.
func checkUDPFlowQueuedOnce(t *testing.T, tp *topology, dec *countingDecider, sink *atomic.Int64) {
	queuedBefore, ctBefore := counter(t, tp.router, "queued"), counter(t, tp.router, "ctallowed")
	_, err := inNS(tp.client, func() (struct{}, error) {
		c, err := net.Dial("udp", "10.231.2.2:53")
		if err != nil {
			return struct{}{}, err
		}
		defer c.Close()
		for i := 0; i < 5; i++ {
			if _, err := c.Write([]byte(fmt.Sprintf("datagram %d", i))); err != nil {
				return struct{}{}, err
			}
			time.Sleep(20 * time.Millisecond)
		}
		return struct{}{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "5 datagrams at the server", func() bool { return sink.Load() == 5 })
	if n := dec.count(4, unix.IPPROTO_UDP, 53); n != 1 {
		t.Errorf("decider saw %d datagrams of a 5-datagram UDP flow without replies, want exactly 1", n)
	}
	if d := counter(t, tp.router, "queued") - queuedBefore; d != 1 {
		t.Errorf("queue rule reached %d times, want 1", d)
	}
	// The 4 later datagrams (ct state still new: no reply) were accepted
	// by the conntrack mark that the first one's verdict led to.
	if d := counter(t, tp.router, "ctallowed") - ctBefore; d != 4 {
		t.Errorf("ct-mark rule accepted %d datagrams, want 4", d)
	}
}

// checkRuntimeStats checks the runtime's counters against its observer's
// and the router's allow-mark rule.
func checkRuntimeStats(t *testing.T, tp *topology, rt *Runtime, obs *countingObserver) {
	s := rt.Stats()
	if s.Allowed() < 2 || s.Denied() < 3 {
		t.Errorf("Stats() = %+v, want >= 2 allowed and >= 3 denied", s)
	}
	if int64(s.Allowed()) != obs.allow.Load() || int64(s.Denied()) != obs.deny.Load() {
		t.Errorf("observer saw %d/%d allow/deny, stats %d/%d", obs.allow.Load(), obs.deny.Load(), s.Allowed(), s.Denied())
	}
	if s.UnparsableDropped+s.VerdictErrors+s.Malformed+s.MarkLoops != 0 {
		t.Errorf("unexpected errors in %+v", s)
	}
	if r := counter(t, tp.router, "repeated"); r != s.Allowed() {
		t.Errorf("allow-mark rule matched %d times, runtime allowed %d packets", r, s.Allowed())
	}
	t.Logf("stats: %+v", s)
}

// TestRuntimeKernelNoListener checks the rule's bypass flag: without a bound
// queue, packets are dropped, unless the rule has bypass (fail-open).
func TestRuntimeKernelNoListener(t *testing.T) {
	requireRoot(t)
	tp := newTopology(t)
	echoServer(t, tp.server, "0.0.0.0:80")

	loadRouter(t, tp, false, queuerule.QueueRuleConfig{QueueNum: testQueueNum})
	if err := tcpEcho(tp.client, "10.231.2.2:80", 1500*time.Millisecond); err == nil {
		t.Error("without listener and without bypass: TCP 80 connected, want it dropped")
	}
	if counter(t, tp.router, "queued") == 0 {
		t.Error("no packet reached the queue rule")
	}

	installQueueRule(t, tp.router, queuerule.QueueRuleConfig{QueueNum: testQueueNum, Bypass: true})
	if err := tcpEcho(tp.client, "10.231.2.2:80", 3*time.Second); err != nil {
		t.Errorf("without listener, with bypass: %v, want the connection to pass", err)
	}
}

// TestRuntimeKernelMissingMarkRule: without the allow-mark rule, the
// repeated packet would be queued again forever; the Runtime accepts a packet
// that already carries the allow mark and counts it.
func TestRuntimeKernelMissingMarkRule(t *testing.T) {
	requireRoot(t)
	tp := newTopology(t)
	echoServer(t, tp.server, ":80")
	loadRouterRules(t, tp, routerRuleset(false, false), queuerule.QueueRuleConfig{QueueNum: testQueueNum})
	dec := &countingDecider{}
	rt := startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark}, dec)
	if err := tcpEcho(tp.client, "10.231.2.2:80", 3*time.Second); err != nil {
		t.Fatalf("TCP 80: %v", err)
	}
	s := rt.Stats()
	if n := dec.count(4, unix.IPPROTO_TCP, 80); n != 1 || s.MarkLoops != 1 || s.Allowed() != 1 {
		t.Errorf("decider calls %d, stats %+v; want 1 decision, 1 mark loop", n, s)
	}
}

// TestRuntimeKernelFailOpenQueueFull: while the queue is full (the Decider
// holds the only slot), further packets are dropped, with FailOpen too:
// the kernel's fail-open flag is never set, so whoever fills the queue
// cannot get the packets that overflow it accepted.
func TestRuntimeKernelFailOpenQueueFull(t *testing.T) {
	requireRoot(t)
	for _, failOpen := range []bool{true, false} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			tp := newTopology(t)
			echoServer(t, tp.server, "0.0.0.0:80")
			echoServer(t, tp.server, "0.0.0.0:81")
			loadRouter(t, tp, false, queuerule.QueueRuleConfig{QueueNum: testQueueNum})

			release := make(chan struct{})
			held := make(chan struct{}, 1)
			var calls atomic.Int32
			dec := DeciderFunc(func(p Packet) (bool, string) {
				if calls.Add(1) == 1 {
					held <- struct{}{}
					<-release
				}
				return p.DstPort == 80, "test"
			})
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			rt := startRuntime(t, tp.router, RuntimeConfig{QueueNum: testQueueNum, AllowMark: testAllowMark, FailOpen: failOpen, MaxQueueLen: 1, Logger: logger}, dec)
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			t.Cleanup(unblock)

			// First connection: its SYN is held by the Decider (the kernel
			// queue holds it until the verdict).
			first := make(chan error, 1)
			go func() { first <- tcpEcho(tp.client, "10.231.2.2:80", 5*time.Second) }()
			select {
			case <-held:
			case <-time.After(5 * time.Second):
				t.Fatal("first packet never reached the decider")
			}
			// Second connection, to a port the Decider would deny: with the
			// queue full it is dropped.
			if err := tcpEcho(tp.client, "10.231.2.2:81", 1500*time.Millisecond); err == nil {
				t.Errorf("queue full, failOpen=%v: TCP 81 connected, want it dropped", failOpen)
			}
			st, serr := inNS(tp.router, ReadKernelQueueStats)
			if serr != nil || len(st) != 1 {
				t.Fatalf("ReadKernelQueueStats = %+v, %v", st, serr)
			}
			if st[0].QueueDropped == 0 {
				t.Errorf("kernel queue_dropped = 0, want > 0 (%+v)", st[0])
			}
			// The overflow watcher looks once a second: the drops are
			// counted and logged.
			waitFor(t, "the overflow watcher to count and log the drops", func() bool {
				s := rt.Stats()
				return s.OverflowDropped > 0 && s.OverflowLogs == 1
			})
			if !strings.Contains(logBuf(logger), "Queue full") {
				t.Error("queue overflow not logged")
			}
			unblock()
			if err := <-first; err != nil {
				t.Errorf("held TCP 80 connection: %v", err)
			}
		})
	}
}

// TestCompatQueueRuleListingAndNftTransactions checks what nft prints for the
// xt rule, and that nft (and knftables) transactions on other chains of the
// same table work and leave it alone.
func TestCompatQueueRuleListingAndNftTransactions(t *testing.T) {
	requireRoot(t)
	ns := newNetNS(t, "k")
	nft(t, ns, fmt.Sprintf(`
table inet %[1]s {
	set allowed { type ipv4_addr; }
	chain forward {
		type filter hook forward priority filter; policy accept;
		ip saddr @allowed accept
		jump %[2]s
	}
	chain %[2]s {
	}
	chain other {
		counter
	}
}
`, testTable, testQueueCh))
	qcfg := queuerule.QueueRuleConfig{QueueNum: 3, Queues: 2, Bypass: true, Fanout: true, Comment: "nftpolicy-queue"}
	installQueueRule(t, ns, qcfg)
	conn := nftConn(t, ns)

	// Listing.
	text := nsRun(t, ns, "nft", "list", "ruleset")
	if !strings.Contains(text, "queue num 3-4 bypass,fanout") {
		t.Errorf("nft list ruleset: want the libxtables translation 'queue num 3-4 bypass,fanout', got\n%s", text)
	}
	t.Logf("nft list ruleset (stdout+stderr):\n%s", text)
	js := run(t, "", "ip", "netns", "exec", ns, "nft", "--json", "list", "chain", "inet", testTable, testQueueCh)
	if !strings.Contains(js, `{"xt": {"type": "target", "name": "NFQUEUE"}}`) {
		t.Errorf("nft --json: want an xt target, got %s", js)
	}

	// Re-installing replaces the rule (still exactly one).
	qcfg2 := qcfg
	qcfg2.QueueNum = 10
	installQueueRule(t, ns, qcfg2)
	if ok, _ := queuerule.CheckCompatQueueRule(conn, testTable, testQueueCh, qcfg); ok {
		t.Error("old queue rule still matches after reinstall")
	}

	// nft -f transactions on other chains, sets and elements.
	for i, tx := range []string{
		fmt.Sprintf("add element inet %s allowed { 10.0.0.1 }", testTable),
		fmt.Sprintf("flush chain inet %s other\nadd rule inet %s other ip daddr 10.0.0.2 counter drop", testTable, testTable),
		fmt.Sprintf("add chain inet %[1]s extra\nadd rule inet %[1]s extra counter\nflush chain inet %[1]s other\ndelete chain inet %[1]s extra", testTable),
		fmt.Sprintf("add table inet %[1]s\nadd chain inet %[1]s %[2]s\nadd set inet %[1]s allowed { type ipv4_addr; }\nflush set inet %[1]s allowed", testTable, testQueueCh),
	} {
		nft(t, ns, tx)
		if ok, err := queuerule.CheckCompatQueueRule(conn, testTable, testQueueCh, qcfg2); !ok || err != nil {
			t.Fatalf("nft transaction %d (%q) disturbed the queue rule: %v, %v", i, tx, ok, err)
		}
	}

	// knftables, driving the nft binary from a thread in ns.
	_, err := inNS(ns, func() (struct{}, error) {
		nf, err := knftables.New(knftables.InetFamily, testTable)
		if err != nil {
			return struct{}{}, err
		}
		tx := nf.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: testQueueCh}) // add of an existing chain: no-op
		tx.Add(&knftables.Chain{Name: "other"})
		tx.Flush(&knftables.Chain{Name: "other"})
		tx.Add(&knftables.Rule{Chain: "other", Rule: "ip daddr 10.0.0.3 counter drop", Comment: knftables.PtrTo("knftables rule")})
		tx.Add(&knftables.Element{Set: "allowed", Key: []string{"10.0.0.4"}})
		if err := nf.Run(context.Background(), tx); err != nil {
			return struct{}{}, fmt.Errorf("knftables transaction: %w", err)
		}
		rules, err := nf.ListRules(context.Background(), "other")
		if err != nil || len(rules) != 1 {
			return struct{}{}, fmt.Errorf("ListRules(other) = %v, %v", rules, err)
		}
		if _, err := nf.ListRules(context.Background(), testQueueCh); err != nil {
			return struct{}{}, fmt.Errorf("ListRules(%s) with the xt rule: %w", testQueueCh, err)
		}
		if _, err := nf.List(context.Background(), "chains"); err != nil {
			return struct{}{}, err
		}
		if _, err := nf.ListElements(context.Background(), "set", "allowed"); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := queuerule.CheckCompatQueueRule(conn, testTable, testQueueCh, qcfg2); !ok || err != nil {
		t.Fatalf("knftables transaction disturbed the queue rule: %v, %v", ok, err)
	}

	// Flushing the dedicated chain removes the rule: callers reinstall.
	nft(t, ns, fmt.Sprintf("flush chain inet %s %s", testTable, testQueueCh))
	if ok, _ := queuerule.CheckCompatQueueRule(conn, testTable, testQueueCh, qcfg2); ok {
		t.Error("rule reported present after flushing its chain")
	}
}

// TestProbeQueueVariant checks the probe and that the native statements parse
// (on a kernel without nft_queue they fail with the missing-expression error,
// which ProbeNativeQueue tells apart from a syntax error).
func TestProbeQueueVariant(t *testing.T) {
	requireRoot(t)
	v, err := queuerule.ProbeQueueVariant(context.Background())
	if err != nil {
		t.Fatalf("ProbeQueueVariant: %v", err)
	}
	t.Logf("queue variant: %s", v)
	zcfg := "/proc/config.gz"
	if out, err := exec.Command("sh", "-c", "zcat "+zcfg+" | grep -E '^(# )?CONFIG_NFT_QUEUE[ =]'").Output(); err == nil {
		switch {
		case strings.Contains(string(out), "is not set") && v != compile.QueueXTCompat:
			t.Errorf("CONFIG_NFT_QUEUE off but variant %s", v)
		case strings.Contains(string(out), "=") && v != compile.QueueNative:
			t.Errorf("CONFIG_NFT_QUEUE on but variant %s", v)
		}
	}

	ns := newNetNS(t, "p")
	for _, cfg := range []queuerule.QueueRuleConfig{
		{QueueNum: 3},
		{QueueNum: 3, Bypass: true},
		{QueueNum: 0, Queues: 2, Bypass: true, Fanout: true},
		{QueueNum: 10, Queues: 4},
	} {
		stmt := queuerule.NativeQueueStatement(cfg)
		def := fmt.Sprintf("table inet t {\n\tchain c {\n\t\ttype filter hook forward priority 0;\n\t\t%s\n\t}\n}\n", stmt)
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
		cmd.Stdin = strings.NewReader(def)
		out, err := cmd.CombinedOutput()
		switch {
		case err == nil:
			if v != compile.QueueNative {
				t.Errorf("%q accepted by the kernel, but variant %s", stmt, v)
			}
		case strings.Contains(string(out), "syntax error"):
			t.Errorf("%q: nft syntax error: %s", stmt, out)
		case !strings.Contains(string(out), "No such file or directory"):
			t.Errorf("%q: unexpected error: %s", stmt, out)
		}
	}
	// ProbeNativeQueue (in ns) must not report a syntax error as "not native".
	native, err := inNS(ns, func() (bool, error) { return queuerule.ProbeNativeQueue(context.Background()) })
	if err != nil || native != (v == compile.QueueNative) {
		t.Errorf("ProbeNativeQueue = %v, %v", native, err)
	}
	queuerule.NFTBinary = "sh"
	defer func() { queuerule.NFTBinary = "nft" }()
	_, err = inNS(ns, func() (bool, error) { return queuerule.ProbeNativeQueue(context.Background()) })
	if err == nil {
		t.Error("ProbeNativeQueue with a broken nft binary: want an error")
	}
}
