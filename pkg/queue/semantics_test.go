package queue_test

// Semantics tables beyond the upstream e2e cases: {policies, pods,
// connection, want verdict}.
//
// Conventions (besides those of netpol_cases_test.go, whose builders these
// tables use): namespaces x, y, z carry only kubernetes.io/metadata.name
// unless a case adds labels; gridPod("y/b") is pod b of y at 10.244.2.2 with
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
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

type podOpt func(*corev1.Pod)

// mkPod is a running pod on node n1 with label pod=<name>, the grid's
// container ports and the given addresses (none: no IP yet).
func mkPod(key string, ips []string, opts ...podOpt) *corev1.Pod {
	ns, name, _ := strings.Cut(key, "/")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pod": name},
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "server", Ports: gridPorts()}}},
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
	return mkPod(key, []string{gridIP(key).String()}, opts...)
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
				v := queue.Evaluate(prog, src, dst, cn.proto, cn.port)
				if v.Allowed != cn.allowed {
					t.Errorf("%s (%s) -> %s (%s) %s/%d: want %s, got %s (ingress=%v egress=%v): %s",
						cn.from, src, cn.to, dst, cn.proto, cn.port, verdictWord(cn.allowed), verdictWord(v.Allowed), v.Ingress, v.Egress, v.Reason())
				} else if cn.reason != "" && !strings.Contains(v.Reason(), cn.reason) {
					t.Errorf("%s -> %s %s/%d: %s as wanted, but the reason %q does not mention %q",
						cn.from, cn.to, cn.proto, cn.port, verdictWord(v.Allowed), v.Reason(), cn.reason)
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
			policies: policies(netpol("x", "a-ingress", sel("pod", "a"), in(
				peers(podNsPeer(sel("pod", "b"), sel(nsName, "y"))),
				peers(ipPeer("0.0.0.0/0")),
			))),
			conns: []semConn{
				allowed("y/b", "x/a", tcp, 80).why("allowed by x/a-ingress ingress[0]"),
				allowed("y/b@6", "x/a@6", tcp, 80).why("allowed by x/a-ingress ingress[0]"),
				allowed("192.0.2.7", "x/a", tcp, 80).why("allowed by x/a-ingress ingress[1]"),
				allowed("::ffff:192.0.2.7", "x/a", tcp, 80), // IPv4-mapped is IPv4
				denied("2001:db8::7", "x/a@6", tcp, 80),     // 0.0.0.0/0 is not ::/0
				denied("y/c@6", "x/a@6", tcp, 80),
			},
		},
		{
			name: "dual-stack: egress to an IPv6 block only",
			pods: []*corev1.Pod{
				mkPod("x/a", []string{"10.244.1.1", "fd00:10:244:1::1"}),
				mkPod("y/b", []string{"10.244.2.2", "fd00:10:244:2::2"}),
			},
			policies: policies(netpol("x", "a-egress-v6", sel("pod", "a"), types(pEg), eg(peers(ipPeer("::/0"))))),
			conns: []semConn{
				allowed("x/a@6", "y/b@6", tcp, 80),
				allowed("x/a@6", "2001:db8::1", udp, 53),
				denied("x/a", "y/b", tcp, 80),
				denied("x/a", "192.0.2.1", udp, 53),
				allowed("y/b@6", "x/a@6", tcp, 80).why(queue.ReasonIngressNotIsolated),
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
			policies: policies(netpol("x", "allow-http", sel(), in(peers().on(namedPort("http", ""), namedPort("dns", "UDP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 8080),
				denied("y/a", "x/a", tcp, 9090),
				allowed("y/a", "x/b", tcp, 9090),
				denied("y/a", "x/b", tcp, 8080),
				denied("y/a", "x/c", tcp, 8080), // x/c has no port named http
				denied("y/a", "x/a", udp, 8080), // http is TCP
				allowed("y/a", "x/a", udp, 53),
				denied("y/a", "x/a", tcp, 53),
				denied("y/a", "x/b", udp, 53),
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
			policies: policies(netpol("y", "egress-http", sel("pod", "a"), types(pEg), eg(peers().on(namedPort("http", "TCP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 8080),
				denied("y/a", "x/a", tcp, 9090),
				denied("y/a", "x/a", tcp, 7070),
				allowed("y/a", "x/b", tcp, 9090),
				denied("y/a", "x/b", tcp, 8080),
				denied("y/a", "192.0.2.1", tcp, 8080), // not a pod: a named port matches nothing
				denied("y/a", "192.0.2.1", tcp, 7070),
			},
		},

		// endPort ranges include both edges.
		{
			name: "endPort ranges",
			pods: gridPods("x/a", "y/a"),
			policies: policies(netpol("x", "ranges", sel("pod", "a"), in(peers().on(
				portRange(1000, 2000, ""), portRange(3000, 3000, "TCP"), portRange(65000, 65535, "UDP"), port(5000, "UDP"))))),
			conns: []semConn{
				denied("y/a", "x/a", tcp, 999),
				allowed("y/a", "x/a", tcp, 1000),
				allowed("y/a", "x/a", tcp, 1500),
				allowed("y/a", "x/a", tcp, 2000),
				denied("y/a", "x/a", tcp, 2001),
				denied("y/a", "x/a", tcp, 2999),
				allowed("y/a", "x/a", tcp, 3000),
				denied("y/a", "x/a", tcp, 3001),
				denied("y/a", "x/a", udp, 1500),
				denied("y/a", "x/a", udp, 64999),
				allowed("y/a", "x/a", udp, 65000),
				allowed("y/a", "x/a", udp, 65535),
				denied("y/a", "x/a", tcp, 65535),
				allowed("y/a", "x/a", udp, 5000),
				denied("y/a", "x/a", sctp, 1000),
			},
		},

		// ipBlock applies to pod IPs too, except included.
		{
			name: "ipBlock except excludes pods",
			pods: gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/a"),
			policies: policies(
				netpol("x", "a-egress-cidr", sel("pod", "a"), types(pEg),
					eg(peers(ipPeer("10.244.0.0/16", "10.244.2.2/32", "10.244.3.0/24")))),
				netpol("x", "b-ingress-cidr", sel("pod", "b"), in(peers(ipPeer("10.244.0.0/16", "10.244.1.0/24"))))),
			conns: []semConn{
				allowed("x/a", "y/a", tcp, 80),
				denied("x/a", "y/b", tcp, 80),
				denied("x/a", "z/a", tcp, 80),
				allowed("x/a", "x/c", tcp, 80),
				denied("x/a", "192.0.2.1", tcp, 80),
				allowed("y/a", "x/b", tcp, 80),
				allowed("10.244.200.1", "x/b", tcp, 80),
				denied("x/c", "x/b", tcp, 80),
				denied("x/a", "x/b", tcp, 80), // excluded on both sides
			},
		},

		// A policy allowing only UDP or only SCTP isolates the pod for TCP.
		{
			name: "protocol isolation",
			pods: gridPods("x/a", "x/b", "x/c", "y/a"),
			policies: policies(
				netpol("x", "a-udp-only", sel("pod", "a"), in(peers().on(port(80, "UDP")))),
				netpol("x", "b-sctp-only", sel("pod", "b"), in(peers().on(port(80, "SCTP")))),
				netpol("x", "c-egress-udp-only", sel("pod", "c"), types(pEg), eg(peers().on(port(53, "UDP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", udp, 80),
				denied("y/a", "x/a", tcp, 80).why("x/a-udp-only isolates x/a for ingress"),
				denied("y/a", "x/a", sctp, 80),
				allowed("y/a", "x/b", sctp, 80),
				denied("y/a", "x/b", tcp, 80),
				denied("y/a", "x/b", udp, 80),
				allowed("x/c", "192.0.2.53", udp, 53),
				denied("x/c", "192.0.2.53", tcp, 53),
				denied("x/c", "y/a", sctp, 53),
			},
		},

		// A port entry with a protocol and no port allows every port of it.
		{
			name: "ports with a protocol and no port",
			pods: gridPods("x/a", "x/b", "y/a"),
			policies: policies(
				netpol("x", "a-any-udp", sel("pod", "a"), in(peers().on(protoOnly("UDP")))),
				netpol("x", "b-any-sctp", sel("pod", "b"), in(peers().on(protoOnly("SCTP"))))),
			conns: []semConn{
				allowed("y/a", "x/a", udp, 1),
				allowed("y/a", "x/a", udp, 80),
				allowed("y/a", "x/a", udp, 65535),
				denied("y/a", "x/a", tcp, 80),
				allowed("y/a", "x/b", sctp, 9),
				denied("y/a", "x/b", udp, 9),
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
			policies: policies(
				netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg()),
				netpol("x", "a-from-h", sel("pod", "a"), in(peers(podPeer(sel("pod", "h")), nsPeer(sel())))),
				netpol("x", "b-from-node-range", sel("pod", "b"), in(peers(ipPeer("172.18.0.0/24"))))),
			conns: []semConn{
				denied("x/h", "x/a", tcp, 80),
				allowed("x/h", "x/b", tcp, 80).why("allowed by x/b-from-node-range ingress[0]"),
				allowed("192.0.2.1", "x/h", tcp, 80).why(queue.ReasonIngressNotIsolated),
				allowed("x/h", "192.0.2.1", tcp, 80).why(queue.ReasonEgressNotIsolated),
				denied("x/a", "x/h", tcp, 80).why("x/deny-all isolates x/a for egress"),
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
			policies: policies(
				netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg())),
			conns: []semConn{
				allowed("172.18.0.1", "x/a", tcp, 10250).why(queue.ReasonNodeTraffic),
				allowed("x/a", "172.18.0.1", udp, 53).why(queue.ReasonNodeTraffic),
				denied("172.18.0.2", "x/a", tcp, 10250).why("x/deny-all isolates x/a for ingress"),
				denied("x/a", "172.18.0.2", tcp, 80).why("x/deny-all isolates x/a for egress"),
				denied("x/a", "x/b", tcp, 80), // x/a's egress is enforced here
				allowed("172.18.0.1", "x/b", tcp, 80).why(queue.ReasonNotEnforcedHere),
			},
		},

		// A node enforces only its own pods; peers on other nodes still match.
		{
			name: "per-node locality",
			node: "n1",
			pods: []*corev1.Pod{gridPod("x/a"), gridPod("x/b"), gridPod("x/c", onNode("n2")), gridPod("y/b", onNode("n2"))},
			policies: policies(
				netpol("y", "deny-all", sel(), types(pIn, pEg), in(), eg()),
				netpol("x", "a-from-c", sel("pod", "a"), in(peers(podPeer(sel("pod", "c")))))),
			conns: []semConn{
				allowed("y/b", "x/b", tcp, 80).why(queue.ReasonNotEnforcedHere),
				allowed("x/b", "y/b", tcp, 80).why(queue.ReasonNotEnforcedHere),
				allowed("x/c", "x/a", tcp, 80).why("allowed by x/a-from-c ingress[0]"),
				denied("x/b", "x/a", tcp, 80),
				denied("y/b", "x/a", tcp, 80).why("x/a-from-c isolates x/a for ingress"),
			},
			check: func(t *testing.T, prog *compile.Program) {
				v := queue.Evaluate(prog, gridIP("y/b"), gridIP("x/b"), tcp, 80)
				if v.EgressReason != queue.ReasonNotEnforcedHere {
					t.Errorf("egress reason of a pod on n2: got %q, want %q", v.EgressReason, queue.ReasonNotEnforcedHere)
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
			policies: policies(
				netpol("x", "a-from-b", sel("pod", "a"), in(peers(podPeer(sel("pod", "b"))))),
				netpol("x", "c-no-egress", sel("pod", "c"), types(pEg), eg())),
			conns: []semConn{
				denied("10.244.1.50", "x/a", tcp, 80),
				denied("10.244.1.50", "y/a", tcp, 80).why("x/c-no-egress isolates x/new for egress"),
				denied("10.244.1.51", "x/a", tcp, 80),
				denied("10.244.1.60", "x/a", tcp, 80),
				allowed("x/a", "10.244.1.51", tcp, 80).why(queue.ReasonIngressNotIsolated),
			},
			check: func(t *testing.T, prog *compile.Program) {
				// x/new's labels (pod=c), not x/old's (pod=b), decide.
				v := queue.Evaluate(prog, netip.MustParseAddr("10.244.1.50"), gridIP("x/a"), tcp, 80)
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
			policies: policies(
				netpol("x", "a-absent", sel("pod", "a"), in(peers())),
				netpol("x", "b-empty", sel("pod", "b"), in(rule{peers: []networkingv1.NetworkPolicyPeer{}, ports: []networkingv1.NetworkPolicyPort{}})),
				netpol("x", "c-pods-of-x", sel("pod", "c"), in(peers(podPeer(sel())))),
				netpol("y", "a-all-pods", sel("pod", "a"), in(peers(nsPeer(sel())))),
				netpol("y", "b-no-rules", sel("pod", "b"), types(pIn), in()),
				netpol("y", "c-empty-port", sel("pod", "c"), in(peers().on(networkingv1.NetworkPolicyPort{})))),
			conns: []semConn{
				allowed("192.0.2.1", "x/a", udp, 9),
				allowed("192.0.2.1", "x/b", sctp, 9),
				allowed("y/a", "x/b", tcp, 80),
				allowed("x/a", "x/c", tcp, 80),
				denied("y/a", "x/c", tcp, 80),
				denied("192.0.2.1", "x/c", tcp, 80),
				allowed("x/a", "y/a", tcp, 80),
				allowed("z/a", "y/a", tcp, 80),
				denied("192.0.2.1", "y/a", tcp, 80),
				denied("y/a", "y/b", tcp, 80),
				denied("192.0.2.1", "y/b", udp, 80),
				allowed("x/a", "y/c", tcp, 1),
				allowed("x/a", "y/c", tcp, 65535),
				denied("x/a", "y/c", udp, 80),
			},
		},

		// policyTypes: absent means Ingress, plus Egress when there are
		// egress rules; given, it is taken as written.
		{
			name: "policyTypes defaulting",
			pods: gridPods("x/a", "x/b", "x/c", "y/a"),
			policies: policies(
				netpol("x", "a-egress-rules", sel("pod", "a"), eg(peers(ipPeer("192.0.2.0/24")))),
				netpol("x", "b-ingress-rules", sel("pod", "b"), in(peers(podPeer(sel("pod", "c"))))),
				netpol("x", "c-ingress-type", sel("pod", "c"), types(pIn), in(peers()), eg(peers(ipPeer("192.0.2.0/24"))))),
			conns: []semConn{
				denied("y/a", "x/a", tcp, 80).why("x/a-egress-rules isolates x/a for ingress"),
				allowed("x/a", "192.0.2.1", tcp, 80),
				denied("x/a", "y/a", tcp, 80).why("x/a-egress-rules isolates x/a for egress"),
				allowed("x/b", "y/a", tcp, 80).why(queue.ReasonEgressNotIsolated),
				allowed("x/c", "x/b", tcp, 80),
				allowed("x/c", "y/a", tcp, 80).why(queue.ReasonEgressNotIsolated),
			},
		},
		{
			name:     "an egress-only policy does not isolate ingress",
			pods:     gridPods("x/a", "y/a"),
			policies: policies(netpol("x", "a-no-egress", sel("pod", "a"), types(pEg), eg())),
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 80).why(queue.ReasonIngressNotIsolated),
				denied("x/a", "y/a", tcp, 80).why("x/a-no-egress isolates x/a for egress"),
			},
		},

		// Policies add up: a connection is allowed when any rule of any
		// isolating policy allows it; a deny-all policy takes nothing away.
		{
			name: "additive union of policies",
			pods: gridPods("x/a", "x/b", "y/a", "z/a"),
			policies: policies(
				netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg()),
				netpol("x", "a-from-y-80", sel("pod", "a"), in(peers(nsPeer(sel(nsName, "y"))).on(port(80, "")))),
				netpol("x", "a-from-b-81", sel("pod", "a"), in(peers(podPeer(sel("pod", "b"))).on(port(81, "")))),
				netpol("x", "b-to-a", sel("pod", "b"), types(pEg), eg(peers(podPeer(sel("pod", "a"))))),
				netpol("x", "b-to-z", sel("pod", "b"), types(pEg), eg(peers(nsPeer(sel(nsName, "z")))))),
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 80).why("allowed by x/a-from-y-80 ingress[0]"),
				denied("y/a", "x/a", tcp, 81).why("x/a-from-b-81, x/a-from-y-80, x/deny-all isolate x/a for ingress"),
				allowed("x/b", "x/a", tcp, 81).why("allowed by x/b-to-a egress[0]; allowed by x/a-from-b-81 ingress[0]"),
				denied("x/b", "x/a", tcp, 80),
				denied("z/a", "x/a", tcp, 80),
				allowed("x/b", "z/a", tcp, 80),
				denied("x/b", "y/a", tcp, 80),
			},
		},

		// One peer with both selectors is an AND; two peers are an OR, and a
		// podSelector alone means the policy's namespace.
		{
			name: "namespaceSelector and podSelector: one peer vs two peers",
			pods: gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/b"),
			policies: policies(
				netpol("x", "a-one-peer", sel("pod", "a"), in(peers(podNsPeer(sel("pod", "b"), sel(nsName, "y"))))),
				netpol("x", "c-two-peers", sel("pod", "c"), in(peers(nsPeer(sel(nsName, "y")), podPeer(sel("pod", "b")))))),
			conns: []semConn{
				allowed("y/b", "x/a", tcp, 80),
				denied("y/a", "x/a", tcp, 80),
				denied("x/b", "x/a", tcp, 80),
				denied("z/b", "x/a", tcp, 80),
				allowed("y/a", "x/c", tcp, 80),
				allowed("y/b", "x/c", tcp, 80),
				allowed("x/b", "x/c", tcp, 80),
				denied("z/b", "x/c", tcp, 80),
				denied("x/a", "x/c", tcp, 80),
			},
		},
	})
}

// TestInvalidPolicies builds programs from objects the API server would
// reject (the scenario loader refuses them). The invalid part must be
// reported with its field path and allow nothing; the valid parts still work.
func TestInvalidPolicies(t *testing.T) {
	pods := gridPods("x/a", "x/b", "x/c", "y/a", "y/b", "z/a")
	badSel := expr("pod", metav1.LabelSelectorOperator("Equals"), "b")
	runSemCases(t, []semCase{
		{
			name: "bad podSelector operator isolates the whole namespace",
			pods: pods,
			policies: policies(
				netpol("x", "bad-target", badSel, types(pIn), in(peers())),
				netpol("x", "a-from-y", sel("pod", "a"), in(peers(nsPeer(sel(nsName, "y")))))),
			problems: []semProblem{{"x/bad-target", "spec.podSelector.matchExpressions[0].operator", "Equals"}},
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 80).why("allowed by x/a-from-y ingress[0]"),
				denied("z/a", "x/a", tcp, 80),
				denied("y/a", "x/b", tcp, 80).why("x/bad-target isolates x/b for ingress"),
				denied("x/a", "x/c", tcp, 80),
				denied("192.0.2.1", "x/c", udp, 53),
				allowed("x/b", "y/a", tcp, 80), // ingress only
			},
		},
		{
			name: "bad selector in a peer: that peer matches nothing",
			pods: pods,
			policies: policies(
				netpol("x", "bad-peer", sel("pod", "a"), in(peers(podPeer(badSel), nsPeer(sel(nsName, "y"))))),
				netpol("x", "bad-ns-part", sel("pod", "c"), in(peers(podNsPeer(sel("pod", "b"), badSel))))),
			problems: []semProblem{
				{"x/bad-peer", "spec.ingress[0].from[0].podSelector.matchExpressions[0].operator", "Equals"},
				{"x/bad-ns-part", "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].operator", "Equals"},
			},
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 80),
				allowed("y/b", "x/a", tcp, 80),
				denied("x/b", "x/a", tcp, 80),
				denied("x/b", "x/c", tcp, 80), // the pod part alone would match
				denied("y/b", "x/c", tcp, 80),
			},
		},
		{
			name: "bad CIDR",
			pods: pods,
			policies: policies(
				netpol("x", "bad-cidr", sel("pod", "a"), in(peers(ipPeer("10.244.0.0/33"), podPeer(sel("pod", "b"))))),
				netpol("x", "mapped-cidr", sel("pod", "c"), in(peers(ipPeer("::ffff:10.244.0.0/112"))))),
			problems: []semProblem{
				{"x/bad-cidr", "spec.ingress[0].from[0].ipBlock.cidr", "10.244.0.0/33"},
				{"x/mapped-cidr", "spec.ingress[0].from[0].ipBlock.cidr", "IPv4-mapped"},
			},
			conns: []semConn{
				allowed("x/b", "x/a", tcp, 80),
				denied("y/a", "x/a", tcp, 80),
				denied("10.244.2.1", "x/a", tcp, 80),
				denied("y/a", "x/c", tcp, 80),
				denied("::ffff:10.244.2.1", "x/c", tcp, 80),
			},
		},
		{
			name: "except outside cidr",
			pods: pods,
			policies: policies(
				netpol("x", "bad-except", sel("pod", "a"), types(pEg), eg(peers(ipPeer("10.244.2.0/24", "10.244.3.0/24"), ipPeer("192.0.2.0/24")))),
				netpol("x", "except-is-cidr", sel("pod", "b"), types(pEg), eg(peers(ipPeer("10.244.2.0/24", "10.244.2.0/24")))),
				netpol("x", "except-other-family", sel("pod", "c"), types(pEg), eg(peers(ipPeer("10.244.2.0/24", "fd00::/64"))))),
			problems: []semProblem{
				{"x/bad-except", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
				{"x/except-is-cidr", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
				{"x/except-other-family", "spec.egress[0].to[0].ipBlock.except[0]", "strict subset"},
			},
			conns: []semConn{
				denied("x/a", "y/a", tcp, 80), // inside cidr: the whole peer is void
				denied("x/a", "z/a", tcp, 80),
				allowed("x/a", "192.0.2.1", tcp, 80),
				denied("x/b", "y/a", tcp, 80),
				denied("x/c", "y/b", tcp, 80),
			},
		},
		{
			name: "invalid port entries allow nothing, valid ones still do",
			pods: []*corev1.Pod{gridPod("x/a", containerPorts(cport("http", 8080, corev1.ProtocolTCP))), gridPod("x/b"), gridPod("x/c"), gridPod("y/a")},
			policies: policies(
				netpol("x", "named-with-endport", sel("pod", "a"), in(peers().on(func() networkingv1.NetworkPolicyPort {
					p := namedPort("http", "TCP")
					end := int32(9000)
					p.EndPort = &end
					return p
				}(), port(81, "")))),
				netpol("x", "endport-below-port", sel("pod", "b"), in(peers().on(portRange(90, 80, "TCP")))),
				netpol("x", "unknown-protocol", sel("pod", "c"), in(peers().on(port(80, "ICMP"))))),
			problems: []semProblem{
				{"x/named-with-endport", "spec.ingress[0].ports[0].endPort", "named port"},
				{"x/endport-below-port", "spec.ingress[0].ports[0].endPort", "80"},
				{"x/unknown-protocol", "spec.ingress[0].ports[0].protocol", "ICMP"},
			},
			conns: []semConn{
				allowed("y/a", "x/a", tcp, 81),
				denied("y/a", "x/a", tcp, 8080),
				denied("y/a", "x/a", tcp, 8500),
				denied("y/a", "x/b", tcp, 80),
				denied("y/a", "x/b", tcp, 85),
				denied("y/a", "x/b", tcp, 90),
				denied("y/a", "x/c", tcp, 80).why("x/unknown-protocol isolates x/c for ingress"),
				denied("y/a", "x/c", udp, 80),
				denied("y/a", "x/c", sctp, 80),
			},
		},
		{
			name: "endPort without port, port out of range, bad port name",
			pods: pods,
			policies: policies(
				netpol("x", "endport-alone", sel("pod", "a"), in(peers().on(func() networkingv1.NetworkPolicyPort {
					p := protoOnly("TCP")
					end := int32(90)
					p.EndPort = &end
					return p
				}()))),
				netpol("x", "port-zero", sel("pod", "b"), in(peers().on(port(0, "TCP"), port(70000, "UDP")))),
				netpol("x", "bad-name", sel("pod", "c"), in(peers().on(namedPort("Serve_80", ""))))),
			problems: []semProblem{
				{"x/endport-alone", "spec.ingress[0].ports[0].endPort", "without port"},
				{"x/port-zero", "spec.ingress[0].ports[0].port", "out of range"},
				{"x/port-zero", "spec.ingress[0].ports[1].port", "out of range"},
				{"x/bad-name", "spec.ingress[0].ports[0].port", "Serve_80"},
			},
			conns: []semConn{
				denied("y/a", "x/a", tcp, 80), // not "every TCP port"
				denied("y/a", "x/a", tcp, 90),
				denied("y/a", "x/b", tcp, 80),
				denied("y/a", "x/b", udp, 4464), // 70000 mod 65536
				denied("y/a", "x/c", tcp, 80),
			},
		},
		{
			name: "unknown policyType isolates both directions",
			pods: pods,
			policies: policies(
				netpol("x", "bad-type", sel("pod", "a"), types("Both"), in(peers(podPeer(sel("pod", "b")))))),
			problems: []semProblem{{"x/bad-type", "spec.policyTypes[0]", "Both"}},
			conns: []semConn{
				allowed("x/b", "x/a", tcp, 80),
				denied("y/a", "x/a", tcp, 80),
				denied("x/a", "y/a", tcp, 80).why("x/bad-type isolates x/a for egress"),
				denied("x/a", "x/b", tcp, 80),
			},
		},
		{
			name: "peer with nothing or with both ipBlock and a selector",
			pods: pods,
			policies: policies(
				netpol("x", "empty-peer", sel("pod", "a"), in(peers(networkingv1.NetworkPolicyPeer{}, podPeer(sel("pod", "b"))))),
				netpol("x", "ipblock-and-selector", sel("pod", "c"), in(peers(networkingv1.NetworkPolicyPeer{
					IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}, PodSelector: &metav1.LabelSelector{}})))),
			problems: []semProblem{
				{"x/empty-peer", "spec.ingress[0].from[0]", "must specify a peer"},
				{"x/ipblock-and-selector", "spec.ingress[0].from[0]", "ipBlock"},
			},
			conns: []semConn{
				allowed("x/b", "x/a", tcp, 80),
				denied("y/a", "x/a", tcp, 80),
				denied("x/b", "x/c", tcp, 80),
				denied("192.0.2.1", "x/c", tcp, 80),
			},
		},
	})
}
