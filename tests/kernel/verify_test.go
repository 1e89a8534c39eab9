package kernel

// Runtime verification on the real kernel: the ruleset samples every
// deciding rule's verdict to an NFLOG group in each node's namespace, and
// a verify.Verifier per node decides the samples again with that node's
// evaluator.

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

const verifyGroup, verifyDenyLogGroup = 12, 11

// everySample samples every decision, with a per-source budget no probe
// set reaches.
var everySample = compile.VerifyConfig{Group: verifyGroup, PerMillion: compile.VerifyPerMillion, SourceRate: 10000, SourceBurst: 10000}

// startVerifiers runs a verifier on every node of the lab, sharing one set
// of metrics, until the test ends.
func startVerifiers(t *testing.T, c *lab.Lab) (*verify.Metrics, *lines) {
	t.Helper()
	m, out := verify.NewMetrics(), &lines{match: "differs from the policy model"}
	for _, node := range c.Nodes() {
		stop, err := c.RunVerify(testContext(t), node, verify.Config{Group: verifyGroup, Settle: 200 * time.Millisecond}, m, out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("verifier of %s: %v", node, err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // bound before the first sample
	return m, out
}

func verifyCounts(m *verify.Metrics, kernel string) (verified, disagreements float64) {
	return testutil.ToFloat64(m.Verified.WithLabelValues(kernel)), testutil.ToFloat64(m.Disagreements.WithLabelValues(kernel))
}

// At 100% sampling, every scenario of the kernel suite (NetworkPolicy
// cases after upstream's, ClusterNetworkPolicy tiers, nodes, named ports,
// dual stack, ...), with the deny log on: the kernel and the evaluator
// agree on every sampled verdict, allowed and denied. (A pod's
// connections to itself are accepted before any deciding rule and are not
// sampled: the self scenario samples only its denials.)
func TestVerifyAgrees(t *testing.T) {
	requireRoot(t)
	var allowed, denied float64
	for _, f := range scenarioFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			s := scenariotest.Load(t, f)
			c := newLab(t, s, lab.Config{DenyLogGroup: verifyDenyLogGroup, DenyLogRate: 1000, Verify: everySample})
			m, out := startVerifiers(t, c)
			check(t, c, s, false)
			time.Sleep(500 * time.Millisecond) // the last samples read, disagreements settled
			va, da := verifyCounts(m, "allow")
			vd, dd := verifyCounts(m, "deny")
			t.Logf("verified: %v allowed, %v denied; disagreements: %v, %v", va, vd, da, dd)
			if da != 0 || dd != 0 {
				t.Errorf("disagreements: kernel allowed %v, denied %v:\n%s", da, dd, strings.Join(out.get(), "\n"))
			}
			allowed, denied = allowed+va, denied+vd
		})
	}
	t.Logf("all scenarios: %v allowed and %v denied verdicts verified", allowed, denied)
	if allowed == 0 || denied == 0 {
		t.Error("both verdicts must have been sampled")
	}
}

