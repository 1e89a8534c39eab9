package evaluate_test

// ClusterNetworkPolicy truth tables: one case per semantic point of the
// API's doc comments (policy.networking.k8s.io v1beta1), read against the
// same grid as semantics_test.go: pods x/a, x/b, y/a, y/b, z/a at
// 10.244.<ns>.<pod>, on node n1 (172.18.0.1, zone=a) unless placed on n2
// (172.18.0.2, zone=b); namespaces carry ns=<name>. A failing connection
// prints the evaluator's reason.

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	. "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

var (
	cnpNodes = []*corev1.Node{
		Node("n1", []string{"172.18.0.1"}, "zone", "a"),
		Node("n2", []string{"172.18.0.2"}, "zone", "b"),
	}
	cnpNSLabels = map[string]map[string]string{"x": {"ns": "x"}, "y": {"ns": "y"}, "z": {"ns": "z"}}
	icmp        = compile.Protocol(1)
)

func cnps(ps ...*npav1beta1.ClusterNetworkPolicy) []*npav1beta1.ClusterNetworkPolicy { return ps }

// cnpCase fills the grid's defaults into a case.
func cnpCase(c semCase) semCase {
	if c.pods == nil {
		c.pods = gridPods("x/a", "x/b", "y/a", "y/b", "z/a")
	}
	if c.nsLabels == nil {
		c.nsLabels = cnpNSLabels
	}
	if c.nodes == nil {
		c.nodes = cnpNodes
	}
	return c
}

