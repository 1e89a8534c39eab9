package kernel

// The staged log on the real kernel ("prediction equals enforcement"):
// the upstream NetworkPolicy cases' policies applied staged block nothing,
// and the connections the staged log reports as "would deny" are exactly
// those the same policies deny once applied without the mark. Pods of
// namespace x run on node-1, y on node-2, z on node-3 (the grid's
// addresses are 10.244.<ns>.<pod>, each node's pod range); every node's
// staged log is read, with its own program: a node reports what would
// change on its side (egress of its pods, ingress to them).

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

const stagedGroup = 12

var stagedLine = regexp.MustCompile(`srcIP="([^"]+)".*dstIP="([^"]+)" protocol="([A-Z]+)" port=(\d+) would="(deny|allow)"`)

// gridScenario is a netpol case's step as a scenario: its pods with their
// labels on the grid's addresses, their named ports, the policies (staged
// when staged), and a probe per ordered pair, port and protocol its
// expectations name (SCTP has no sockets in the lab).
func gridScenario(pods []string, st ct.NetpolStep, policies []*networkingv1.NetworkPolicy, staged bool) *scenario.Scenario {
	nss, labels := st.Grid(pods).Labels()
	s := &scenario.Scenario{}
	for _, ns := range ct.GridNamespaces() {
		s.Namespaces = append(s.Namespaces, scenario.Namespace{Name: ns, Labels: nss[ns]})
	}
	for _, k := range pods {
		ns, name, _ := strings.Cut(k, "/")
		p := scenario.Pod{Namespace: ns, Name: name, Labels: labels[k], IP: ct.GridIP(k).String(),
			Node: fmt.Sprintf("node-%d", ct.GridIP(k).As4()[2])}
		for _, cp := range ct.GridPorts() {
			p.Ports = append(p.Ports, scenario.Port{Name: cp.Name, Port: cp.ContainerPort, Protocol: string(cp.Protocol)})
		}
		s.Pods = append(s.Pods, p)
	}
	for _, np := range policies {
		np = np.DeepCopy()
		if staged {
			np.Annotations = map[string]string{compile.StagedAnnotation: "true"}
		}
		s.Policies = append(s.Policies, *np)
	}
	seen := map[string]bool{}
	for _, e := range st.Expect {
		if e.Proto == compile.ProtoSCTP || seen[fmt.Sprint(e.Port, e.Proto)] {
			continue
		}
		seen[fmt.Sprint(e.Port, e.Proto)] = true
		for _, from := range pods {
			for _, to := range pods {
				if from != to {
					s.Probes = append(s.Probes, scenario.Probe{From: scenario.Endpoint{Pod: from}, To: scenario.Endpoint{Pod: to},
						Port: int32(e.Port), Protocol: e.Proto.String()})
				}
			}
		}
	}
	return s
}

// connKey names a probe or a logged connection: "src dst PROTO port".
func connKey(src, dst, proto string, port any) string {
	return fmt.Sprintf("%s %s %s %v", src, dst, proto, port)
}

