package conntrack_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack/conntracktest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

func pod(ns, name, ip, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}
}

// allowFrom admits pods with role=client to the pods of ns.
func allowFrom(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-clients"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}, NamespaceSelector: &metav1.LabelSelector{}}}}}}}
}

// input: x/srv (10.244.1.10) and x/other (10.244.1.11) on n1, clients
// y/c1 (10.244.2.10) and y/c2 (10.244.2.11) on n2.
func input(c2Role string, pols ...*networkingv1.NetworkPolicy) compile.Input {
	return compile.Input{NodeName: "n1",
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, {ObjectMeta: metav1.ObjectMeta{Name: "y"}}},
		Pods: []*corev1.Pod{
			pod("x", "srv", "10.244.1.10", "n1", nil),
			pod("x", "other", "10.244.1.11", "n1", nil),
			pod("y", "c1", "10.244.2.10", "n2", map[string]string{"role": "client"}),
			pod("y", "c2", "10.244.2.11", "n2", map[string]string{"role": c2Role}),
		},
		Policies: pols}
}

func decide(p *compile.Program, src, dst netip.Addr, _ compile.Protocol, _ uint16) (bool, bool, string) {
	// A reference decision for the test: ingress of local pods only, via the
	// program's isolating policies and their selectors.
	id, ok := p.PodByIP(dst)
	if !ok || !p.Pods[id].Local || len(p.Pods[id].IngressPolicies) == 0 {
		return true, false, ""
	}
	sid, ok := p.PodByIP(src)
	for _, pid := range p.Pods[id].IngressPolicies {
		for _, r := range p.Policies[pid].Ingress {
			for _, s := range r.Selectors {
				if ok && p.Selectors[s].Contains(sid) {
					return true, false, ""
				}
			}
		}
	}
	return false, false, "denied"
}

// flow is a TCP entry from src:40000 to dst:port.
func flow(src, dst string, port uint16) ct.Flow { return conntracktest.TCP(src, dst, 40000, port) }

type observed struct{ policies []string }

func (o *observed) ObserveRevoked(p string)               { o.policies = append(o.policies, p) }
func (o *observed) ObservePass(time.Duration, int, error) {}

