package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

func requireRoot(t testing.TB, tools ...string) {
	t.Helper()
	testenv.Require(t, "netlab tests", testenv.Root("create network namespaces, veths and nftables rulesets (CAP_SYS_ADMIN, CAP_NET_ADMIN)"),
		testenv.Binaries(append([]string{"ip"}, tools...)...))
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func netnsWithPrefix(t testing.TB, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names
}

// leakSnapshot counts goroutines and socket/netns file descriptors.
type leakSnapshot struct{ goroutines, fds int }

func snapshot() leakSnapshot {
	s := leakSnapshot{goroutines: runtime.NumGoroutine()}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "net:") ||
			strings.HasPrefix(target, NetnsDir)) {
			s.fds++
		}
	}
	return s
}

func checkNoLeaks(t *testing.T, before leakSnapshot) {
	t.Helper()
	var now leakSnapshot
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if now = snapshot(); now.goroutines <= before.goroutines && now.fds <= before.fds {
			return
		}
	}
	buf := make([]byte, 1<<20)
	t.Errorf("leak after Close: goroutines %d -> %d, socket/netns fds %d -> %d\n%s",
		before.goroutines, now.goroutines, before.fds, now.fds, buf[:runtime.Stack(buf, true)])
}

type target struct {
	ep       Endpoint
	ips      []netip.Addr
	tcp, udp []uint16
}

func hasFamily(ips []netip.Addr, a netip.Addr) bool {
	for _, x := range ips {
		if x.Is4() == a.Is4() {
			return true
		}
	}
	return false
}

// allPairs builds TCP+UDP probes from every endpoint to every port/IP of
// every other endpoint, skipping address families the source lacks.
func allPairs(targets []target, timeout time.Duration) []ProbeReq {
	var reqs []ProbeReq
	for _, src := range targets {
		for _, dst := range targets {
			if src.ep == dst.ep {
				continue
			}
			for _, ip := range dst.ips {
				if !hasFamily(src.ips, ip) {
					continue
				}
				for _, p := range dst.tcp {
					reqs = append(reqs, ProbeReq{From: src.ep, To: ip, Port: p, Proto: TCP, Timeout: timeout})
				}
				for _, p := range dst.udp {
					reqs = append(reqs, ProbeReq{From: src.ep, To: ip, Port: p, Proto: UDP, Timeout: timeout})
				}
			}
		}
	}
	return reqs
}

