package staged

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/textlogger"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
)

// Conventions: one node n1 with pods x/a 10.244.1.1, x/b .2, x/c .3.
// x/deny-a (staged) would isolate x/a for ingress; x/deny-b (enforced)
// isolates x/b; the staged Admin ClusterNetworkPolicy let-c-to-b would
// accept x/c's connections to x/b (a staged allow on an isolated pod).
var (
	podA = netip.MustParseAddr("10.244.1.1")
	podB = netip.MustParseAddr("10.244.1.2")
	podC = netip.MustParseAddr("10.244.1.3")
)

func stagedMark(o metav1.Object) {
	o.SetAnnotations(map[string]string{compile.StagedAnnotation: "true"})
}

func testInput() compile.Input {
	pod := func(name string, ip netip.Addr) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, Labels: map[string]string{"pod": name}},
			Spec:   corev1.PodSpec{NodeName: "n1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}}
	}
	denyA := ct.NetPol("x", "deny-a", ct.Sel("pod", "a"), ct.Types(ct.PIn))
	stagedMark(denyA)
	letC := ct.CNP("let-c-to-b", "Admin", 10, ct.PodsSubject(ct.Sel(), ct.Sel("pod", "b")),
		ct.CNPIngress(ct.CNPRule("from-c", "Accept", ct.ToPods(ct.Sel(), ct.Sel("pod", "c")))))
	stagedMark(letC)
	return compile.Input{
		NodeName:        "n1",
		Namespaces:      []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{ct.NSName: "x"}}}},
		Pods:            []*corev1.Pod{pod("a", podA), pod("b", podB), pod("c", podC)},
		Policies:        ct.List(denyA, ct.NetPol("x", "deny-b", ct.Sel("pod", "b"), ct.Types(ct.PIn))),
		ClusterPolicies: []*npav1beta1.ClusterNetworkPolicy{letC},
	}
}

func TestDecide(t *testing.T) {
	prog := compile.Build(testInput())
	if got := strings.Join(prog.StagedPolicies, " "); got != "let-c-to-b x/deny-a" {
		t.Fatalf("StagedPolicies %q", got)
	}
	ps := NewPrograms(prog)
	for _, c := range []struct {
		what     string
		src, dst netip.Addr
		changed  bool
		would    Would
		policy   string
		reason   string
	}{
		{"a staged deny of an allowed connection", podC, podA, true, WouldDeny, "x/deny-a", "x/deny-a isolates x/a for ingress; no rule matched"},
		{"a staged allow of a denied connection", podC, podB, true, WouldAllow, "let-c-to-b", "allowed by ClusterNetworkPolicy let-c-to-b (Admin, priority 10) ingress rule from-c"},
		{"denied either way", podA, podB, false, WouldDeny, "", ""},
		{"no staged policy selects x/c", podA, podC, false, WouldAllow, "", ""},
	} {
		d := ps.Decide(nil, c.src, c.dst, compile.ProtoTCP, 80)
		if d.Changed() != c.changed {
			t.Errorf("%s: changed %v (enforced %s, staged %s), want %v", c.what, d.Changed(), d.Enforced.Reason(), d.Staged.Reason(), c.changed)
			continue
		}
		if d.Would() != c.would {
			t.Errorf("%s: would %s, want %s", c.what, d.Would(), c.would)
		}
		if c.changed && (d.Policy != c.policy || d.Reason != c.reason) {
			t.Errorf("%s: policy %q reason %q, want %q %q", c.what, d.Policy, d.Reason, c.policy, c.reason)
		}
	}
	in := testInput()
	in.Policies, in.ClusterPolicies = in.Policies[1:], nil
	if NewPrograms(compile.Build(in)) != nil {
		t.Error("programs of an input without staged policies")
	}
}