func addrs(ss ...string) (out []netip.Addr) {
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestAffected(t *testing.T) {
	base := compile.Build(input("client", allowFrom("x")))
	for _, tc := range []struct {
		name string
		cur  compile.Input
		want []netip.Addr
	}{
		{"nothing changed", input("client", allowFrom("x")), nil},
		{"peer label changed", input("server", allowFrom("x")), addrs("10.244.1.10", "10.244.1.11")},
		{"policy deleted", input("client"), addrs("10.244.1.10", "10.244.1.11")},
	} {
		got := conntrack.Affected(base, compile.Build(tc.cur))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: affected %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := conntrack.Affected(nil, base); got != nil {
		t.Errorf("first program: affected %v", got)
	}
}

func TestRevokeDeletesExactlyTheNewlyDenied(t *testing.T) {
	old := compile.Build(input("client", allowFrom("x")))
	cur := compile.Build(input("server", allowFrom("x"))) // y/c2 loses role=client
	table := &conntracktest.Table{Flows: []ct.Flow{
		flow("10.244.2.10", "10.244.1.10", 80), // c1 -> srv: still allowed
		flow("10.244.2.11", "10.244.1.10", 80), // c2 -> srv: denied now
		flow("10.244.2.11", "10.9.9.9", 80),    // touches no local pod
	}}
	obs := &observed{}
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: decide, Table: table, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Revoke([]*compile.Program{old}, cur)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || len(table.Deleted) != 1 || table.Deleted[0].TupleOrig.IP.SourceAddress != netip.MustParseAddr("10.244.2.11") {
		t.Fatalf("deleted %+v (result %+v), want only c2 -> srv", table.Deleted, res)
	}
	if !slices.Equal(obs.policies, []string{"x/allow-clients"}) {
		t.Errorf("revoked per policy: %v", obs.policies)
	}
	// No delta: no dump at all.
	table.Deleted = nil
	res, err = r.Revoke([]*compile.Program{cur}, compile.Build(input("server", allowFrom("x"))))
	if err != nil || res.Dumped != 0 || len(table.Deleted) != 0 {
		t.Errorf("unchanged program: %+v %v, deleted %v", res, err, table.Deleted)
	}
}

const namesScenario = `
pods:
  - {namespace: x, name: a, ip: 10.0.0.1, node: n1}
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: web}
    spec:
      tier: Admin
      priority: 1
      subject: {namespaces: {}}
      egress:
        - {name: names, action: Accept, to: [{domainNames: [NAMES]}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
        - {name: rest, action: Deny, to: [{networks: [0.0.0.0/0]}]}
dnsAnswers:
  - {pod: x/a, name: www.example.com, ips: [192.0.2.10], ttl: 60}
  - {pod: x/a, name: api.example.com, ips: [192.0.2.13], ttl: 60}
`

func namesProgram(t *testing.T, names string) (*compile.Program, *scenario.Scenario) {
	t.Helper()
	s, err := scenario.Parse([]byte(strings.Replace(namesScenario, "NAMES", names, 1)))
	if err != nil {
		t.Fatal(err)
	}
	p := compile.Build(s.Input("n1", nil, nil))
	if len(p.Problems) != 0 {
		t.Fatalf("problems: %v", p.Problems)
	}
	return p, s
}

// TestRevokeDomainNames: a connection admitted only by a name the rule no
// longer has is revoked; one admitted by a name it still has is not. The
// revoker decides as the evaluator does, with what the pod resolved.
func TestRevokeDomainNames(t *testing.T) {
	old, s := namesProgram(t, "www.example.com, api.example.com")
	cur, _ := namesProgram(t, "api.example.com")
	if got := conntrack.Affected(old, cur); !slices.Equal(got, addrs("10.0.0.1")) {
		t.Errorf("affected by removing a name: %v, want x/a", got)
	}
	same, _ := namesProgram(t, "api.example.com, www.example.com")
	if got := conntrack.Affected(old, same); len(got) != 0 {
		t.Errorf("affected by reordering the names: %v", got)
	}
	eval := &evaluate.Evaluator{Resolved: scenario.NewResolvedAnswers(s)}
	table := &conntracktest.Table{Flows: []ct.Flow{
		flow("10.0.0.1", "192.0.2.10", 80), // www.example.com: removed
		flow("10.0.0.1", "192.0.2.13", 80), // api.example.com: kept
		flow("10.0.0.1", "192.0.2.99", 80), // never resolved: denied before and now, left alone
	}}
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: eval.DecideSides, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Revoke([]*compile.Program{old}, cur)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || len(table.Deleted) != 1 || table.Deleted[0].TupleOrig.IP.DestinationAddress != netip.MustParseAddr("192.0.2.10") {
		t.Errorf("deleted %+v (result %+v), want only x/a -> www.example.com", table.Deleted, res)
	}
}

// forgetful is a learner that forgot every answer (its pods lost their
// last domainNames rule).
type forgetful struct{}

func (forgetful) Resolved(netip.Addr, netip.Addr, []compile.DomainPattern) bool { return false }

// TestRevokeDeletedDomainRule: when a pod's last domainNames rule goes,
// the learner forgets what it resolved; the flows the rule admitted are
// revoked all the same (DecideBefore), and a flow the new program still
// allows is not.
func TestRevokeDeletedDomainRule(t *testing.T) {
	old, _ := namesProgram(t, "www.example.com")
	s, err := scenario.Parse([]byte(strings.Replace(strings.Replace(namesScenario,
		"        - {name: names, action: Accept, to: [{domainNames: [NAMES]}], protocols: [{tcp: {destinationPort: {number: 80}}}]}\n",
		"        - {name: ok, action: Accept, to: [{networks: [192.0.2.13/32]}]}\n", 1), "NAMES", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cur := compile.Build(s.Input("n1", nil, nil))
	eval := &evaluate.Evaluator{Resolved: forgetful{}}
	eval.Swap(cur)
	for _, before := range []bool{false, true} {
		table := &conntracktest.Table{Flows: []ct.Flow{
			flow("10.0.0.1", "192.0.2.10", 80), // admitted by the deleted rule
			flow("10.0.0.1", "192.0.2.13", 80), // allowed now by an address rule
		}}
		cfg := conntrack.Config{Decide: eval.DecideSides, Table: table}
		if before {
			cfg.DecideBefore = eval.DecideSidesBefore
		}
		r, err := conntrack.NewRevoker(cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Revoke([]*compile.Program{old}, cur)
		if err != nil {
			t.Fatal(err)
		}
		cut := len(table.Deleted) == 1 && table.Deleted[0].TupleOrig.IP.DestinationAddress == netip.MustParseAddr("192.0.2.10")
		if before != cut || res.Deleted > 1 {
			t.Errorf("with DecideBefore %v: deleted %+v", before, table.Deleted)
		}
	}
}

// protoScenario: x/srv (dual-stack, on n1) admits role=client pods of y on
// PORTS (every protocol when empty); y/c1 and y/c2 are clients on n2.
const protoScenario = `
pods:
  - {namespace: x, name: srv, ips: [10.244.1.10, "fd00::10"], node: n1}
  - {namespace: y, name: c1, labels: {role: client}, ips: [10.244.2.10, "fd00::2:10"], node: n2}
  - {namespace: y, name: c2, labels: {role: C2ROLE}, ips: [10.244.2.11, "fd00::2:11"], node: n2}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {namespace: x, name: allow-clients}
    spec:
      podSelector: {}
      policyTypes: [Ingress]
      ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]PORTS}]
`

func protoProgram(t *testing.T, c2Role, ports string) *compile.Program {
	t.Helper()
	s, err := scenario.Parse([]byte(strings.NewReplacer("C2ROLE", c2Role, "PORTS", ports).Replace(protoScenario)))
	if err != nil {
		t.Fatal(err)
	}
	p := compile.Build(s.Input("n1", nil, nil))
	if len(p.Problems) != 0 {
		t.Fatalf("problems: %v", p.Problems)
	}
	return p
}

// TestRevokeEveryProtocol: every protocol a rule can admit is judged, as
// the ruleset decides its first packet. A rule without ports admits ICMP
// and ICMPv6 echoes, GRE and protocols conntrack tracks generically; when
// it is narrowed to a TCP port they are cut (and the TCP flow on the port
// kept), each entry deleted with the tuple the kernel finds it by. When a
// rule without ports still admits them, nothing is cut.
func TestRevokeEveryProtocol(t *testing.T) {
	all := protoProgram(t, "client", "")
	flows := []ct.Flow{
		conntracktest.TCP("10.244.2.10", "10.244.1.10", 40000, 80),
		conntracktest.Echo("10.244.2.10", "10.244.1.10", 0x1234),
		conntracktest.Echo("fd00::2:10", "fd00::10", 0x4321),
		conntracktest.Generic("10.244.2.10", "10.244.1.10", 47), // GRE
		conntracktest.Generic("fd00::2:10", "fd00::10", 50),     // ESP
		conntracktest.TCP("10.244.2.10", "10.244.1.10", 40001, 8080),
	}
	key := func(f ct.Flow) string {
		c, ok := conntrack.Forwarded(&f)
		if !ok {
			return "not a connection"
		}
		return c.String()
	}
	for _, tc := range []struct {
		name string
		cur  *compile.Program
		want []string
	}{
		{"narrowed to TCP 80", protoProgram(t, "client", ", ports: [{protocol: TCP, port: 80}]"), []string{
			"icmp 10.244.2.10 -> 10.244.1.10", "ipv6-icmp fd00::2:10 -> fd00::10", "47 10.244.2.10 -> 10.244.1.10", "50 fd00::2:10 -> fd00::10",
			"tcp 10.244.2.10 -> 10.244.1.10:8080"}},
		{"narrowed to UDP 53", protoProgram(t, "client", ", ports: [{protocol: UDP, port: 53}]"), []string{
			"tcp 10.244.2.10 -> 10.244.1.10:80", "icmp 10.244.2.10 -> 10.244.1.10", "ipv6-icmp fd00::2:10 -> fd00::10",
			"47 10.244.2.10 -> 10.244.1.10", "50 fd00::2:10 -> fd00::10", "tcp 10.244.2.10 -> 10.244.1.10:8080"}},
		{"another peer changed, every protocol still admitted", protoProgram(t, "server", ""), nil},
	} {
		table := &conntracktest.Table{Flows: flows}
		eval := &evaluate.Evaluator{}
		r, err := conntrack.NewRevoker(conntrack.Config{Decide: eval.DecideSides, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Revoke([]*compile.Program{all}, tc.cur)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range table.Deleted {
			got = append(got, key(f))
			// The kernel finds an ICMP entry by its echo's identifier and type.
			if i := slices.IndexFunc(flows, func(g ct.Flow) bool { return key(g) == key(f) }); f.TupleOrig != flows[i].TupleOrig || f.TupleReply != flows[i].TupleReply {
				t.Errorf("%s: deleted %+v, the entry is %+v", tc.name, f, flows[i])
			}
		}
		if !slices.Equal(got, tc.want) || res.Deleted != len(tc.want) {
			t.Errorf("%s: deleted %q (result %+v), want %q", tc.name, got, res, tc.want)
		}
	}
}
