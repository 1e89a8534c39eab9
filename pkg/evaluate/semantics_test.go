package evaluate_test

// Semantics tables beyond the upstream e2e cases: {policies, pods,
// connection, want verdict}.
//
// The policies are written in compiletest's builders (NetPol, Sel, Peers,
// ...), dot-imported in this package's tests so that a table reads like the
// policy it holds. Conventions: namespaces x, y, z carry only
// kubernetes.io/metadata.name unless a case adds labels; gridPod("y/b") is pod b of y at 10.244.2.2 with
// label pod=b, on node n1, serving serve-{80,81}-{tcp,udp,sctp}. Node IPs are
// 172.18.0.<n> for node n<n>. External hosts are in 192.0.2.0/24,
// 198.51.100.0/24 and 2001:db8::/32. An endpoint is a pod key (its first
// address), a pod key with "@6" (its IPv6 address), or a literal address.
// Programs are cluster-wide unless a case names a node.

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	. "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

type podOpt func(*corev1.Pod)

// mkPod is a running pod on node n1 with label pod=<name>, the grid's
// container ports and the given addresses (none: no IP yet).
func mkPod(key string, ips []string, opts ...podOpt) *corev1.Pod {
	ns, name, _ := strings.Cut(key, "/")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pod": name},
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "server", Ports: GridPorts()}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func gridPod(key string, opts ...podOpt) *corev1.Pod {
	return mkPod(key, []string{GridIP(key).String()}, opts...)
}

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

func withLabels(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		p.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func hostNetwork() podOpt { return func(p *corev1.Pod) { p.Spec.HostNetwork = true } }

func inPhase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }

func createdAt(minute int) podOpt {
	return func(p *corev1.Pod) {
		p.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, minute, 0, 0, time.UTC))
	}
}

func terminating() podOpt {
	return func(p *corev1.Pod) {
		now := metav1.NewTime(time.Date(2026, 1, 1, 1, 0, 0, 0, time.UTC))
		p.DeletionTimestamp = &now
	}
}

// containerPorts replaces the pod's container ports with name/number/protocol triples.
func containerPorts(ports ...corev1.ContainerPort) podOpt {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Ports = ports }
}

func cport(name string, n int32, proto corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto}
}

// semConn is one connection and the verdict it must get.
type semConn struct {
	from, to string
	proto    compile.Protocol
	port     uint16
	allowed  bool
	// reason, when set, must be part of the verdict's Reason().
	reason string
}

func allowed(from, to string, proto compile.Protocol, port uint16) semConn {
	return semConn{from, to, proto, port, true, ""}
}

func denied(from, to string, proto compile.Protocol, port uint16) semConn {
	return semConn{from, to, proto, port, false, ""}
}

func (c semConn) why(reason string) semConn { c.reason = reason; return c }

// semProblem is a Problem a case must produce.
type semProblem struct {
	policy, field string
	// message must be part of the problem's message.
	message string
}

type semCase struct {
	name     string
	node     string
	nodeIPs  []string
	nsLabels map[string]map[string]string
	pods     []*corev1.Pod
	policies []*networkingv1.NetworkPolicy
	cnps     []*npav1beta1.ClusterNetworkPolicy
	nodes    []*corev1.Node
	conns    []semConn
	// problems lists the problems an invalid policy must produce; a case
	// without problems must produce none.
	problems []semProblem
	// check makes further assertions on the program.
	check func(t *testing.T, prog *compile.Program)
}

func (c *semCase) input() compile.Input {
	in := compile.Input{NodeName: c.node, Pods: c.pods, Policies: c.policies, ClusterPolicies: c.cnps, Nodes: c.nodes}
	for _, ip := range c.nodeIPs {
		in.NodeIPs = append(in.NodeIPs, netip.MustParseAddr(ip))
	}
	for _, ns := range []string{"x", "y", "z"} {
		l := map[string]string{compile.NamespaceNameLabel: ns}
		for k, v := range c.nsLabels[ns] {
			l[k] = v
		}
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: l}})
	}
	return in
}

// addr resolves an endpoint against the case's pod objects (not the
// program, which leaves out host-network and terminated pods).
func (c *semCase) addr(t *testing.T, ep string) netip.Addr {
	t.Helper()
	if a, err := netip.ParseAddr(ep); err == nil {
		return a
	}
	key, v6 := strings.CutSuffix(ep, "@6")
	for _, p := range c.pods {
		if p.Namespace+"/"+p.Name != key || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			a := netip.MustParseAddr(ip.IP)
			if a.Is6() == v6 {
				return a
			}
		}
	}
	t.Fatalf("bad endpoint %q", ep)
	return netip.Addr{}
}

