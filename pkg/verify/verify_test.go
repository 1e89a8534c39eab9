package verify

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/textlogger"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
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

const scenarioPods = `
namespaces: [{name: x}, {name: y}]
pods:
  - {namespace: x, name: web, ip: 10.244.1.10, node: n1}
  - {namespace: y, name: client, ip: 10.244.1.20, node: n1}
`

const scenarioNoY = `
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: no-y}
    spec:
      tier: Admin
      priority: 10
      subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
      ingress:
        - {name: from-y, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}]}
`

// program has x/web and y/client on node n1; with deny, the Admin
// ClusterNetworkPolicy no-y denies ingress from y to x.
func program(t *testing.T, deny bool) *compile.Program {
	t.Helper()
	text := scenarioPods
	if deny {
		text += scenarioNoY
	}
	s, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return compile.Build(s.Input("n1", []string{"n1"}, nil))
}

var (
	denyFromY      = compile.VerifyInfo{Direction: compile.Ingress, Kind: compile.DenyKindClusterNetworkPolicy, Policy: "no-y", Tier: compile.TierAdmin, Rule: "from-y"}
	defaultIngress = compile.VerifyInfo{Allow: true, Direction: compile.Ingress, Kind: compile.VerifyKindDefault}
)

// logBuffer is a log output tests read while the verifier writes.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) joined() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newVerifier(t *testing.T, prog *compile.Program) (*Verifier, *evaluate.Evaluator, *logBuffer) {
	t.Helper()
	ev := &evaluate.Evaluator{}
	if prog != nil {
		ev.Swap(prog)
	}
	rec := &logBuffer{}
	v, err := New(Config{Node: "n1", Evaluator: ev, Logger: textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(rec)))}, nil)
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
	v, _, rec := newVerifier(t, program(t, true))
	v.Consumer().Deliver(denyFromY.ID(), syn(client, web, 80), time.Now())
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
	v, _, rec := newVerifier(t, program(t, true))
	v.Consumer().Deliver(defaultIngress.ID(), syn(client, web, 80), time.Now())
	if ver, dis := count(v, "allow"); ver != 1 || dis != 1 {
		t.Errorf("verified %v, disagreements %v; want 1, 1", ver, dis)
	}
	line := rec.joined()
	for _, want := range []string{`"Kernel verdict differs from the policy model"`, `src="y/client"`, `srcIP="10.244.1.20"`, `dst="x/web"`,
		`protocol="TCP"`, `port=80`, `direction="ingress"`, `kernel="allow"`, `kernelDecision="allow ingress by default (no policy decides)"`,
		`verifyId="` + defaultIngress.ID() + `"`, `model="deny"`, `modelReason="denied by ClusterNetworkPolicy no-y`, `node="n1"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %s:\n%s", want, line)
		}
	}
}

// A disagreement that a newer program resolves before it is confirmed
// (the kernel was ahead of the published program) is not counted.
func TestDisagreementSettles(t *testing.T) {
	v, ev, rec := newVerifier(t, program(t, true))
	v.after = func(_ time.Duration, f func()) {
		ev.Swap(program(t, false))
		f()
	}
	v.Consumer().Deliver(defaultIngress.ID(), syn(client, web, 80), time.Now())
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
	v, ev, _ := newVerifier(t, program(t, false))
	v.after = func(_ time.Duration, f func()) {
		ev.Swap(program(t, true))
		f()
	}
	v.Consumer().Deliver(denyFromY.ID(), syn(client, web, 80), time.Now())
	if ver, dis := count(v, "deny"); ver != 1 || dis != 0 {
		t.Errorf("verified %v, disagreements %v; want 1, 0", ver, dis)
	}
}

func TestDropped(t *testing.T) {
	v, ev, _ := newVerifier(t, nil)
	v.Consumer().Deliver(denyFromY.ID(), syn(client, web, 80), time.Now())
	ev.Swap(program(t, true))
	v.Consumer().Deliver("vunknown1", syn(client, web, 80), time.Now())
	v.Consumer().Deliver(denyFromY.ID(), []byte{0x45, 0}, time.Now())
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
	ev.Swap(program(t, true))
	v, err := New(Config{Evaluator: ev, ChecksPerSecond: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		v.Consumer().Deliver(denyFromY.ID(), syn(client, web, 80), time.Now())
	}
	if ver, _ := count(v, "deny"); ver != 5 {
		t.Errorf("verified %v, want 5", ver)
	}
	if got := testutil.ToFloat64(v.metrics.Dropped.WithLabelValues("rate_limit")); got != 15 {
		t.Errorf("dropped rate_limit %v, want 15", got)
	}
}
