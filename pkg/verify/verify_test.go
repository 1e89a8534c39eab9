package verify

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
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

var (
	web    = netip.MustParseAddr("10.244.1.10")
	client = netip.MustParseAddr("10.244.1.20")
)

// syn is an IPv4 TCP SYN from src to dst:dport.
func syn(src, dst netip.Addr, dport uint16) []byte {
	b := make([]byte, 40)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], 40)
	b[8], b[9] = 64, 6
	s, d := src.As4(), dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[20:], 40000)
	binary.BigEndian.PutUint16(b[22:], dport)
	b[33] = 0x02
	return b
}

// program has x/web and y/client on node n1; with deny, the Admin
// ClusterNetworkPolicy no-y denies ingress from y to x.
func program(deny bool) *compile.Program {
	pod := func(ns, name string, ip netip.Addr) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:   corev1.PodSpec{NodeName: "n1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}}
	}
	in := compile.Input{
		NodeName: "n1",
		Namespaces: []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "y", Labels: map[string]string{"kubernetes.io/metadata.name": "y"}}},
		},
		Pods:  []*corev1.Pod{pod("x", "web", web), pod("y", "client", client)},
		Nodes: []*corev1.Node{ct.Node("n1", []string{"172.18.0.1"})},
	}
	if deny {
		in.ClusterPolicies = []*npav1beta1.ClusterNetworkPolicy{ct.CNP("no-y", "Admin", 10, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")),
			ct.CNPIngress(ct.CNPRule("from-y", "Deny", ct.ToNamespaces(ct.Sel("kubernetes.io/metadata.name", "y")))))}
	}
	return compile.Build(in)
}

var (
	denyFromY      = compile.VerifyInfo{Direction: compile.Ingress, Kind: compile.DenyKindClusterNetworkPolicy, Policy: "no-y", Tier: compile.TierAdmin, Rule: "from-y"}
	defaultIngress = compile.VerifyInfo{Allow: true, Direction: compile.Ingress, Kind: compile.VerifyKindDefault}
)

type lines struct {
	mu  sync.Mutex
	all []string
}

func (r *lines) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.all = append(r.all, args)
	}, funcr.Options{})
}

func (r *lines) joined() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.all, "\n")
}

func newVerifier(t *testing.T, prog *compile.Program) (*Verifier, *evaluate.Evaluator, *lines) {
	t.Helper()
	ev := &evaluate.Evaluator{}
	if prog != nil {
		ev.Swap(prog)
	}
	rec := &lines{}
	v, err := New(Config{Node: "n1", Evaluator: ev, Logger: rec.logger()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v.after = func(_ time.Duration, f func()) { f() }
	return v, ev, rec
}

func count(v *Verifier, kernel string) (verified, disagreements float64) {
	return testutil.ToFloat64(v.metrics.Verified.WithLabelValues(kernel)), testutil.ToFloat64(v.metrics.Disagreements.WithLabelValues(kernel))
}

// A kernel verdict the model shares is counted as verified, and nothing
// else.
func TestAgreement(t *testing.T) {
	v, _, rec := newVerifier(t, program(true))
	v.Handle(denyFromY.ID(), syn(client, web, 80))
	if ver, dis := count(v, "deny"); ver != 1 || dis != 0 {
		t.Errorf("verified %v, disagreements %v; want 1, 0", ver, dis)
	}
	if rec.joined() != "" {
		t.Errorf("logged: %s", rec.joined())
	}
}

// The kernel let through, by default, what the model denies (a subject
// missing from the kernel's dispatch map): counted and logged with both
// verdicts, the model's reason and the kernel's decision.
func TestDisagreement(t *testing.T) {
	v, _, rec := newVerifier(t, program(true))
	v.Handle(defaultIngress.ID(), syn(client, web, 80))
	if ver, dis := count(v, "allow"); ver != 1 || dis != 1 {
		t.Errorf("verified %v, disagreements %v; want 1, 1", ver, dis)
	}
	line := rec.joined()
	for _, want := range []string{`"Kernel verdict differs from the policy model"`, `"src"="y/client"`, `"srcIP"="10.244.1.20"`, `"dst"="x/web"`,
		`"protocol"="TCP"`, `"port"=80`, `"direction"="ingress"`, `"kernel"="allow"`, `"kernelDecision"="allow ingress by default (no policy decides)"`,
		`"verifyId"="` + defaultIngress.ID() + `"`, `"model"="deny"`, `"modelReason"="denied by ClusterNetworkPolicy no-y`, `"node"="n1"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %s:\n%s", want, line)
		}
	}
}

// A disagreement that a newer program resolves before it is confirmed
// (the kernel was ahead of the published program) is not counted.
func TestDisagreementSettles(t *testing.T) {
	v, ev, rec := newVerifier(t, program(true))
	v.after = func(_ time.Duration, f func()) {
		ev.Swap(program(false))
		f()
	}
	v.Handle(defaultIngress.ID(), syn(client, web, 80))
	if ver, dis := count(v, "allow"); ver != 1 || dis != 0 {
		t.Errorf("verified %v, disagreements %v; want 1, 0", ver, dis)
	}
	if strings.Contains(rec.joined(), "differs") {
		t.Errorf("logged: %s", rec.joined())
	}
}

// A sample of a rule the published program does not have yet (the kernel
// is ahead) is resolved after the settling time.
func TestUnknownIDSettles(t *testing.T) {
	v, ev, _ := newVerifier(t, program(false))
	v.after = func(_ time.Duration, f func()) {
		ev.Swap(program(true))
		f()
	}
	v.Handle(denyFromY.ID(), syn(client, web, 80))
	if ver, dis := count(v, "deny"); ver != 1 || dis != 0 {
		t.Errorf("verified %v, disagreements %v; want 1, 0", ver, dis)
	}
}

func TestDropped(t *testing.T) {
	v, ev, _ := newVerifier(t, nil)
	v.Handle(denyFromY.ID(), syn(client, web, 80))
	ev.Swap(program(true))
	v.Handle("vunknown1", syn(client, web, 80))
	v.Handle(denyFromY.ID(), []byte{0x45, 0})
	for _, reason := range []string{"no_program", "unknown_id", "unparsable"} {
		if got := testutil.ToFloat64(v.metrics.Dropped.WithLabelValues(reason)); got != 1 {
			t.Errorf("dropped %s: %v, want 1", reason, got)
		}
	}
	if ver, _ := count(v, "deny"); ver != 0 {
		t.Errorf("verified %v, want 0", ver)
	}
}

// The checks per second bound what a flood of samples costs.
func TestChecksRateLimited(t *testing.T) {
	ev := &evaluate.Evaluator{}
	ev.Swap(program(true))
	v, err := New(Config{Evaluator: ev, ChecksPerSecond: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		v.Handle(denyFromY.ID(), syn(client, web, 80))
	}
	if ver, _ := count(v, "deny"); ver != 5 {
		t.Errorf("verified %v, want 5", ver)
	}
	if got := testutil.ToFloat64(v.metrics.Dropped.WithLabelValues("rate_limit")); got != 15 {
		t.Errorf("dropped rate_limit %v, want 15", got)
	}
}