func runSemCases(t *testing.T, cases []semCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prog := compile.Build(c.input())
			checkProblems(t, &c, prog)
			for _, cn := range c.conns {
				src, dst := c.addr(t, cn.from), c.addr(t, cn.to)
				v := evaluate.Evaluate(prog, src, dst, cn.proto, cn.port)
				if v.Allowed != cn.allowed {
					t.Errorf("%s (%s) -> %s (%s) %s/%d: want %s, got %s (ingress=%v egress=%v): %s",
						cn.from, src, cn.to, dst, cn.proto, cn.port, VerdictWord(cn.allowed), VerdictWord(v.Allowed), v.Ingress, v.Egress, v.Reason())
				} else if cn.reason != "" && !strings.Contains(v.Reason(), cn.reason) {
					t.Errorf("%s -> %s %s/%d: %s as wanted, but the reason %q does not mention %q",
						cn.from, cn.to, cn.proto, cn.port, VerdictWord(v.Allowed), v.Reason(), cn.reason)
				}
			}
			if c.check != nil {
				c.check(t, prog)
			}
		})
	}
}

func checkProblems(t *testing.T, c *semCase, prog *compile.Program) {
	t.Helper()
	if len(c.problems) == 0 {
		if len(prog.Problems) > 0 {
			t.Fatalf("unexpected problems: %v", prog.Problems)
		}
		return
	}
	var all []string
	for _, p := range prog.Problems {
		all = append(all, fmt.Sprintf("  %s %s: %s", p.Policy, p.Field, p.Message))
	}
	for _, want := range c.problems {
		if !hasProblem(prog.Problems, want) {
			t.Errorf("no problem %s %s (message with %q); got:\n%s", want.policy, want.field, want.message, strings.Join(all, "\n"))
		}
		// The scenario loader rejects what the builder reports.
		for _, np := range c.policies {
			if np.Namespace+"/"+np.Name == want.policy && !hasProblem(compile.ValidatePolicy(np), want) {
				t.Errorf("ValidatePolicy(%s) does not report %s", want.policy, want.field)
			}
		}
		for _, cnp := range c.cnps {
			if cnp.Name == want.policy && !hasProblem(compile.ValidateClusterPolicy(cnp), want) {
				t.Errorf("ValidateClusterPolicy(%s) does not report %s", want.policy, want.field)
			}
		}
	}
}

func hasProblem(ps []compile.Problem, want semProblem) bool {
	for _, p := range ps {
		if p.Policy == want.policy && p.Field == want.field && strings.Contains(p.Message, want.message) && p.Message != "" {
			return true
		}
	}
	return false
}

func gridPods(keys ...string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, k := range keys {
		out = append(out, gridPod(k))
	}
	return out
}