func TestClusterNetworkPolicySemantics(t *testing.T) {
	adminDenyY := CNP("no-y", "Admin", 10, NamespacesSubject(Sel("ns", "x")),
		CNPEgress(CNPRule("no-y", "Deny", ToNamespaces(Sel("ns", "y")))))
	v1AllowAllEgress := NetPol("x", "allow-all-egress", Sel(), Types(PEg), Egress(Peers()))
	v1DenyIngress := NetPol("x", "deny-ingress", Sel(), Types(PIn))

	cases := []semCase{
		{
			name:     "Admin Deny overrides a NetworkPolicy that allows",
			policies: List(v1AllowAllEgress),
			cnps:     cnps(adminDenyY),
			conns: []semConn{
				denied("x/a", "y/b", TCP, 80).why("denied by ClusterNetworkPolicy no-y (Admin, priority 10) egress rule no-y"),
				allowed("x/a", "z/a", TCP, 80).why("allowed by x/allow-all-egress egress[0]"),
				allowed("y/a", "y/b", TCP, 80), // y is not a subject
			},
		},
		{
			name:     "Admin Accept overrides a NetworkPolicy that denies",
			policies: List(v1DenyIngress),
			cnps: cnps(CNP("from-y", "Admin", 5, NamespacesSubject(Sel("ns", "x")),
				CNPIngress(CNPRule("from-y", "Accept", ToNamespaces(Sel("ns", "y")))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why("allowed by ClusterNetworkPolicy from-y (Admin, priority 5) ingress rule from-y"),
				denied("z/a", "x/a", TCP, 80).why("x/deny-ingress isolates x/a for ingress"),
			},
		},
		{
			name: "egress Accept still needs the destination's ingress",
			cnps: cnps(CNP("x-out", "Admin", 1, NamespacesSubject(Sel("ns", "x")),
				CNPEgress(CNPRule("all", "Accept", ToNamespaces(Sel()))))),
			policies: List(NetPol("y", "deny-ingress", Sel(), Types(PIn))),
			conns: []semConn{
				denied("x/a", "y/a", TCP, 80).why("y/deny-ingress isolates y/a for ingress"),
				allowed("x/a", "z/a", TCP, 80).why("allowed by ClusterNetworkPolicy x-out"),
			},
		},
		{
			name: "priority: lower number first; equal priority: by name",
			cnps: cnps(
				CNP("b-deny", "Admin", 20, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("d", "Deny", ToNamespaces(Sel("ns", "y"))))),
				CNP("a-accept", "Admin", 10, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("a", "Accept", ToPods(Sel("ns", "y"), Sel("pod", "a"))))),
				CNP("c-deny", "Admin", 30, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("d", "Deny", ToNamespaces(Sel("ns", "z"))))),
				CNP("b-accept", "Admin", 30, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("a", "Accept", ToNamespaces(Sel("ns", "z"))))),
			),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80).why("a-accept (Admin, priority 10)"),
				denied("x/a", "y/b", TCP, 80).why("b-deny (Admin, priority 20)"),
				allowed("x/a", "z/a", TCP, 80).why("b-accept (Admin, priority 30)"),
			},
		},
		{
			name: "rules in written order: the first that matches decides",
			cnps: cnps(CNP("order", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("accept-80", "Accept", ToNamespaces(Sel("ns", "y"))).On(Proto("TCP", 80)),
				CNPRule("deny-y", "Deny", ToNamespaces(Sel("ns", "y"))),
				CNPRule("accept-81", "Accept", ToNamespaces(Sel("ns", "y"))).On(Proto("TCP", 81)),
			))),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80).why("egress rule accept-80"),
				denied("x/a", "y/a", TCP, 81).why("egress rule deny-y"),
				denied("x/a", "y/a", UDP, 80).why("egress rule deny-y"),
			},
		},
		{
			name: "Pass skips the rest of the Admin tier; NetworkPolicy decides next",
			cnps: cnps(
				CNP("pass-y", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("pass", "Pass", ToNamespaces(Sel("ns", "y"))))),
				CNP("deny-all", "Admin", 2, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("deny", "Deny", ToNamespaces(Sel())))),
			),
			policies: List(NetPol("x", "only-b", Sel("pod", "a"), Types(PEg), Egress(Peers(PodNSPeer(Sel("pod", "b"), Sel("ns", "y")))))),
			conns: []semConn{
				allowed("x/a", "y/b", TCP, 80).why("allowed by x/only-b egress[0]"),
				denied("x/a", "y/a", TCP, 80).why("x/only-b isolates x/a for egress"),
				allowed("x/b", "y/a", TCP, 80).why("passed by ClusterNetworkPolicy pass-y"), // not isolated by v1: default
				denied("x/a", "z/a", TCP, 80).why("deny-all (Admin, priority 2) egress rule deny"),
			},
		},
		{
			name: "Baseline applies only where no NetworkPolicy isolates the pod",
			cnps: cnps(
				CNP("baseline-deny", "Baseline", 1, NamespacesSubject(Sel("ns", "x")), CNPIngress(CNPRule("deny-all", "Deny", ToNamespaces(Sel())))),
				CNP("baseline-accept-z", "Baseline", 0, NamespacesSubject(Sel("ns", "x")), CNPIngress(CNPRule("z", "Accept", ToNamespaces(Sel("ns", "z"))))),
			),
			policies: List(NetPol("x", "a-from-y", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel("ns", "y")))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why("allowed by x/a-from-y ingress[0]"),    // v1 allows: Baseline never consulted
				denied("z/a", "x/a", TCP, 80).why("x/a-from-y isolates x/a for ingress"),  // v1 isolates: Baseline Accept unused
				denied("y/a", "x/b", TCP, 80).why("baseline-deny (Baseline, priority 1)"), // no v1 on x/b
				allowed("z/a", "x/b", TCP, 80).why("baseline-accept-z (Baseline, priority 0)"),
			},
		},
		{
			name: "Baseline Pass falls through to the default: allow",
			cnps: cnps(
				CNP("bp", "Baseline", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("pass-y", "Pass", ToNamespaces(Sel("ns", "y"))))),
				CNP("bd", "Baseline", 2, NamespacesSubject(Sel("ns", "x")), CNPEgress(CNPRule("deny", "Deny", ToNamespaces(Sel())))),
			),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80).why("passed by ClusterNetworkPolicy bp (Baseline, priority 1) egress rule pass-y"),
				denied("x/a", "z/a", TCP, 80).why("bd"),
			},
		},
		{
			name: "subjects: pods of matching namespaces; host-network pods never",
			pods: append(gridPods("x/a", "y/a", "y/b", "z/a"),
				mkPod("x/host", []string{"172.18.0.1"}, hostNetwork())),
			cnps: cnps(CNP("pods-subject", "Admin", 1, PodsSubject(Sel("ns", "y"), Sel("pod", "b")),
				CNPIngress(CNPRule("deny", "Deny", ToNamespaces(Sel()))))),
			conns: []semConn{
				denied("x/a", "y/b", TCP, 80).why("pods-subject"),
				allowed("x/a", "y/a", TCP, 80),
				allowed("x/a", "z/a", TCP, 80),
			},
			check: func(t *testing.T, prog *compile.Program) {
				if got := len(prog.ClusterPolicies[0].Subjects); got != 1 {
					t.Errorf("subjects: got %d, want 1 (y/b)", got)
				}
			},
		},
		{
			name: "a policy without rules in a direction does not affect it",
			cnps: cnps(CNP("egress-only", "Admin", 1, NamespacesSubject(Sel("ns", "x")),
				CNPEgress(CNPRule("deny-y", "Deny", ToNamespaces(Sel("ns", "y")))))),
			policies: List(v1DenyIngress),
			conns: []semConn{
				denied("y/a", "x/a", TCP, 80).why("x/deny-ingress isolates"),
				allowed("x/a", "z/a", TCP, 80).why("source not isolated for egress"),
			},
		},
		{
			name: "networks match pod addresses too, per family",
			pods: []*corev1.Pod{
				mkPod("x/a", []string{"10.244.1.1", "fd00:10:244:1::1"}),
				mkPod("y/a", []string{"10.244.2.1", "fd00:10:244:2::1"}),
			},
			cnps: cnps(CNP("no-internet", "Admin", 1, NamespacesSubject(Sel("ns", "x")),
				CNPEgress(
					CNPRule("keep-10.244.2", "Accept", ToNetworks("10.244.2.0/24")),
					CNPRule("deny-v4", "Deny", ToNetworks("0.0.0.0/0")),
				))),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80).why("keep-10.244.2"),
				denied("x/a", "192.0.2.1", TCP, 443).why("deny-v4"),
				allowed("x/a@6", "y/a@6", TCP, 80).why("source not isolated for egress"),
				allowed("x/a@6", "2001:db8::1", TCP, 443),
			},
		},
		{
			name: "nodes peers: node addresses by label; a pod's own node too",
			pods: append(gridPods("x/a", "y/a"), gridPod("x/b", onNode("n2"))),
			cnps: cnps(CNP("nodes", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("kubelet-zone-a", "Accept", ToNodes(Sel("zone", "a"))).On(Proto("TCP", 10250)),
				CNPRule("no-nodes", "Deny", ToNodes(Sel())),
			))),
			conns: []semConn{
				allowed("x/a", "172.18.0.1", TCP, 10250).why("kubelet-zone-a"), // own node
				denied("x/a", "172.18.0.1", TCP, 22).why("no-nodes"),
				denied("x/a", "172.18.0.2", TCP, 10250).why("no-nodes"), // zone b
				allowed("x/b", "172.18.0.1", TCP, 10250).why("kubelet-zone-a"),
				allowed("x/a", "192.0.2.1", TCP, 22),
				allowed("y/a", "172.18.0.2", TCP, 22),
			},
		},
		{
			name:     "NetworkPolicy allows a pod's own node; Baseline is not consulted for isolated pods",
			policies: List(NetPol("x", "deny-egress", Sel(), Types(PEg))),
			cnps: cnps(CNP("b-no-nodes", "Baseline", 1, NamespacesSubject(Sel()),
				CNPEgress(CNPRule("no-nodes", "Deny", ToNodes(Sel()))))),
			conns: []semConn{
				allowed("x/a", "172.18.0.1", TCP, 10250).why(evaluate.ReasonNodeTraffic),
				denied("x/a", "172.18.0.2", TCP, 10250).why("x/deny-egress isolates"),
				denied("y/a", "172.18.0.1", TCP, 10250).why("b-no-nodes"),
			},
		},
		{
			name: "ingress from the pod's own node is never filtered",
			cnps: cnps(CNP("deny-in", "Admin", 1, NamespacesSubject(Sel()),
				CNPIngress(CNPRule("broken", "Deny", NoPeerField())))),
			conns: []semConn{
				allowed("172.18.0.1", "x/a", TCP, 8080).why(evaluate.ReasonNodeTraffic),
				denied("172.18.0.2", "x/a", TCP, 8080).why("deny-in"),
				denied("y/a", "x/a", TCP, 80).why("deny-in"),
			},
			problems: []semProblem{{"deny-in", "spec.ingress[0].from[0]", "fail closed"}},
		},
		{
			name: "protocols: number, range, protocol-wide, named port on the destination, absent: everything",
			cnps: cnps(CNP("ports", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("tcp-80", "Accept", ToNamespaces(Sel())).On(Proto("TCP", 80)),
				CNPRule("udp-range", "Accept", ToNamespaces(Sel())).On(ProtoRange("UDP", 1000, 2000)),
				CNPRule("sctp-81", "Accept", ToNamespaces(Sel())).On(Proto("SCTP", 81)),
				CNPRule("named", "Accept", ToNamespaces(Sel())).On(DestinationNamedPort("serve-81-udp")),
				CNPRule("deny-y", "Deny", ToNamespaces(Sel("ns", "y"))),
			))),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80).why("tcp-80"),
				denied("x/a", "y/a", TCP, 81).why("deny-y"),
				allowed("x/a", "y/a", UDP, 1000).why("udp-range"),
				allowed("x/a", "y/a", UDP, 2000).why("udp-range"),
				denied("x/a", "y/a", UDP, 2001).why("deny-y"),
				allowed("x/a", "y/a", SCTP, 81).why("sctp-81"),
				allowed("x/a", "y/a", UDP, 81).why("named"),
				denied("x/a", "y/a", TCP, 81).why("deny-y"), // serve-81-udp is UDP
				denied("x/a", "y/a", icmp, 0).why("deny-y"), // no protocols: every protocol
			},
		},
		{
			name: "a named port resolves only on pods, never on nodes or networks",
			pods: append(gridPods("x/a", "y/a"), gridPod("y/b", containerPorts(cport("web", 8080, corev1.ProtocolTCP)))),
			cnps: cnps(CNP("named", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("web", "Accept", ToNamespaces(Sel())).On(DestinationNamedPort("web")),
				CNPRule("deny", "Deny", ToNetworks("0.0.0.0/0")),
			))),
			conns: []semConn{
				allowed("x/a", "y/b", TCP, 8080).why("named"),
				denied("x/a", "y/a", TCP, 8080).why("deny"),
				denied("x/a", "192.0.2.1", TCP, 8080).why("deny"),
			},
		},
		{
			name: "fail closed: a peer with no field matches nothing in Accept, everything in Deny and Pass",
			cnps: cnps(
				CNP("accept-broken", "Admin", 1, NamespacesSubject(Sel("ns", "x")),
					CNPEgress(CNPRule("broken", "Accept", NoPeerField(), ToNamespaces(Sel("ns", "z"))))),
				CNP("pass-broken", "Admin", 2, NamespacesSubject(Sel("ns", "y")),
					CNPEgress(CNPRule("broken", "Pass", NoPeerField()))),
				CNP("deny-x", "Baseline", 1, NamespacesSubject(Sel("ns", "x")),
					CNPEgress(CNPRule("deny", "Deny", ToNamespaces(Sel())))),
			),
			conns: []semConn{
				allowed("x/a", "z/a", TCP, 80).why("accept-broken"), // the valid peer still works
				denied("x/a", "y/a", TCP, 80).why("deny-x"),         // the broken peer matches nothing
				denied("y/a", "z/a", TCP, 80).why("denied by ClusterNetworkPolicy pass-broken (Admin, priority 2) egress rule broken"),
			},
			problems: []semProblem{
				{"accept-broken", "spec.egress[0].to[0]", "matches nothing"},
				{"pass-broken", "spec.egress[0].to[0]", "fail closed"},
			},
		},
		{
			name: "domainNames: an address the pod never resolved is not matched",
			cnps: cnps(CNP("fqdn", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("example", "Accept", ToDomains("www.example.com")),
				CNPRule("deny", "Deny", ToNetworks("0.0.0.0/0")),
			))),
			conns: []semConn{
				denied("x/a", "192.0.2.1", TCP, 443).why("fqdn (Admin, priority 1) egress rule deny"),
			},
		},
		{
			name: "domainNames in a Deny rule (the API allows them in Accept rules only) fail closed",
			cnps: cnps(CNP("fqdn-deny", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("bad", "Deny", ToDomains("www.example.com")),
			))),
			conns: []semConn{
				denied("x/a", "z/a", TCP, 80).why("fqdn-deny (Admin, priority 1) egress rule bad"),
			},
			problems: []semProblem{{"fqdn-deny", "spec.egress[0].to[0].domainNames", "Accept rules only"}},
		},
		{
			name: "invalid subject: every pod, Accept rules off, Pass rules deny",
			cnps: cnps(CNP("bad-subject", "Admin", 1,
				npav1beta1.ClusterNetworkPolicySubject{Namespaces: ptrTo(Expr("ns", "Bogus", "x"))},
				CNPEgress(
					CNPRule("accept-z", "Accept", ToNamespaces(Sel("ns", "z"))),
					CNPRule("pass-y", "Pass", ToNamespaces(Sel("ns", "y"))),
				))),
			conns: []semConn{
				allowed("x/a", "z/a", TCP, 80),                   // the Accept rule is off: nothing decides
				denied("z/a", "y/a", TCP, 80).why("bad-subject"), // every pod is a subject; Pass denies
			},
			problems: []semProblem{{"bad-subject", "spec.subject.namespaces.matchExpressions[0].operator", ""}},
		},
		{
			name: "invalid ports and ranges fail closed in Deny rules",
			cnps: cnps(CNP("bad-range", "Admin", 1, NamespacesSubject(Sel("ns", "x")), CNPEgress(
				CNPRule("accept-bad", "Accept", ToNamespaces(Sel())).On(ProtoRange("TCP", 90, 80)),
				CNPRule("deny-bad", "Deny", ToNamespaces(Sel("ns", "y"))).On(Proto("UDP", 70000)),
			))),
			conns: []semConn{
				denied("x/a", "z/a", TCP, 85).why("deny-bad"), // the broken Deny denies everything
			},
			problems: []semProblem{
				{"bad-range", "spec.egress[0].protocols[0].tcp.destinationPort.range", "start 90 must be less than end 80"},
				{"bad-range", "spec.egress[1].protocols[0].udp.destinationPort.number", "fail closed"},
			},
		},
		{
			// Past compile.MaxPolicyCost the rules are not compiled and
			// fail closed as invalid ones do: the Accept rule matches
			// nothing, the Deny rule denies all traffic of the subjects.
			name: "a ClusterNetworkPolicy over the cost bound fails closed",
			cnps: cnps(
				CNP("too-large-accept", "Admin", 1, NamespacesSubject(Sel("ns", "y")), CNPEgress(
					CNPRule("accept-many", "Accept", ToNetworks(ScatteredExcepts(compile.MaxPolicyCost, 2)...)),
				)),
				CNP("too-large-deny", "Admin", 2, NamespacesSubject(Sel("ns", "x")), CNPEgress(
					CNPRule("deny-many", "Deny", ToNetworks(ScatteredExcepts(compile.MaxPolicyCost, 3)...)),
				)),
				adminDenyY),
			conns: []semConn{
				denied("x/a", "z/a", TCP, 80).why("too-large-deny (Admin, priority 2) egress rule deny-many"),
				denied("x/a", "192.0.2.1", UDP, 53),
				allowed("y/a", "z/a", TCP, 80), // the Accept rule matches nothing: nothing decides
				allowed("z/a", "y/a", TCP, 80),
			},
			problems: []semProblem{{"too-large-accept", "spec", "too large to compile"}, {"too-large-deny", "spec", "too large to compile"}},
		},
		{
			name: "a node's program: only local pods are subjects",
			node: "n1", nodeIPs: []string{"172.18.0.1"},
			pods: append(gridPods("x/a", "y/a"), gridPod("x/b", onNode("n2"))),
			cnps: cnps(adminDenyY),
			conns: []semConn{
				denied("x/a", "y/a", TCP, 80).why("no-y"),
				allowed("x/b", "y/a", TCP, 80).why(evaluate.ReasonNotEnforcedHere),
			},
		},
	}
	for i := range cases {
		cases[i] = cnpCase(cases[i])
	}
	runSemCases(t, cases)
}

