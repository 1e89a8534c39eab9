package denylog

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// tcpSYN is an IPv4 TCP header pair from src:sport to dst:dport.
func tcpSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	b := make([]byte, 40)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], 40)
	b[8] = 64
	b[9] = 6
	s, d := src.As4(), dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[20:], sport)
	binary.BigEndian.PutUint16(b[22:], dport)
	b[33] = 0x02
	return b
}

// lineRecorder collects the lines a funcr logger writes.
type lineRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *lineRecorder) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = append(r.lines, args)
	}, funcr.Options{})
}

func (r *lineRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func testProgram() *compile.Program {
	pod := func(ns, name, ip string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:   corev1.PodSpec{NodeName: "n1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	in := compile.Input{
		NodeName: "n1",
		Namespaces: []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "y", Labels: map[string]string{"kubernetes.io/metadata.name": "y"}}},
		},
		Pods:  []*corev1.Pod{pod("x", "web", "10.244.1.10", map[string]string{"app": "web"}), pod("y", "client", "10.244.1.20", nil)},
		Nodes: []*corev1.Node{ct.Node("n1", []string{"172.18.0.1"})},
		ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{ct.CNP("no-y", "Admin", 10, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")),
			ct.CNPIngress(ct.CNPRule("from-y", "Deny", ct.ToNamespaces(ct.Sel("kubernetes.io/metadata.name", "y")))))},
	}
	return compile.Build(in)
}

func TestHandle(t *testing.T) {
	prog := testProgram()
	info := compile.DenyInfo{Kind: compile.DenyKindClusterNetworkPolicy, Policy: "no-y", Tier: compile.TierAdmin, Rule: "from-y", Direction: compile.Ingress}
	if _, ok := compile.DenyIDs(prog)[info.ID()]; !ok {
		t.Fatalf("program's deny ids %v lack %s", compile.DenyIDs(prog), info)
	}
	rec := &lineRecorder{}
	m := NewMetrics()
	l, err := New(Config{Node: "n1", Program: func() *compile.Program { return prog }, Logger: rec.logger(), FlowInterval: time.Minute, LinesPerSecond: 5}, m)
	if err != nil {
		t.Fatal(err)
	}
	client, web := netip.MustParseAddr("10.244.1.20"), netip.MustParseAddr("10.244.1.10")
	now := time.Unix(1000, 0)
	// One denied connection, its SYN retransmitted: one line.
	for i := 0; i < 3; i++ {
		l.Consumer().Deliver(info.ID(), tcpSYN(client, web, 40000, 80), now.Add(time.Duration(i)*time.Second))
	}
	lines := rec.all()
	if len(lines) != 1 {
		t.Fatalf("want 1 line, got %d: %v", len(lines), lines)
	}
	for _, want := range []string{`"msg"="Denied connection"`, `"src"="y/client"`, `"dst"="x/web"`, `"protocol"="TCP"`, `"port"=80`,
		`"direction"="ingress"`, `"policyKind"="ClusterNetworkPolicy"`, `"policy"="no-y"`, `"tier"="Admin"`, `"rule"="from-y"`, `"node"="n1"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line lacks %s: %s", want, lines[0])
		}
	}
	if got := testutil.ToFloat64(m.Denied.WithLabelValues(compile.DenyKindClusterNetworkPolicy, "no-y")); got != 3 {
		t.Errorf("denied connections metric %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("flow_rate_limit")); got != 2 {
		t.Errorf("flow-limited lines %v, want 2", got)
	}

	// A flood from distinct sources: at most the overall limit's burst.
	for i := 0; i < 1000; i++ {
		src := netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})
		l.Consumer().Deliver(info.ID(), tcpSYN(src, web, 40000, 80), now)
	}
	if n := len(rec.all()); n > 1+5 {
		t.Errorf("flood: %d lines, want at most 6", n)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("rate_limit")); got < 995 {
		t.Errorf("rate-limited lines %v, want at least 995", got)
	}

	// Unknown ids and garbage are counted, not logged.
	before := len(rec.all())
	l.Consumer().Deliver("dnothing", tcpSYN(client, web, 1, 80), now.Add(time.Hour))
	l.Consumer().Deliver(info.ID(), []byte{0x45, 0}, now.Add(time.Hour))
	if len(rec.all()) != before {
		t.Errorf("unknown id or bad packet logged: %v", rec.all()[before:])
	}
	if testutil.ToFloat64(m.Dropped.WithLabelValues("unknown_id")) != 1 || testutil.ToFloat64(m.Dropped.WithLabelValues("unparsable")) != 1 {
		t.Error("unknown id and unparsable packet not counted")
	}
	// Node addresses resolve to node names.
	if got := Endpoint(prog, netip.MustParseAddr("172.18.0.1")); got != "node:n1" {
		t.Errorf("endpoint(node address) = %s", got)
	}
}