// A kernel that lost one element (x/a's entry in the NetworkPolicy
// ingress dispatch map: the kernel now lets every connection to it
// through, by default) is caught: the first sampled connection to x/a is a
// disagreement, counted within a second and logged with the packet, both
// verdicts, the model's reason and the kernel's deciding rule.
func TestVerifyCatchesCorruptElement(t *testing.T) {
	requireRoot(t)
	s := scenariotest.Load(t, "testdata/default-deny.yaml")
	c := newLab(t, s, lab.Config{Verify: everySample})
	ctx := testContext(t)
	if _, err := c.Apply(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	m, out := startVerifiers(t, c)
	// Probe 1: y/a -> x/a:80 (both on node-1), denied by x/deny-ingress.
	if rep, err := c.Probe(ctx, s, []int{1}); err != nil || rep.Outcomes[0].Err != nil || rep.Outcomes[0].Connected {
		t.Fatalf("denied probe: %v %+v", err, rep.Outcomes)
	}
	time.Sleep(400 * time.Millisecond)
	if _, dis := verifyCounts(m, "deny"); dis != 0 {
		t.Fatalf("disagreements before the corruption: %v: %v", dis, out.get())
	}

	if b, err := c.Net().NodeExec("node-1", "nft", "delete", "element", "inet", compile.TableName, compile.MapIngressPodsV4, "{ 10.244.1.10 }"); err != nil {
		t.Fatalf("corrupting the table: %v: %s", err, b)
	}
	start := time.Now()
	if rep, err := c.Probe(ctx, s, []int{1}); err != nil || rep.Outcomes[0].Err != nil || !rep.Outcomes[0].Connected {
		t.Fatalf("the corrupted kernel should let the probe through: %v %+v", err, rep.Outcomes)
	}
	for {
		if _, dis := verifyCounts(m, "allow"); dis > 0 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("no disagreement counted within 1s of the connection; lines: %v", out.get())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("disagreement counted %v after the connection", time.Since(start).Round(time.Millisecond))
	lines := out.get()
	if len(lines) == 0 {
		t.Fatal("no disagreement logged")
	}
	t.Logf("the line: %s", lines[0])
	for _, want := range []string{`src="y/a"`, `srcIP="10.244.1.20"`, `dst="x/a"`, `dstIP="10.244.1.10"`, `protocol="TCP"`, `port=80`,
		`direction="ingress"`, `kernel="allow"`, `kernelDecision="allow ingress by default (no policy decides)"`,
		`model="deny"`, `modelReason="`, `x/deny-ingress`, `node="node-1"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line lacks %s", want)
		}
	}
}

// netpolCaseScenario is one step of an upstream NetworkPolicy case on the
// nine grid pods (x and z on node-1, y on node-2), probing every ordered
// pair on TCP 80 and 81.
func netpolCaseScenario(step ct.NetpolStep) *scenario.Scenario {
	nss, podLabels := step.Grid(ct.GridPods()).Labels()
	s := &scenario.Scenario{}
	for _, ns := range ct.GridNamespaces() {
		s.Namespaces = append(s.Namespaces, scenario.Namespace{Name: ns, Labels: nss[ns]})
	}
	var ports []scenario.Port
	for _, p := range ct.GridPorts() {
		if p.Protocol == corev1.ProtocolTCP {
			ports = append(ports, scenario.Port{Name: p.Name, Port: p.ContainerPort, Protocol: string(p.Protocol)})
		}
	}
	where := map[string]struct {
		node   string
		subnet byte
	}{"x": {"node-1", 1}, "y": {"node-2", 2}, "z": {"node-1", 1}}
	for i, k := range ct.GridPods() {
		ns, name, _ := strings.Cut(k, "/")
		ip := netip.AddrFrom4([4]byte{10, 244, where[ns].subnet, byte(10 + i)})
		s.Pods = append(s.Pods, scenario.Pod{Namespace: ns, Name: name, Labels: podLabels[k], IP: ip.String(), Node: where[ns].node, Ports: ports})
		for _, to := range ct.GridPods() {
			if to != k {
				for _, port := range []int32{80, 81} {
					s.Probes = append(s.Probes, scenario.Probe{From: scenario.Endpoint{Pod: k}, To: scenario.Endpoint{Pod: to}, Port: port})
				}
			}
		}
	}
	for _, np := range step.Policies {
		s.Policies = append(s.Policies, *np)
	}
	return s
}

// Some of the upstream NetworkPolicy cases (every sixth TCP case, each of
// its steps, in one lab): at 100% sampling the kernel and the evaluator
// agree on every sampled verdict.
func TestVerifyNetpolCases(t *testing.T) {
	requireRoot(t)
	var steps []*scenario.Scenario
	var names []string
	for _, nc := range ct.NetpolCases() {
		if nc.Num%6 != 1 || nc.Num > 42 {
			continue
		}
		for i, st := range nc.Steps {
			steps = append(steps, netpolCaseScenario(st))
			names = append(names, fmt.Sprintf("case %d (%s) step %d", nc.Num, nc.Name, i))
		}
	}
	c := newLab(t, steps[0], lab.Config{DenyLogGroup: verifyDenyLogGroup, DenyLogRate: 1000, Verify: everySample})
	m, out := startVerifiers(t, c)
	for i, s := range steps {
		rep, err := c.Check(testContext(t), s, false, nil)
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
		if tab := rep.Table(); tab != "" {
			t.Errorf("%s: %s", names[i], tab)
		}
		time.Sleep(300 * time.Millisecond)
		va, da := verifyCounts(m, "allow")
		vd, dd := verifyCounts(m, "deny")
		t.Logf("%s: verified so far %v allowed, %v denied", names[i], va, vd)
		if da != 0 || dd != 0 {
			t.Fatalf("%s: disagreements: kernel allowed %v, denied %v:\n%s", names[i], da, dd, strings.Join(out.get(), "\n"))
		}
	}
}