// syn is the first 40 bytes of a TCP SYN from src:sport to dst:dport
// (IPv4, no options), as the kernel copies it.
func syn(src, dst netip.Addr, sport, dport uint16) []byte {
	s, d := src.As4(), dst.As4()
	b := []byte{0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0}
	b = append(append(b, s[:]...), d[:]...)
	b = binary.BigEndian.AppendUint16(b, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	return append(b, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0)
}

// lines keeps what a text logger writes, one entry per line.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (ls *lines) Write(b []byte) (int, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.l = append(ls.l, string(b))
	return len(b), nil
}

func (ls *lines) all() []string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Clone(ls.l)
}

func TestHandle(t *testing.T) {
	prog := compile.Build(testInput())
	rec := &lines{}
	m := NewMetrics()
	cur := prog
	l, err := New(Config{Config: denylog.Config{Node: "n1", Program: func() *compile.Program { return cur },
		Logger: textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(rec))), FlowInterval: time.Minute, LinesPerSecond: 5}}, m)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	// A connection the staged policy would deny, its first packet copied
	// three times (retransmitted): one line, three counts.
	for i := 0; i < 3; i++ {
		l.Consumer().Deliver(compile.StagedLogPrefix, syn(podC, podA, 40000, 80), now.Add(time.Duration(i)*time.Second))
	}
	// One it would allow, one it would not change.
	l.Consumer().Deliver(compile.StagedLogPrefix, syn(podC, podB, 40001, 80), now)
	l.Consumer().Deliver(compile.StagedLogPrefix, syn(podA, podC, 40002, 80), now)
	lines := rec.all()
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %d: %v", len(lines), lines)
	}
	for i, wants := range [][]string{
		{`"Staged verdict"`, `src="x/c"`, `srcIP="10.244.1.3"`, `dst="x/a"`, `protocol="TCP"`, `port=80`, `would="deny"`,
			`enforced="allowed"`, `staged="denied"`, `policy="x/deny-a"`, `reason="x/deny-a isolates x/a for ingress; no rule matched"`, `node="n1"`},
		{`dst="x/b"`, `would="allow"`, `enforced="denied"`, `staged="allowed"`, `policy="let-c-to-b"`, `enforcedReason="x/deny-b isolates x/b for ingress; no rule matched"`},
	} {
		for _, want := range wants {
			if !strings.Contains(lines[i], want) {
				t.Errorf("line %d lacks %s: %s", i, want, lines[i])
			}
		}
	}
	if got := testutil.ToFloat64(m.Verdicts.WithLabelValues("x/deny-a", "deny")); got != 3 {
		t.Errorf("would-deny count %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.Verdicts.WithLabelValues("let-c-to-b", "allow")); got != 1 {
		t.Errorf("would-allow count %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("flow_rate_limit")); got != 2 {
		t.Errorf("flow-limited lines %v, want 2", got)
	}

	// Distinct connections flooding in: at most the overall limit's burst.
	for i := 0; i < 1000; i++ {
		l.Consumer().Deliver(compile.StagedLogPrefix, syn(podC, podA, 40000, uint16(1000+i)), now)
	}
	if n := len(rec.all()); n > 2+5 {
		t.Errorf("flood: %d lines, want at most 7", n)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues("rate_limit")); got < 995 {
		t.Errorf("rate-limited lines %v, want at least 995", got)
	}

	// Garbage, and copies once no staged policy is left, are counted.
	before := len(rec.all())
	l.Consumer().Deliver(compile.StagedLogPrefix, []byte{0x45, 0}, now.Add(time.Hour))
	in := testInput()
	in.Policies, in.ClusterPolicies = in.Policies[1:], nil
	cur = compile.Build(in)
	l.Consumer().Deliver(compile.StagedLogPrefix, syn(podC, podA, 40005, 80), now.Add(time.Hour))
	if len(rec.all()) != before {
		t.Errorf("bad packet or no staged policy logged: %v", rec.all()[before:])
	}
	if testutil.ToFloat64(m.Dropped.WithLabelValues("unparsable")) != 1 || testutil.ToFloat64(m.Dropped.WithLabelValues("no_program")) != 1 {
		t.Error("unparsable or no_program not counted")
	}
}