func TestSemantics(t *testing.T) {
	runSemCases(t, []semCase{
		// Dual-stack: each family is decided on its own; selectors match both
		// addresses of a pod, an ipBlock only its own family.
		{
			name: "dual-stack: selectors match both families, ipBlock one",
			pods: []*corev1.Pod{
				mkPod("x/a", []string{"10.244.1.1", "fd00:10:244:1::1"}),
				mkPod("y/b", []string{"10.244.2.2", "fd00:10:244:2::2"}),
				mkPod("y/c", []string{"fd00:10:244:2::3"}),
			},
			policies: List(NetPol("x", "a-ingress", Sel("pod", "a"), Ingress(
				Peers(PodNSPeer(Sel("pod", "b"), Sel(NSName, "y"))),
				Peers(IPPeer("0.0.0.0/0")),
			))),
			conns: []semConn{
				allowed("y/b", "x/a", TCP, 80).why("allowed by x/a-ingress ingress[0]"),
				allowed("y/b@6", "x/a@6", TCP, 80).why("allowed by x/a-ingress ingress[0]"),
				allowed("192.0.2.7", "x/a", TCP, 80).why("allowed by x/a-ingress ingress[1]"),
				allowed("::ffff:192.0.2.7", "x/a", TCP, 80), // IPv4-mapped is IPv4
				denied("2001:db8::7", "x/a@6", TCP, 80),     // 0.0.0.0/0 is not ::/0
				denied("y/c@6", "x/a@6", TCP, 80),
			},
		},
		{
			name: "dual-stack: egress to an IPv6 block only",
			pods: []*corev1.Pod{
				mkPod("x/a", []string{"10.244.1.1", "fd00:10:244:1::1"}),
				mkPod("y/b", []string{"10.244.2.2", "fd00:10:244:2::2"}),
			},
			policies: List(NetPol("x", "a-egress-v6", Sel("pod", "a"), Types(PEg), Egress(Peers(IPPeer("::/0"))))),
			conns: []semConn{
				allowed("x/a@6", "y/b@6", TCP, 80),
				allowed("x/a@6", "2001:db8::1", UDP, 53),
				denied("x/a", "y/b", TCP, 80),
				denied("x/a", "192.0.2.1", UDP, 53),
				allowed("y/b@6", "x/a@6", TCP, 80).why(evaluate.ReasonIngressNotIsolated),
			},
		},

		// Named ports resolve per destination pod.
		{
			name: "named ports: same name, different numbers",
			pods: []*corev1.Pod{
				gridPod("x/a", containerPorts(cport("http", 8080, corev1.ProtocolTCP), cport("dns", 53, corev1.ProtocolUDP))),
				gridPod("x/b", containerPorts(cport("http", 9090, corev1.ProtocolTCP))),
				gridPod("x/c", containerPorts(cport("web", 8080, corev1.ProtocolTCP))),
				gridPod("y/a"),
			},
			policies: List(NetPol("x", "allow-http", Sel(), Ingress(Peers().On(NamedPort("http", ""), NamedPort("dns", "UDP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 8080),
				denied("y/a", "x/a", TCP, 9090),
				allowed("y/a", "x/b", TCP, 9090),
				denied("y/a", "x/b", TCP, 8080),
				denied("y/a", "x/c", TCP, 8080), // x/c has no port named http
				denied("y/a", "x/a", UDP, 8080), // http is TCP
				allowed("y/a", "x/a", UDP, 53),
				denied("y/a", "x/a", TCP, 53),
				denied("y/a", "x/b", UDP, 53),
			},
		},
		{
			name: "named ports: egress resolves on the destination pod",
			pods: []*corev1.Pod{
				gridPod("x/a", containerPorts(cport("http", 8080, corev1.ProtocolTCP))),
				gridPod("x/b", containerPorts(cport("http", 9090, corev1.ProtocolTCP))),
				// The source serves http on 7070: that number must not be used.
				gridPod("y/a", containerPorts(cport("http", 7070, corev1.ProtocolTCP))),
			},
			policies: List(NetPol("y", "egress-http", Sel("pod", "a"), Types(PEg), Egress(Peers().On(NamedPort("http", "TCP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 8080),
				denied("y/a", "x/a", TCP, 9090),
				denied("y/a", "x/a", TCP, 7070),
				allowed("y/a", "x/b", TCP, 9090),
				denied("y/a", "x/b", TCP, 8080),
				denied("y/a", "192.0.2.1", TCP, 8080), // not a pod: a named port matches nothing
				denied("y/a", "192.0.2.1", TCP, 7070),
			},
		},

		// endPort ranges include both edges.
		{
			name: "endPort ranges",
			pods: gridPods("x/a", "y/a"),
			policies: List(NetPol("x", "ranges", Sel("pod", "a"), Ingress(Peers().On(
				PortRange(1000, 2000, ""), PortRange(3000, 3000, "TCP"), PortRange(65000, 65535, "UDP"), Port(5000, "UDP"))))),
			conns: []semConn{
				denied("y/a", "x/a", TCP, 999),
				allowed("y/a", "x/a", TCP, 1000),
				allowed("y/a", "x/a", TCP, 1500),
				allowed("y/a", "x/a", TCP, 2000),
				denied("y/a", "x/a", TCP, 2001),
				denied("y/a", "x/a", TCP, 2999),
				allowed("y/a", "x/a", TCP, 3000),
				denied("y/a", "x/a", TCP, 3001),
				denied("y/a", "x/a", UDP, 1500),
				denied("y/a", "x/a", UDP, 64999),
				allowed("y/a", "x/a", UDP, 65000),
				allowed("y/a", "x/a", UDP, 65535),
				denied("y/a", "x/a", TCP, 65535),
				allowed("y/a", "x/a", UDP, 5000),
				denied("y/a", "x/a", SCTP, 1000),
			},
		},

		// ipBlock applies to pod IPs too, except included.
		{
			name: "ipBlock except excludes pods",
			pods: gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/a"),
			policies: List(
				NetPol("x", "a-egress-cidr", Sel("pod", "a"), Types(PEg),
					Egress(Peers(IPPeer("10.244.0.0/16", "10.244.2.2/32", "10.244.3.0/24")))),
				NetPol("x", "b-ingress-cidr", Sel("pod", "b"), Ingress(Peers(IPPeer("10.244.0.0/16", "10.244.1.0/24"))))),
			conns: []semConn{
				allowed("x/a", "y/a", TCP, 80),
				denied("x/a", "y/b", TCP, 80),
				denied("x/a", "z/a", TCP, 80),
				allowed("x/a", "x/c", TCP, 80),
				denied("x/a", "192.0.2.1", TCP, 80),
				allowed("y/a", "x/b", TCP, 80),
				allowed("10.244.200.1", "x/b", TCP, 80),
				denied("x/c", "x/b", TCP, 80),
				denied("x/a", "x/b", TCP, 80), // excluded on both sides
			},
		},

		// A policy allowing only UDP or only SCTP isolates the pod for TCP.
		{
			name: "protocol isolation",
			pods: gridPods("x/a", "x/b", "x/c", "y/a"),
			policies: List(
				NetPol("x", "a-udp-only", Sel("pod", "a"), Ingress(Peers().On(Port(80, "UDP")))),
				NetPol("x", "b-sctp-only", Sel("pod", "b"), Ingress(Peers().On(Port(80, "SCTP")))),
				NetPol("x", "c-egress-udp-only", Sel("pod", "c"), Types(PEg), Egress(Peers().On(Port(53, "UDP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", UDP, 80),
				denied("y/a", "x/a", TCP, 80).why("x/a-udp-only isolates x/a for ingress"),
				denied("y/a", "x/a", SCTP, 80),
				allowed("y/a", "x/b", SCTP, 80),
				denied("y/a", "x/b", TCP, 80),
				denied("y/a", "x/b", UDP, 80),
				allowed("x/c", "192.0.2.53", UDP, 53),
				denied("x/c", "192.0.2.53", TCP, 53),
				denied("x/c", "y/a", SCTP, 53),
			},
		},

		// A port entry with a protocol and no port allows every port of it.
		{
			name: "ports with a protocol and no port",
			pods: gridPods("x/a", "x/b", "y/a"),
			policies: List(
				NetPol("x", "a-any-udp", Sel("pod", "a"), Ingress(Peers().On(ProtoOnly("UDP")))),
				NetPol("x", "b-any-sctp", Sel("pod", "b"), Ingress(Peers().On(ProtoOnly("SCTP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", UDP, 1),
				allowed("y/a", "x/a", UDP, 80),
				allowed("y/a", "x/a", UDP, 65535),
				denied("y/a", "x/a", TCP, 80),
				allowed("y/a", "x/b", SCTP, 9),
				denied("y/a", "x/b", UDP, 9),
			},
		},

		// Host-network pods are neither selected nor matched as pods: their
		// traffic comes from their (node) IP and only ipBlock matches it.
		{
			name: "host-network pods",
			pods: []*corev1.Pod{
				gridPod("x/a"), gridPod("x/b"),
				mkPod("x/h", []string{"172.18.0.10"}, hostNetwork(), withLabels("pod", "h")),
			},
			policies: List(
				NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress()),
				NetPol("x", "a-from-h", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "h")), NSPeer(Sel())))),
				NetPol("x", "b-from-node-range", Sel("pod", "b"), Ingress(Peers(IPPeer("172.18.0.0/24"))))),
			conns: []semConn{
				denied("x/h", "x/a", TCP, 80),
				allowed("x/h", "x/b", TCP, 80).why("allowed by x/b-from-node-range ingress[0]"),
				allowed("192.0.2.1", "x/h", TCP, 80).why(evaluate.ReasonIngressNotIsolated),
				allowed("x/h", "192.0.2.1", TCP, 80).why(evaluate.ReasonEgressNotIsolated),
				denied("x/a", "x/h", TCP, 80).why("x/deny-all isolates x/a for egress"),
			},
			check: func(t *testing.T, prog *compile.Program) {
				if id, ok := prog.PodByIP(netip.MustParseAddr("172.18.0.10")); ok {
					t.Errorf("host-network pod's IP belongs to %s in the program", prog.Pods[id].Key)
				}
			},
		},

		// Traffic between a node and its own pods is always allowed; another
		// node's address is an ordinary external address.
		{
			name:    "node to pod traffic",
			node:    "n1",
			nodeIPs: []string{"172.18.0.1", "fd00:18::1"},
			pods:    []*corev1.Pod{gridPod("x/a"), gridPod("x/b", onNode("n2"))},
			policies: List(
				NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress())),
			conns: []semConn{
				allowed("172.18.0.1", "x/a", TCP, 10250).why(evaluate.ReasonNodeTraffic),
				allowed("x/a", "172.18.0.1", UDP, 53).why(evaluate.ReasonNodeTraffic),
				denied("172.18.0.2", "x/a", TCP, 10250).why("x/deny-all isolates x/a for ingress"),
				denied("x/a", "172.18.0.2", TCP, 80).why("x/deny-all isolates x/a for egress"),
				denied("x/a", "x/b", TCP, 80), // x/a's egress is enforced here
				allowed("172.18.0.1", "x/b", TCP, 80).why(evaluate.ReasonNotEnforcedHere),
			},
		},

		// A node enforces only its own pods; peers on other nodes still match.
		{
			name: "per-node locality",
			node: "n1",
			pods: []*corev1.Pod{gridPod("x/a"), gridPod("x/b"), gridPod("x/c", onNode("n2")), gridPod("y/b", onNode("n2"))},
			policies: List(
				NetPol("y", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress()),
				NetPol("x", "a-from-c", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "c")))))),
			conns: []semConn{
				allowed("y/b", "x/b", TCP, 80).why(evaluate.ReasonNotEnforcedHere),
				allowed("x/b", "y/b", TCP, 80).why(evaluate.ReasonNotEnforcedHere),
				allowed("x/c", "x/a", TCP, 80).why("allowed by x/a-from-c ingress[0]"),
				denied("x/b", "x/a", TCP, 80),
				denied("y/b", "x/a", TCP, 80).why("x/a-from-c isolates x/a for ingress"),
			},
			check: func(t *testing.T, prog *compile.Program) {
				v := evaluate.Evaluate(prog, GridIP("y/b"), GridIP("x/b"), TCP, 80)
				if v.EgressReason != evaluate.ReasonNotEnforcedHere {
					t.Errorf("egress reason of a pod on n2: got %q, want %q", v.EgressReason, evaluate.ReasonNotEnforcedHere)
				}
			},
		},

		// Pods without IPs take no part; a terminated pod's IP belongs to the
		// running pod that reuses it, and so does a terminating pod's.
		{
			name: "pods without IPs and IP reuse",
			pods: []*corev1.Pod{
				gridPod("x/a"), gridPod("y/a"),
				mkPod("x/pending", nil, withLabels("pod", "b")),
				mkPod("x/old", []string{"10.244.1.50"}, withLabels("pod", "b"), inPhase(corev1.PodSucceeded), createdAt(30)),
				mkPod("x/new", []string{"10.244.1.50"}, withLabels("pod", "c"), createdAt(10)),
				mkPod("x/failed", []string{"10.244.1.51"}, withLabels("pod", "b"), inPhase(corev1.PodFailed)),
				mkPod("x/going", []string{"10.244.1.60"}, withLabels("pod", "b"), terminating(), createdAt(40)),
				mkPod("x/replacement", []string{"10.244.1.60"}, withLabels("pod", "d"), createdAt(5)),
			},
			policies: List(
				NetPol("x", "a-from-b", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "b"))))),
				NetPol("x", "c-no-egress", Sel("pod", "c"), Types(PEg), Egress())),
			conns: []semConn{
				denied("10.244.1.50", "x/a", TCP, 80),
				denied("10.244.1.50", "y/a", TCP, 80).why("x/c-no-egress isolates x/new for egress"),
				denied("10.244.1.51", "x/a", TCP, 80),
				denied("10.244.1.60", "x/a", TCP, 80),
				allowed("x/a", "10.244.1.51", TCP, 80).why(evaluate.ReasonIngressNotIsolated),
			},
			check: func(t *testing.T, prog *compile.Program) {
				// x/new's labels (pod=c), not x/old's (pod=b), decide.
				v := evaluate.Evaluate(prog, netip.MustParseAddr("10.244.1.50"), GridIP("x/a"), TCP, 80)
				if v.Ingress || !strings.Contains(v.IngressReason, "x/a-from-b isolates x/a for ingress") {
					t.Errorf("10.244.1.50 -> x/a: ingress %v (%s), want denied by x/a-from-b", v.Ingress, v.IngressReason)
				}
				for ip, want := range map[string]string{"10.244.1.50": "x/new", "10.244.1.60": "x/replacement"} {
					id, ok := prog.PodByIP(netip.MustParseAddr(ip))
					if !ok || prog.Pods[id].Key != want {
						t.Errorf("%s: owned by %v (found %v), want %s", ip, prog.Pods[id].Key, ok, want)
					}
				}
				for _, k := range []string{"x/pending", "x/old", "x/failed", "x/going"} {
					if _, ok := prog.PodByKey(k); ok {
						t.Errorf("%s is in the program", k)
					}
				}
			},
		},

		// Empty and absent lists mean "all"; an empty selector is scoped.
		{
			name: "empty vs absent from, to and ports",
			pods: gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a"),
			policies: List(
				NetPol("x", "a-absent", Sel("pod", "a"), Ingress(Peers())),
				NetPol("x", "b-empty", Sel("pod", "b"), Ingress(Rule{Peers: []networkingv1.NetworkPolicyPeer{}, Ports: []networkingv1.NetworkPolicyPort{}})),
				NetPol("x", "c-pods-of-x", Sel("pod", "c"), Ingress(Peers(PodPeer(Sel())))),
				NetPol("y", "a-all-pods", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel())))),
				NetPol("y", "b-no-rules", Sel("pod", "b"), Types(PIn), Ingress()),
				NetPol("y", "c-empty-port", Sel("pod", "c"), Ingress(Peers().On(networkingv1.NetworkPolicyPort{})))),
			conns: []semConn{
				allowed("192.0.2.1", "x/a", UDP, 9),
				allowed("192.0.2.1", "x/b", SCTP, 9),
				allowed("y/a", "x/b", TCP, 80),
				allowed("x/a", "x/c", TCP, 80),
				denied("y/a", "x/c", TCP, 80),
				denied("192.0.2.1", "x/c", TCP, 80),
				allowed("x/a", "y/a", TCP, 80),
				allowed("z/a", "y/a", TCP, 80),
				denied("192.0.2.1", "y/a", TCP, 80),
				denied("y/a", "y/b", TCP, 80),
				denied("192.0.2.1", "y/b", UDP, 80),
				allowed("x/a", "y/c", TCP, 1),
				allowed("x/a", "y/c", TCP, 65535),
				denied("x/a", "y/c", UDP, 80),
			},
		},

		// policyTypes: absent means Ingress, plus Egress when there are
		// egress rules; given, it is taken as written.
		{
			name: "policyTypes defaulting",
			pods: gridPods("x/a", "x/b", "x/c", "y/a"),
			policies: List(
				NetPol("x", "a-egress-rules", Sel("pod", "a"), Egress(Peers(IPPeer("192.0.2.0/24")))),
				NetPol("x", "b-ingress-rules", Sel("pod", "b"), Ingress(Peers(PodPeer(Sel("pod", "c"))))),
				NetPol("x", "c-ingress-type", Sel("pod", "c"), Types(PIn), Ingress(Peers()), Egress(Peers(IPPeer("192.0.2.0/24"))))),
			conns: []semConn{
				denied("y/a", "x/a", TCP, 80).why("x/a-egress-rules isolates x/a for ingress"),
				allowed("x/a", "192.0.2.1", TCP, 80),
				denied("x/a", "y/a", TCP, 80).why("x/a-egress-rules isolates x/a for egress"),
				allowed("x/b", "y/a", TCP, 80).why(evaluate.ReasonEgressNotIsolated),
				allowed("x/c", "x/b", TCP, 80),
				allowed("x/c", "y/a", TCP, 80).why(evaluate.ReasonEgressNotIsolated),
			},
		},
		{
			name:     "an egress-only policy does not isolate ingress",
			pods:     gridPods("x/a", "y/a"),
			policies: List(NetPol("x", "a-no-egress", Sel("pod", "a"), Types(PEg), Egress())),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why(evaluate.ReasonIngressNotIsolated),
				denied("x/a", "y/a", TCP, 80).why("x/a-no-egress isolates x/a for egress"),
			},
		},

		// Policies add up: a connection is allowed when any rule of any
		// isolating policy allows it; a deny-all policy takes nothing away.
		{
			name: "additive union of policies",
			pods: gridPods("x/a", "x/b", "y/a", "z/a"),
			policies: List(
				NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress()),
				NetPol("x", "a-from-y-80", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(NSName, "y"))).On(Port(80, "")))),
				NetPol("x", "a-from-b-81", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "b"))).On(Port(81, "")))),
				NetPol("x", "b-to-a", Sel("pod", "b"), Types(PEg), Egress(Peers(PodPeer(Sel("pod", "a"))))),
				NetPol("x", "b-to-z", Sel("pod", "b"), Types(PEg), Egress(Peers(NSPeer(Sel(NSName, "z")))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why("allowed by x/a-from-y-80 ingress[0]"),
				denied("y/a", "x/a", TCP, 81).why("x/a-from-b-81, x/a-from-y-80, x/deny-all isolate x/a for ingress"),
				allowed("x/b", "x/a", TCP, 81).why("allowed by x/b-to-a egress[0]; allowed by x/a-from-b-81 ingress[0]"),
				denied("x/b", "x/a", TCP, 80),
				denied("z/a", "x/a", TCP, 80),
				allowed("x/b", "z/a", TCP, 80),
				denied("x/b", "y/a", TCP, 80),
			},
		},

		// One peer with both selectors is an AND; two peers are an OR, and a
		// podSelector alone means the policy's namespace.
		{
			name: "namespaceSelector and podSelector: one peer vs two peers",
			pods: gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/b"),
			policies: List(
				NetPol("x", "a-one-peer", Sel("pod", "a"), Ingress(Peers(PodNSPeer(Sel("pod", "b"), Sel(NSName, "y"))))),
				NetPol("x", "c-two-peers", Sel("pod", "c"), Ingress(Peers(NSPeer(Sel(NSName, "y")), PodPeer(Sel("pod", "b")))))),
			conns: []semConn{
				allowed("y/b", "x/a", TCP, 80),
				denied("y/a", "x/a", TCP, 80),
				denied("x/b", "x/a", TCP, 80),
				denied("z/b", "x/a", TCP, 80),
				allowed("y/a", "x/c", TCP, 80),
				allowed("y/b", "x/c", TCP, 80),
				allowed("x/b", "x/c", TCP, 80),
				denied("z/b", "x/c", TCP, 80),
				denied("x/a", "x/c", TCP, 80),
			},
		},
	})
}