// stagedRun applies s and probes it, failing on any disagreement with the
// evaluator or harness error; it returns each probe's outcome by connKey.
func stagedRun(t *testing.T, ctx context.Context, c *lab.Lab, what string, s *scenario.Scenario) map[string]bool {
	t.Helper()
	rep, err := c.Check(ctx, s, true, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(rep.Disagreements()) > 0 || len(rep.Errors()) > 0 {
		t.Fatalf("%s: the kernel disagrees with the evaluator:\n%s", what, rep.Table())
	}
	out := map[string]bool{}
	for _, o := range rep.Outcomes {
		src, dst, _ := s.ProbeAddrs(o.Index)
		out[connKey(src.String(), dst.String(), o.Probe.ProbeProtocol().String(), o.Probe.Port)] = o.Connected
	}
	return out
}

// checkStaged runs one case: the enforced policies alone (base; nil:
// every probe allowed, not probed), then with the staged ones, then with
// them unstaged (after). With the staged policies every probe must get the
// base verdict, and the log must name exactly the connections whose
// verdict differs between base and after, as would deny or would allow.
func checkStaged(t *testing.T, ctx context.Context, c *lab.Lab, logs *lines, name string, base, withStaged, after *scenario.Scenario) {
	t.Helper()
	var want map[string]bool
	if base != nil {
		want = stagedRun(t, ctx, c, name+" enforced alone", base)
	}
	logs.take()
	got := stagedRun(t, ctx, c, name+" staged", withStaged)
	time.Sleep(200 * time.Millisecond) // the last copies' lines
	lines := logs.take()
	for k, ok := range got {
		if w, has := want[k]; (has && ok != w) || (!has && base == nil && !ok) {
			t.Errorf("%s: with the policies staged, %s connected %v, without them %v", name, k, ok, !ok)
		}
	}
	logged := map[string]string{}
	for _, l := range lines {
		m := stagedLine.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("%s: unparsed line %s", name, l)
			continue
		}
		logged[connKey(m[1], m[2], m[3], m[4])] = m[5]
	}
	enforced := stagedRun(t, ctx, c, name+" unstaged", after)
	var missing, extra []string
	for k, now := range enforced {
		before := got[k]
		switch {
		case before && !now && logged[k] != "deny":
			missing = append(missing, k+" (would deny)")
		case !before && now && logged[k] != "allow":
			missing = append(missing, k+" (would allow)")
		}
	}
	for k, w := range logged {
		if (w == "deny") != (got[k] && !enforced[k]) || (w == "allow") != (!got[k] && enforced[k]) {
			extra = append(extra, k+" (would "+w+")")
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("%s: the staged log differs from enforcement:\n  not logged: %v\n  logged wrongly: %v", name, missing, extra)
	}
	denied := 0
	for _, w := range logged {
		if w == "deny" {
			denied++
		}
	}
	t.Logf("%s: %d probes, %d logged would deny, %d would allow", name, len(enforced), denied, len(logged)-denied)
}

// newStagedLab is a lab of three nodes with the staged log read on each.
func newStagedLab(t *testing.T, ctx context.Context) (*lab.Lab, *lines) {
	seed := gridScenario(ct.GridPods(), ct.NetpolStep{}, nil, false)
	c := newLab(t, seed, lab.Config{StagedLogGroup: stagedGroup, StagedLogRate: 100000, ProbeTimeout: time.Second})
	logs := &lines{match: `"Staged verdict"`}
	for _, n := range c.Nodes() {
		stop, err := c.RunStagedLog(ctx, n, staged.Config{Config: denylog.Config{Group: stagedGroup, FlowInterval: time.Nanosecond, LinesPerSecond: 1000000}}, staged.NewMetrics(), logs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("staged log reader: %v", err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // bound before the first copy
	return c, logs
}

// TestStagedPredictsNetpolCases: for every step of the 48 upstream cases.
func TestStagedPredictsNetpolCases(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, logs := newStagedLab(t, ctx)
	for _, nc := range ct.NetpolCases() {
		for i, st := range nc.Steps {
			name := fmt.Sprintf("case %d (%s) step %d", nc.Num, nc.Name, i)
			checkStaged(t, ctx, c, logs, name, nil, gridScenario(nc.Pods, st, st.Policies, true), gridScenario(nc.Pods, st, st.Policies, false))
			if t.Failed() {
				return
			}
		}
	}
}

// TestStagedPredictsClusterPolicies: staged ClusterNetworkPolicies over
// enforced NetworkPolicies, both ways: an Admin Deny that would cut what
// is allowed, an Admin Accept that would admit what a NetworkPolicy
// denies (a staged allow on an isolated pod), a Baseline Deny under it.
func TestStagedPredictsClusterPolicies(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t)
	c, logs := newStagedLab(t, ctx)
	pods := ct.GridPods()
	st := ct.NetpolStep{Expect: []ct.Expectation{ct.On(80, compile.ProtoTCP), ct.On(81, compile.ProtoUDP)}}
	enforced := ct.List(ct.NetPol("x", "deny-a", ct.Sel("pod", "a"), ct.Types(ct.PIn)))
	cnps := []*npav1beta1.ClusterNetworkPolicy{
		ct.CNP("no-y-to-x-b", "Admin", 10, ct.PodsSubject(ct.Sel(ct.NSName, "x"), ct.Sel("pod", "b")),
			ct.CNPIngress(ct.CNPRule("from-y", "Deny", ct.ToNamespaces(ct.Sel(ct.NSName, "y"))))),
		ct.CNP("z-to-x-a", "Admin", 20, ct.PodsSubject(ct.Sel(ct.NSName, "x"), ct.Sel("pod", "a")),
			ct.CNPIngress(ct.CNPRule("from-z", "Accept", ct.ToNamespaces(ct.Sel(ct.NSName, "z"))).On(ct.Proto("TCP", 80)))),
		ct.CNP("z-egress", "Baseline", 30, ct.NamespacesSubject(ct.Sel(ct.NSName, "z")),
			ct.CNPEgress(ct.CNPRule("no-y", "Deny", ct.ToNamespaces(ct.Sel(ct.NSName, "y"))))),
	}
	with := func(mark bool) *scenario.Scenario {
		s := gridScenario(pods, st, enforced, false)
		for _, cnp := range cnps {
			cnp = cnp.DeepCopy()
			if mark {
				cnp.Annotations = map[string]string{compile.StagedAnnotation: "true"}
			}
			s.ClusterNetworkPolicies = append(s.ClusterNetworkPolicies, *cnp)
		}
		return s
	}
	checkStaged(t, ctx, c, logs, "cluster policies", gridScenario(pods, st, enforced, false), with(true), with(false))
}