func TestLab(t *testing.T) {
	requireRoot(t, "nft")
	before := snapshot()
	ctx := context.Background()
	prefix := RandomPrefix("nltest")

	nodePorts := NodeSpec{TCPPorts: []uint16{10250}, UDPPorts: []uint16{8472}}
	n1, n2 := nodePorts, nodePorts
	n1.Name, n2.Name = "n1", "n2"
	lab, err := New(Config{Prefix: prefix, Nodes: []NodeSpec{n1, n2}})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()

	pods := []PodSpec{
		{Name: "a", Node: "n1", IPs: []netip.Addr{mustAddr("10.0.1.10"), mustAddr("fd00:10:1::10")}},
		{Name: "b", Node: "n1", IPs: []netip.Addr{mustAddr("10.0.1.11")}},
		{Name: "c", Node: "n2", IPs: []netip.Addr{mustAddr("10.0.2.10"), mustAddr("fd00:10:2::10")}},
		{Name: "d", Node: "n2", IPs: []netip.Addr{mustAddr("fd00:10:2::11")}},
	}
	var targets []target
	for _, p := range pods {
		p.TCPPorts, p.UDPPorts = []uint16{80, 8080}, []uint16{53}
		if err := lab.AddPod(p); err != nil {
			t.Fatal(err)
		}
		targets = append(targets, target{Pod(p.Name), p.IPs, p.TCPPorts, p.UDPPorts})
	}
	ext := ExternalSpec{Name: "web", Node: "n1", IPs: []netip.Addr{mustAddr("192.0.2.10"), mustAddr("2001:db8::10")},
		TCPPorts: []uint16{80, 443}, UDPPorts: []uint16{53}}
	if err := lab.AddExternal(ext); err != nil {
		t.Fatal(err)
	}
	targets = append(targets, target{Ext(ext.Name), ext.IPs, ext.TCPPorts, ext.UDPPorts})
	for _, n := range lab.Nodes() {
		ips, err := lab.IPs(Node(n))
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, target{Node(n), ips, nodePorts.TCPPorts, nodePorts.UDPPorts})
	}
	if err := lab.AddPod(PodSpec{Name: "dup", Node: "n2", IPs: []netip.Addr{mustAddr("10.0.1.10")}}); err == nil {
		t.Error("AddPod with a duplicate IP succeeded")
	}
	// A failure half-way (second UDP bind fails) rolls everything back.
	if err := lab.AddPod(PodSpec{Name: "bad", Node: "n2", IPs: []netip.Addr{mustAddr("10.0.2.99")}, UDPPorts: []uint16{53, 53}}); err == nil {
		t.Error("AddPod with a duplicate UDP port succeeded")
	}
	if got := netnsWithPrefix(t, prefix+"-p-bad"); len(got) != 0 {
		t.Errorf("failed AddPod left namespaces %v", got)
	}
	if out, err := lab.NodeExec("n1", "ip", "route", "show", "10.0.2.99"); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("failed AddPod left a route on n1: %q %v", out, err)
	}

	// 1. Everything connects without a firewall, and the right server answers.
	reqs := allPairs(targets, 2*time.Second)
	start := time.Now()
	for _, r := range lab.ProbeMany(ctx, reqs, 64) {
		if r.Err != nil || !r.Connected || r.Responder != dstName(targets, r.To) {
			t.Errorf("%v: connected=%v err=%v reason=%q responder=%q", r.ProbeReq, r.Connected, r.Err, r.Reason, r.Responder)
		}
	}
	t.Logf("all-pairs: %d probes OK in %v", len(reqs), time.Since(start))

	// 2. Drop forwarded TCP/80 to pod a in n1: exactly those probes fail.
	ruleset := `
table inet netlabtest {
	chain forward_filter {
		type filter hook forward priority 0; policy accept;
		ip daddr 10.0.1.10 tcp dport 80 drop
		ip6 daddr fd00:10:1::10 tcp dport 80 drop
	}
}
`
	if out, err := lab.NodeExecInput("n1", []byte(ruleset), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	reqs = allPairs(targets, 500*time.Millisecond)
	blocked := 0
	for _, r := range lab.ProbeMany(ctx, reqs, 0) {
		// n1's own traffic to a goes through output, not forward.
		want := !(r.Proto == TCP && r.Port == 80 && dstName(targets, r.To) == "a" && r.From != Node("n1"))
		if !want {
			blocked++
		}
		if r.Err != nil || r.Connected != want {
			t.Errorf("with ruleset: %v: connected=%v want %v err=%v reason=%q", r.ProbeReq, r.Connected, want, r.Err, r.Reason)
		}
		if !want && r.Reason != "timeout" {
			t.Errorf("%v: reason %q, want timeout", r.ProbeReq, r.Reason)
		}
	}
	if blocked == 0 {
		t.Fatal("no probe expected to be blocked")
	}
	t.Logf("ruleset: %d/%d probes blocked as expected", blocked, len(reqs))
	ok, err := lab.Probe(ctx, Pod("c"), mustAddr("10.0.1.10"), 80, TCP, 300*time.Millisecond)
	if ok || err != nil {
		t.Errorf("Probe c->a:80 = %v, %v; want false, nil", ok, err)
	}
	if out, err := lab.NodeExec("n1", "nft", "flush", "ruleset"); err != nil {
		t.Fatalf("nft flush: %v %s", err, out)
	}
	if ok, err := lab.Probe(ctx, Pod("c"), mustAddr("10.0.1.10"), 80, TCP, time.Second); !ok || err != nil {
		t.Errorf("Probe c->a:80 after flush = %v, %v", ok, err)
	}

	// 3. Unreachable port and refused connections.
	r := lab.ProbeOne(ctx, ProbeReq{From: Pod("c"), To: mustAddr("10.0.1.10"), Port: 9999, Proto: TCP, Timeout: time.Second})
	if r.Connected || r.Err != nil || r.Reason != "refused" {
		t.Errorf("closed TCP port: %+v", r)
	}
	r = lab.ProbeOne(ctx, ProbeReq{From: Pod("c"), To: mustAddr("fd00:10:1::10"), Port: 9999, Proto: UDP, Timeout: time.Second})
	if r.Connected || r.Err != nil || r.Reason != "refused" {
		t.Errorf("closed UDP port: %+v", r)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if ok, err := lab.Probe(cctx, Pod("c"), mustAddr("10.0.1.10"), 80, TCP, time.Second); ok || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled probe = %v, %v", ok, err)
	}
	if _, err := lab.Probe(ctx, Pod("nope"), mustAddr("10.0.1.10"), 80, TCP, time.Second); err == nil {
		t.Error("probe from unknown pod: no error")
	}

	// 4. InNode really runs in the node namespace.
	err = lab.InNode("n1", func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			return fmt.Errorf("ip_forward=%q err=%v", b, err)
		}
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		if !strings.Contains(strings.Join(names, ","), "veth") {
			return fmt.Errorf("interfaces %v lack the pod veths", names)
		}
		return nil
	})
	if err != nil {
		t.Errorf("InNode: %v", err)
	}

	// 5. RemovePod.
	infoB, err := lab.Info(Pod("b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.RemovePod("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(infoB.NetnsPath); !os.IsNotExist(err) {
		t.Errorf("netns of removed pod still exists: %v", err)
	}
	if ok, err := lab.Probe(ctx, Pod("c"), mustAddr("10.0.1.11"), 80, TCP, 300*time.Millisecond); ok || err != nil {
		t.Errorf("probe to removed pod = %v, %v", ok, err)
	}
	if out, err := lab.NodeExec("n2", "ip", "route", "show", "10.0.1.11"); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("route to removed pod left on n2: %q %v", out, err)
	}
	if err := lab.AddPod(PodSpec{Name: "b", Node: "n2", IPs: []netip.Addr{mustAddr("10.0.1.11")}, TCPPorts: []uint16{80}}); err != nil {
		t.Fatalf("re-adding b on n2: %v", err)
	}
	if ok, err := lab.Probe(ctx, Pod("a"), mustAddr("10.0.1.11"), 80, TCP, time.Second); !ok || err != nil {
		t.Errorf("probe to re-added pod = %v, %v", ok, err)
	}

	// 6. Close removes everything, is idempotent and leaks nothing.
	if got := netnsWithPrefix(t, prefix); len(got) != 8 { // sw, 2 nodes, a b c d, web
		t.Errorf("namespaces before Close: %v", got)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if got := netnsWithPrefix(t, prefix); len(got) != 0 {
		t.Errorf("namespaces left after Close: %v", got)
	}
	if err := lab.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := lab.Probe(ctx, Pod("a"), mustAddr("10.0.2.10"), 80, TCP, time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("probe after Close: %v", err)
	}
	checkNoLeaks(t, before)
}

func dstName(targets []target, ip netip.Addr) string {
	for _, tg := range targets {
		for _, a := range tg.ips {
			if a == ip {
				return tg.ep.Name
			}
		}
	}
	return ""
}

// TestScale builds 2 nodes + 10 pods and measures probe throughput.
func TestScale(t *testing.T) {
	requireRoot(t)
	before := snapshot()
	ctx := context.Background()
	start := time.Now()
	lab, err := New(Config{Prefix: RandomPrefix("nltest"), Nodes: []NodeSpec{{Name: "n1"}, {Name: "n2"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	var pods []string
	for i := 0; i < 10; i++ {
		name := fmt.Sprintf("p%d", i)
		err := lab.AddPod(PodSpec{Name: name, Node: []string{"n1", "n2"}[i%2],
			IPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, 1, byte(i % 2), byte(10 + i)}), mustAddr(fmt.Sprintf("fd00:1::%d", 10+i))},
			TCPPorts: []uint16{80}, UDPPorts: []uint16{53}})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, name)
	}
	t.Logf("build 2 nodes + 10 pods: %v", time.Since(start))

	for _, proto := range []Proto{TCP, UDP} {
		var reqs []ProbeReq
		for i := 0; len(reqs) < 600; i++ {
			src, dst := pods[i%len(pods)], pods[(i/len(pods)+i+1)%len(pods)]
			if src == dst {
				continue
			}
			ips, _ := lab.IPs(Pod(dst))
			port := uint16(80)
			if proto == UDP {
				port = 53
			}
			reqs = append(reqs, ProbeReq{From: Pod(src), To: ips[i%2], Port: port, Proto: proto, Timeout: 5 * time.Second})
		}
		for round := 0; round < 3; round++ {
			start = time.Now()
			res := lab.ProbeMany(ctx, reqs, 600)
			el := time.Since(start)
			failed := 0
			for _, r := range res {
				if !r.Connected || r.Err != nil {
					failed++
					if failed < 5 {
						t.Errorf("%v: %v %q", r.ProbeReq, r.Err, r.Reason)
					}
				}
			}
			t.Logf("%d parallel %s probes: %v (%.0f probes/s), %d failed", len(reqs), proto, el, float64(len(reqs))/el.Seconds(), failed)
		}
	}
	start = time.Now()
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("close: %v", time.Since(start))
	checkNoLeaks(t, before)
}

func TestCleanupStale(t *testing.T) {
	requireRoot(t)
	prefix := RandomPrefix("nltest")
	lab, err := New(Config{Prefix: prefix, Nodes: []NodeSpec{{Name: "n1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.AddPod(PodSpec{Name: "a", Node: "n1", IPs: []netip.Addr{mustAddr("10.9.0.1")}, TCPPorts: []uint16{80}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := lab.Probe(context.Background(), Node("n1"), mustAddr("10.9.0.1"), 80, TCP, time.Second); !ok || err != nil {
		t.Errorf("node -> pod probe = %v, %v: %+v", ok, err, lab.ProbeOne(context.Background(), ProbeReq{From: Node("n1"), To: mustAddr("10.9.0.1"), Port: 80, Proto: TCP, Timeout: time.Second}))
	}
	// Simulate a crashed run: the namespaces are left behind.
	if got := netnsWithPrefix(t, prefix); len(got) != 3 {
		t.Fatalf("namespaces: %v", got)
	}
	if err := CleanupStale(prefix); err != nil {
		t.Fatal(err)
	}
	if got := netnsWithPrefix(t, prefix); len(got) != 0 {
		t.Errorf("left after CleanupStale: %v", got)
	}
	if err := lab.Close(); err != nil { // namespaces already gone: still fine
		t.Errorf("Close after CleanupStale: %v", err)
	}
	if err := CleanupStale(""); err == nil {
		t.Error("CleanupStale(\"\") accepted")
	}
}

// TestFirstIPv6PacketToNewHost: a datagram sent the moment AddPod and
// AddExternal return reaches the new host's IPv6 address, every time (the
// kernel installs an IPv6 address's local route from deferred work, even
// without DAD; before AddPod waited for it, about a third of such first
// packets were dropped).
func TestFirstIPv6PacketToNewHost(t *testing.T) {
	requireRoot(t)
	l, err := New(Config{Nodes: []NodeSpec{{Name: "node-1"}, {Name: "node-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.AddPod(PodSpec{Name: "client", Node: "node-2", IPs: []netip.Addr{mustAddr("fd00:10:244:2::31")}}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	lost := 0
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)})
		name := fmt.Sprintf("ext%d", i)
		if err := l.AddExternal(ExternalSpec{Name: name, Node: "node-1", IPs: []netip.Addr{ip}, UDPPorts: []uint16{53}}); err != nil {
			t.Fatal(err)
		}
		ok, err := l.Probe(context.Background(), Pod("client"), ip, 53, UDP, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d first datagrams to a new external host's IPv6 address were lost", lost, n)
	}
}