// TestInvalidPolicies builds programs from objects the API server would
// reject (the scenario loader refuses them). The invalid part must be
// reported with its field path and allow nothing; the valid parts still work.
func TestInvalidPolicies(t *testing.T) {
	pods := gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/a")
	badSel := Expr("pod", metav1.LabelSelectorOperator("Equals"), "b")
	runSemCases(t, []semCase{
		{
			name: "bad podSelector operator isolates the whole namespace",
			pods: pods,
			policies: List(
				NetPol("x", "bad-target", badSel, Types(PIn), Ingress(Peers())),
				NetPol("x", "a-from-y", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(NSName, "y")))))),
			problems: []semProblem{{"x/bad-target", "spec.podSelector.matchExpressions[0].operator", "Equals"}},
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why("allowed by x/a-from-y ingress[0]"),
				denied("z/a", "x/a", TCP, 80),
				denied("y/a", "x/b", TCP, 80).why("x/bad-target isolates x/b for ingress"),
				denied("x/a", "x/c", TCP, 80),
				denied("192.0.2.1", "x/c", UDP, 53),
				allowed("x/b", "y/a", TCP, 80), // ingress only
			},
		},
		{
			name: "bad selector in a peer: that peer matches nothing",
			pods: pods,
			policies: List(
				NetPol("x", "bad-peer", Sel("pod", "a"), Ingress(Peers(PodPeer(badSel), NSPeer(Sel(NSName, "y"))))),
				NetPol("x", "bad-ns-part", Sel("pod", "c"), Ingress(Peers(PodNSPeer(Sel("pod", "b"), badSel))))),
			problems: []semProblem{
				{"x/bad-peer", "spec.ingress[0].from[0].podSelector.matchExpressions[0].operator", "Equals"},
				{"x/bad-ns-part", "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].operator", "Equals"},
			},
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80),
				allowed("y/b", "x/a", TCP, 80),
				denied("x/b", "x/a", TCP, 80),
				denied("x/b", "x/c", TCP, 80), // the pod part alone would match
				denied("y/b", "x/c", TCP, 80),
			},
		},
		{
			name: "bad CIDR",
			pods: pods,
			policies: List(
				NetPol("x", "bad-cidr", Sel("pod", "a"), Ingress(Peers(IPPeer("10.244.0.0/33"), PodPeer(Sel("pod", "b"))))),
				NetPol("x", "mapped-cidr", Sel("pod", "c"), Ingress(Peers(IPPeer("::ffff:10.244.0.0/112"))))),
			problems: []semProblem{
				{"x/bad-cidr", "spec.ingress[0].from[0].ipBlock.cidr", "10.244.0.0/33"},
				{"x/mapped-cidr", "spec.ingress[0].from[0].ipBlock.cidr", "IPv4-mapped"},
			},
			conns: []semConn{
				allowed("x/b", "x/a", TCP, 80),
				denied("y/a", "x/a", TCP, 80),
				denied("10.244.2.1", "x/a", TCP, 80),
				denied("y/a", "x/c", TCP, 80),
				denied("::ffff:10.244.2.1", "x/c", TCP, 80),
			},
		},
		{
			name: "except outside cidr",
			pods: pods,
			policies: List(
				NetPol("x", "bad-except", Sel("pod", "a"), Types(PEg), Egress(Peers(IPPeer("10.244.2.0/24", "10.244.3.0/24"), IPPeer("192.0.2.0/24")))),
				NetPol("x", "except-is-cidr", Sel("pod", "b"), Types(PEg), Egress(Peers(IPPeer("10.244.2.0/24", "10.244.2.0/24")))),
				NetPol("x", "except-other-family", Sel("pod", "c"), Types(PEg), Egress(Peers(IPPeer("10.244.2.0/24", "fd00::/64"))))),
			problems: []semProblem{
				{"x/bad-except", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
				{"x/except-is-cidr", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
				{"x/except-other-family", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
			},
			conns: []semConn{
				denied("x/a", "y/a", TCP, 80), // inside cidr: the whole peer is void
				denied("x/a", "z/a", TCP, 80),
				allowed("x/a", "192.0.2.1", TCP, 80),
				denied("x/b", "y/a", TCP, 80),
				denied("x/c", "y/b", TCP, 80),
			},
		},
		{
			name: "invalid port entries allow nothing, valid ones still do",
			pods: []*corev1.Pod{gridPod("x/a", containerPorts(cport("http", 8080, corev1.ProtocolTCP))), gridPod("x/b"), gridPod("x/c"), gridPod("y/a")},
			policies: List(
				NetPol("x", "named-with-endport", Sel("pod", "a"), Ingress(Peers().On(func() networkingv1.NetworkPolicyPort {
					p := NamedPort("http", "TCP")
					end := int32(9000)
					p.EndPort = &end
					return p
				}(), Port(81, "")))),
				NetPol("x", "endport-below-port", Sel("pod", "b"), Ingress(Peers().On(PortRange(90, 80, "TCP")))),
				NetPol("x", "unknown-protocol", Sel("pod", "c"), Ingress(Peers().On(Port(80, "ICMP"))))),
			problems: []semProblem{
				{"x/named-with-endport", "spec.ingress[0].ports[0].endPort", "named port"},
				{"x/endport-below-port", "spec.ingress[0].ports[0].endPort", "80"},
				{"x/unknown-protocol", "spec.ingress[0].ports[0].protocol", "ICMP"},
			},
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 81),
				denied("y/a", "x/a", TCP, 8080),
				denied("y/a", "x/a", TCP, 8500),
				denied("y/a", "x/b", TCP, 80),
				denied("y/a", "x/b", TCP, 85),
				denied("y/a", "x/b", TCP, 90),
				denied("y/a", "x/c", TCP, 80).why("x/unknown-protocol isolates x/c for ingress"),
				denied("y/a", "x/c", UDP, 80),
				denied("y/a", "x/c", SCTP, 80),
			},
		},
		{
			name: "endPort without port, port out of range, bad port name",
			pods: pods,
			policies: List(
				NetPol("x", "endport-alone", Sel("pod", "a"), Ingress(Peers().On(func() networkingv1.NetworkPolicyPort {
					p := ProtoOnly("TCP")
					end := int32(90)
					p.EndPort = &end
					return p
				}()))),
				NetPol("x", "port-zero", Sel("pod", "b"), Ingress(Peers().On(Port(0, "TCP"), Port(70000, "UDP")))),
				NetPol("x", "bad-name", Sel("pod", "c"), Ingress(Peers().On(NamedPort("Serve_80", ""))))),
			problems: []semProblem{
				{"x/endport-alone", "spec.ingress[0].ports[0].endPort", "without port"},
				{"x/port-zero", "spec.ingress[0].ports[0].port", "out of range"},
				{"x/port-zero", "spec.ingress[0].ports[1].port", "out of range"},
				{"x/bad-name", "spec.ingress[0].ports[0].port", "Serve_80"},
			},
			conns: []semConn{
				denied("y/a", "x/a", TCP, 80), // not "every TCP port"
				denied("y/a", "x/a", TCP, 90),
				denied("y/a", "x/b", TCP, 80),
				denied("y/a", "x/b", UDP, 4464), // 70000 mod 65536
				denied("y/a", "x/c", TCP, 80),
			},
		},
		{
			name: "unknown policyType isolates both directions",
			pods: pods,
			policies: List(
				NetPol("x", "bad-type", Sel("pod", "a"), Types("Both"), Ingress(Peers(PodPeer(Sel("pod", "b")))))),
			problems: []semProblem{{"x/bad-type", "spec.policyTypes[0]", "Both"}},
			conns: []semConn{
				allowed("x/b", "x/a", TCP, 80),
				denied("y/a", "x/a", TCP, 80),
				denied("x/a", "y/a", TCP, 80).why("x/bad-type isolates x/a for egress"),
				denied("x/a", "x/b", TCP, 80),
			},
		},
		{
			// 16,000 scattered exceptions are within the bound: enforced
			// as written (grid addresses with an odd last octet are never
			// among the scattered ones).
			name: "ipBlock with 16,000 exceptions within the cost bound",
			pods: pods,
			policies: List(
				NetPol("x", "many-excepts", Sel("pod", "a"), Ingress(Peers(
					IPPeer("10.0.0.0/8", append(ScatteredExcepts(16000, 1), "10.244.2.2/32")...))))),
			conns: []semConn{
				allowed("y/a", "x/a", TCP, 80).why("allowed by x/many-excepts ingress[0]"),
				denied("y/b", "x/a", TCP, 80),
				denied("192.0.2.1", "x/a", TCP, 80),
			},
		},
		{
			// Past compile.MaxPolicyCost the policy is not compiled: it
			// isolates the pods it selects and allows nothing, and every
			// other policy is enforced as usual.
			name: "a policy over the cost bound isolates its pods and allows nothing",
			pods: pods,
			policies: List(
				NetPol("x", "too-large", Sel("pod", "a"), Ingress(Peers(
					IPPeer("10.0.0.0/8", ScatteredExcepts(compile.MaxPolicyCost, 1)...), NSPeer(Sel(NSName, "y"))))),
				NetPol("x", "allow-b", Sel("pod", "b"), Ingress(Peers(NSPeer(Sel(NSName, "y")))))),
			problems: []semProblem{{"x/too-large", "spec", "too large to compile"}},
			conns: []semConn{
				denied("y/a", "x/a", TCP, 80).why("x/too-large isolates x/a for ingress"),
				denied("x/c", "x/a", TCP, 80),
				denied("192.0.2.1", "x/a", TCP, 80),
				allowed("x/a", "y/a", TCP, 80), // ingress only
				allowed("y/a", "x/b", TCP, 80).why("allowed by x/allow-b ingress[0]"),
				denied("x/c", "x/b", TCP, 80),
			},
			check: func(t *testing.T, prog *compile.Program) {
				for _, p := range prog.Policies {
					if p.Rejected != (p.Key == "x/too-large") || (p.Rejected && len(p.Ingress)+len(p.Egress) > 0) {
						t.Errorf("%s: rejected %v with %d rules", p.Key, p.Rejected, len(p.Ingress)+len(p.Egress))
					}
				}
			},
		},
		{
			name: "peer with nothing or with both ipBlock and a selector",
			pods: pods,
			policies: List(
				NetPol("x", "empty-peer", Sel("pod", "a"), Ingress(Peers(networkingv1.NetworkPolicyPeer{}, PodPeer(Sel("pod", "b"))))),
				NetPol("x", "ipblock-and-selector", Sel("pod", "c"), Ingress(Peers(networkingv1.NetworkPolicyPeer{
					IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}, PodSelector: &metav1.LabelSelector{}})))),
			problems: []semProblem{
				{"x/empty-peer", "spec.ingress[0].from[0]", "must specify a peer"},
				{"x/ipblock-and-selector", "spec.ingress[0].from[0]", "ipBlock"},
			},
			conns: []semConn{
				allowed("x/b", "x/a", TCP, 80),
				denied("y/a", "x/a", TCP, 80),
				denied("x/b", "x/c", TCP, 80),
				denied("192.0.2.1", "x/c", TCP, 80),
			},
		},
	})
}