func ptrTo[T any](v T) *T { return &v }

// TestClusterEvaluateAllocs checks that the tiers allocate nothing either:
// Admin Deny, Pass into NetworkPolicy, Baseline Accept, nodes and networks.
func TestClusterEvaluateAllocs(t *testing.T) {
	c := cnpCase(semCase{
		policies: List(NetPol("y", "deny-in", Sel(), Types(PIn))),
		cnps: cnps(
			CNP("admin", "Admin", 1, NamespacesSubject(Sel()), CNPEgress(
				CNPRule("pass-y", "Pass", ToNamespaces(Sel("ns", "y"))),
				CNPRule("no-nodes", "Deny", ToNodes(Sel("zone", "b"))),
				CNPRule("no-net", "Deny", ToNetworks("192.0.2.0/24")).On(DestinationNamedPort("serve-80-tcp"), ProtoRange("TCP", 1000, 2000)),
			)),
			CNP("baseline", "Baseline", 1, NamespacesSubject(Sel("ns", "z")),
				CNPIngress(CNPRule("x", "Accept", ToPods(Sel("ns", "x"), Sel("pod", "a"))))),
		),
	})
	prog := compile.Build(c.input())
	for _, cn := range []semConn{
		denied("x/a", "y/a", TCP, 80),           // Pass, then y's NetworkPolicy denies
		denied("x/a", "172.18.0.2", TCP, 22),    // nodes peer
		denied("x/a", "192.0.2.9", TCP, 1500),   // networks, port range
		allowed("x/a", "z/a", TCP, 80),          // Baseline Accept
		allowed("x/b", "z/a", UDP, 53),          // no rule matches: default
		allowed("172.18.0.1", "z/a", TCP, 8080), // own node
	} {
		src, dst := c.addr(t, cn.from), c.addr(t, cn.to)
		var v evaluate.Verdict
		if n := testing.AllocsPerRun(1000, func() { v = evaluate.Evaluate(prog, src, dst, cn.proto, cn.port) }); n != 0 {
			t.Errorf("%s -> %s: %v allocs per run, want 0", cn.from, cn.to, n)
		}
		if v.Allowed != cn.allowed {
			t.Errorf("%s -> %s %s/%d: allowed=%v, want %v: %s", cn.from, cn.to, cn.proto, cn.port, v.Allowed, cn.allowed, v.Reason())
		}
	}
}
