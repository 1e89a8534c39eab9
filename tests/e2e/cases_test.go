package e2e_test

// The 48 upstream e2e NetworkPolicy cases (kubernetes/kubernetes
// test/e2e/network/netpol/network_policy.go, summarized in netpol-cases.md)
// as truth tables. The data is a copy of pkg/queue/netpol_cases_test.go,
// which checks it against the evaluator; it cannot be shared through a
// package under tests/internal, which Go's internal rule hides from pkg/.
// TestCasesAgreeWithEvaluator keeps the two honest.
//
// Conventions:
//   - Namespaces x, y, z are numbered 1, 2, 3 and pods a, b, c are numbered
//     1, 2, 3; pod ns/p has the IP 10.244.<ns>.<p> (y/b is 10.244.2.2) and the
//     label pod=<p>. Namespaces carry only kubernetes.io/metadata.name unless
//     a step adds labels.
//   - Every pod serves serve-{80,81}-{tcp,udp,sctp}.
//   - All nine pods of the grid exist in every case (older upstream
//     versions always created them); two cases need one more delta there
//     (fullGridExtra).
//   - Expectations start all-allowed; deltas apply in order, later ones win;
//     "*" is any pod, "x/*" any pod in x. Loopback is not probed.
//   - Cases with updates (15, 20, 21, 22, 24, 31, 32, 33, 36, 37) have one
//     step per state.

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

const (
	tcp  = compile.ProtoTCP
	udp  = compile.ProtoUDP
	sctp = compile.ProtoSCTP
)

// --- selectors, peers, ports, rules, policies -------------------------------

// sel is a matchLabels selector from key, value pairs; sel() selects everything.
func sel(kv ...string) metav1.LabelSelector {
	s := metav1.LabelSelector{}
	if len(kv) > 0 {
		s.MatchLabels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.MatchLabels[kv[i]] = kv[i+1]
		}
	}
	return s
}

// expr is a selector with one match expression.
func expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func podPeer(pod metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &pod}
}

func nsPeer(ns metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &ns}
}

// podNsPeer is one peer with both selectors (ANDed).
func podNsPeer(pod, ns metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &pod, NamespaceSelector: &ns}
}

func ipPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func protoPtr(p string) *corev1.Protocol {
	if p == "" {
		return nil
	}
	cp := corev1.Protocol(p)
	return &cp
}

// port is a numbered port; proto "" leaves the protocol to defaulting (TCP).
func port(n int32, proto string) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// namedPort is a port by name; proto "" leaves the protocol to defaulting.
func namedPort(name, proto string) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &v, Protocol: protoPtr(proto)}
}

// protoOnly is a port entry with a protocol and no port: every port.
func protoOnly(proto string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: protoPtr(proto)}
}

// rule is an ingress or egress rule before it is given a direction. A nil
// peers or ports slice is absent (all).
type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// peers makes a rule with the given peers; peers() has from/to absent.
func peers(p ...networkingv1.NetworkPolicyPeer) rule { return rule{peers: p} }

// on restricts the rule to ports.
func (r rule) on(p ...networkingv1.NetworkPolicyPort) rule { r.ports = p; return r }

type policyOpt func(*networkingv1.NetworkPolicySpec)

// types sets spec.policyTypes; without it the API's defaulting applies.
func types(ts ...networkingv1.PolicyType) policyOpt {
	return func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = append([]networkingv1.PolicyType{}, ts...) }
}

const (
	pIn = networkingv1.PolicyTypeIngress
	pEg = networkingv1.PolicyTypeEgress
)

// in appends ingress rules; in() with no rules leaves spec.ingress empty.
func in(rules ...rule) policyOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		for _, r := range rules {
			s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{From: r.peers, Ports: r.ports})
		}
	}
}

// eg appends egress rules.
func eg(rules ...rule) policyOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		for _, r := range rules {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{To: r.peers, Ports: r.ports})
		}
	}
}

func netpol(ns, name string, podSelector metav1.LabelSelector, opts ...policyOpt) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: podSelector},
	}
	for _, o := range opts {
		o(&np.Spec)
	}
	return np
}

func policies(nps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return nps }

// --- the x, y, z grid --------------------------------------------------------

var (
	gridNamespaces = []string{"x", "y", "z"}
	gridPodNames   = []string{"a", "b", "c"}
)

// gridPods lists the nine pod keys, sorted.
func gridPods() []string {
	var out []string
	for _, ns := range gridNamespaces {
		for _, p := range gridPodNames {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

func gridIndex(s string, names string) int { return strings.Index(names, s) + 1 }

// gridIP is the address of grid pod "ns/p": 10.244.<ns>.<p>.
func gridIP(key string) netip.Addr {
	ns, p, _ := strings.Cut(key, "/")
	return netip.AddrFrom4([4]byte{10, 244, byte(gridIndex(ns, "xyz")), byte(gridIndex(p, "abc"))})
}

// gridNode spreads the grid over two nodes, alternating in key order, so
// that every namespace has pods on both and every case has same-node and
// cross-node pairs: x/a, x/c, y/b, z/a, z/c on node-1, the others on node-2.
func gridNode(key string, nodes []string) string {
	i := 0
	for j, k := range gridPods() {
		if k == key {
			i = j
		}
	}
	return nodes[i%len(nodes)]
}

func gridPorts() []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, n := range []int32{80, 81} {
		for _, p := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
			out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", n, strings.ToLower(string(p))), ContainerPort: n, Protocol: p})
		}
	}
	return out
}

// --- truth tables ------------------------------------------------------------

// delta changes the expectation for the pairs matching from -> to.
type delta struct {
	from, to string
	allowed  bool
}

func allow(from, to string) delta { return delta{from, to, true} }
func deny(from, to string) delta  { return delta{from, to, false} }

func patternMatches(pattern, key string) bool {
	if pattern == "*" {
		return true
	}
	if ns, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(key, ns+"/")
	}
	return pattern == key
}

// expectation is the truth table for one port and protocol.
type expectation struct {
	port   uint16
	proto  compile.Protocol
	deltas []delta
}

func on(port uint16, proto compile.Protocol, deltas ...delta) expectation {
	return expectation{port, proto, deltas}
}

// truthTable holds a verdict for each ordered pair of distinct pods.
type truthTable struct {
	pods []string
	v    map[[2]string]bool
}

func newTruthTable(pods []string, deltas []delta) truthTable {
	t := truthTable{pods: pods, v: map[[2]string]bool{}}
	for _, f := range pods {
		for _, to := range pods {
			if f == to {
				continue
			}
			ok := true
			for _, d := range deltas {
				if patternMatches(d.from, f) && patternMatches(d.to, to) {
					ok = d.allowed
				}
			}
			t.v[[2]string{f, to}] = ok
		}
	}
	return t
}

// render prints the table upstream's way: rows are sources, columns
// destinations, '.' allowed, 'X' denied, '-' loopback; cells that differ from
// other (when given) are followed by '*'.
func (t truthTable) render(other *truthTable) string {
	var sb strings.Builder
	sb.WriteString("      ")
	for _, to := range t.pods {
		fmt.Fprintf(&sb, "%-5s", to)
	}
	sb.WriteString("\n")
	for _, f := range t.pods {
		fmt.Fprintf(&sb, "%-6s", f)
		for _, to := range t.pods {
			cell := "-"
			if f != to {
				ok := t.v[[2]string{f, to}]
				cell = "X"
				if ok {
					cell = "."
				}
				if other != nil && other.v[[2]string{f, to}] != ok {
					cell += "*"
				}
			}
			fmt.Fprintf(&sb, "%-5s", cell)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

func verdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}

// --- the cases ---------------------------------------------------------------

// netpolStep is one state of a case: the policies in force, label changes,
// and the expectations per port and protocol.
type netpolStep struct {
	note      string
	policies  []*networkingv1.NetworkPolicy
	nsLabels  map[string]map[string]string
	podLabels map[string]map[string]string
	expect    []expectation
}

type netpolCase struct {
	num   int
	name  string
	pods  string // space-separated pod keys
	steps []netpolStep
}

// only is a case with a single step.
func only(nps []*networkingv1.NetworkPolicy, expect ...expectation) []netpolStep {
	return []netpolStep{{policies: nps, expect: expect}}
}

// Policies shared by several cases. Case 35's cidr is x/b's /4 written
// canonically (0.0.0.0/4), as upstream's makeLargeCIDRForIP does: the API
// server rejects "10.244.1.2/4" ("must not have bits set beyond the prefix
// length"); pkg/queue's copy keeps the sloppy form, which the compiler
// masks the same way.
var (
	case14Policy = netpol("x", "allow-client-a-via-ns-selector", sel("pod", "a"),
		in(peers(nsPeer(sel("kubernetes.io/metadata.name", "y"))).on(port(81, "TCP"))))
	case35Policy = netpol("x", "allow-client-a-via-cidr-egress-rule", sel("pod", "a"), types(pEg),
		eg(peers(ipPeer(netip.PrefixFrom(gridIP("x/b"), 4).Masked().String(), gridIP("x/b").String()+"/32"))))
)

func udpCase43(proto compile.Protocol) []netpolStep {
	return only(policies(netpol("x", "deny-all", sel(), types(pIn), in())),
		on(80, proto, deny("*", "x/*")))
}

func udpCase44(proto compile.Protocol) []netpolStep {
	return only(policies(netpol("x", "allow-ingress-on-port-81-ns-x", sel("pod", "a"),
		in(peers(nsPeer(sel("kubernetes.io/metadata.name", "y"))).on(port(81, proto.String()))))),
		on(81, proto, deny("x/*", "x/a"), deny("z/*", "x/a")))
}

func udpCase45(proto compile.Protocol) []netpolStep {
	return only(policies(netpol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", sel("pod", "a"),
		in(peers(podNsPeer(sel("pod", "a"), sel("kubernetes.io/metadata.name", "y")))))),
		on(80, proto, deny("*", "x/a"), allow("y/a", "x/a")))
}

const nsName = "kubernetes.io/metadata.name"

var netpolCases = []netpolCase{
	{1, "default-deny-ingress", "x/a x/b y/a y/b", only(
		policies(netpol("x", "deny-ingress", sel(), types(pIn), in())),
		on(80, tcp, deny("*", "x/*")))},
	{2, "default-deny-all", "x/a x/b y/a", only(
		policies(netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg())),
		on(80, tcp, deny("*", "x/*"), deny("x/*", "*")))},
	{3, "allow from pods within server namespace by podSelector", "x/a x/b x/c y/a", only(
		policies(netpol("x", "x-a-allows-x-b", sel("pod", "a"), in(peers(podPeer(sel("pod", "b")))))),
		on(80, tcp, deny("*", "x/a"), allow("x/b", "x/a")))},
	{4, "allow ingress traffic for a target", "x/a x/b y/a", only(
		policies(
			netpol("x", "deny-all", sel(), types(pIn), in()),
			netpol("x", "allow-all-to-a", sel("pod", "a"), in(peers(podNsPeer(sel(), sel()))))),
		on(80, tcp, allow("*", "x/a"), deny("*", "x/b")))},
	{5, "allow ingress from pods in all namespaces", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-from-another-ns", sel("pod", "a"), in(peers(nsPeer(sel()))))),
		on(80, tcp))},
	{6, "allow only from a different namespace by namespaceSelector", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-client-a-via-ns-selector", sel("pod", "a"), in(peers(nsPeer(sel(nsName, "y")))))),
		on(80, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")))},
	{7, "podSelector with matchExpressions", "x/a x/b y/a", only(
		policies(netpol("x", "x-a-allows-x-b", sel("pod", "a"), in(peers(podPeer(expr("pod", metav1.LabelSelectorOpIn, "b")))))),
		on(80, tcp, deny("*", "x/a"), allow("x/b", "x/a")))},
	{8, "namespaceSelector with matchExpressions", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-ns-y-match-selector", sel("pod", "a"), in(peers(nsPeer(expr(nsName, metav1.LabelSelectorOpIn, "y")))))),
		on(80, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")))},
	{9, "podSelector or namespaceSelector", "x/a x/b x/c y/a", only(
		policies(netpol("x", "allow-ns-y-match-selector", sel("pod", "a"),
			in(peers(nsPeer(expr(nsName, metav1.LabelSelectorOpNotIn, "x")), podPeer(sel("pod", "b")))))),
		on(80, tcp, deny("x/c", "x/a")))},
	{10, "podSelector and namespaceSelector", "x/a x/b y/a y/b z/b", only(
		policies(netpol("x", "allow-ns-y-podselector-and-nsselector", sel("pod", "a"),
			in(peers(podNsPeer(sel("pod", "b"), expr(nsName, metav1.LabelSelectorOpNotIn, "x")))))),
		on(80, tcp, deny("*", "x/a"), allow("y/b", "x/a"), allow("z/b", "x/a")))},
	{11, "multiple podSelectors and namespaceSelectors", "x/a x/b y/a y/b y/c", only(
		policies(netpol("x", "allow-ns-y-z-pod-b-c", sel("pod", "a"),
			in(peers(podNsPeer(expr("pod", metav1.LabelSelectorOpIn, "b", "c"), expr(nsName, metav1.LabelSelectorOpNotIn, "x")))))),
		on(80, tcp, deny("x/*", "x/a"), deny("y/a", "x/a")))},
	{12, "any podSelectors", "x/a x/b x/c", only(
		policies(netpol("x", "allow-ns-x-pod-b-c", sel("pod", "a"), in(peers(podPeer(sel("pod", "b")), podPeer(sel("pod", "c")))))),
		on(80, tcp, deny("*", "x/a"), allow("x/b", "x/a"), allow("x/c", "x/a")))},
	{13, "only from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a y/b z/a", only(
		policies(netpol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", sel("pod", "a"),
			in(peers(podNsPeer(sel("pod", "a"), sel(nsName, "y")))))),
		on(80, tcp, deny("*", "x/a"), allow("y/a", "x/a")))},
	{14, "ports", "x/a x/b y/a y/b z/a", only(
		policies(case14Policy),
		on(81, tcp, deny("x/*", "x/a"), deny("z/*", "x/a"), allow("y/*", "x/a")))},
	{15, "stacked policies with overlapping podSelectors", "x/a x/b y/a y/b z/a", []netpolStep{
		{note: "81 only", policies: policies(case14Policy), expect: []expectation{
			on(81, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")),
			on(80, tcp, deny("*", "x/a")),
		}},
		{note: "80 added", policies: policies(case14Policy,
			netpol("x", "allow-client-a-via-ns-selector-80", sel("pod", "a"), in(peers(nsPeer(sel(nsName, "y"))).on(port(80, "TCP"))))),
			expect: []expectation{
				on(81, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")),
				on(80, tcp, deny("x/*", "x/a"), deny("z/*", "x/a"), allow("y/*", "x/a")),
			}},
	}},
	{16, "allow-all", "x/a x/b y/a", only(
		policies(netpol("x", "allow-all", sel(), in(peers()))),
		on(80, tcp), on(81, tcp))},
	{17, "ingress on one named port", "x/a x/b y/a", only(
		policies(netpol("x", "allow-all", sel(), in(peers().on(namedPort("serve-81-tcp", ""))))),
		on(81, tcp), on(80, tcp, deny("*", "x/*")))},
	{18, "ingress from namespace on one named port", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-client-a-via-ns-selector-80", sel("pod", "a"),
			in(peers(nsPeer(sel(nsName, "y"))).on(namedPort("serve-80-tcp", "TCP"))))),
		on(80, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")), on(81, tcp, deny("*", "x/a")))},
	{19, "egress on one named port", "x/a y/a", only(
		policies(netpol("x", "allow-egress", sel(), types(pEg), eg(peers().on(namedPort("serve-80-tcp", ""))))),
		on(80, tcp), on(81, tcp, deny("x/*", "*")))},
	{20, "updated policy", "x/a y/a", []netpolStep{
		{note: "allow all", policies: policies(netpol("x", "allow-all-mutate-to-deny-all", sel(), in(peers()))),
			expect: []expectation{on(81, tcp)}},
		{note: "updated to deny all", policies: policies(netpol("x", "allow-all-mutate-to-deny-all", sel(), in())),
			expect: []expectation{on(81, tcp, deny("*", "x/*"))}},
	}},
	{21, "ingress from updated namespace", "x/a y/a", func() []netpolStep {
		np := netpol("x", "allow-client-a-via-ns-selector", sel("pod", "a"), in(peers(nsPeer(sel("ns2", "updated")))))
		return []netpolStep{
			{note: "before", policies: policies(np), expect: []expectation{on(80, tcp, deny("*", "x/a"))}},
			{note: "y labelled ns2=updated", policies: policies(np), nsLabels: map[string]map[string]string{"y": {"ns2": "updated"}},
				expect: []expectation{on(80, tcp, deny("*", "x/a"), allow("y/*", "x/a"))}},
		}
	}()},
	{22, "ingress from updated pod", "x/a x/b", func() []netpolStep {
		np := netpol("x", "allow-client-a-via-pod-selector", sel("pod", "a"), in(peers(podPeer(sel("pod", "b", "pod2", "updated")))))
		return []netpolStep{
			{note: "before", policies: policies(np), expect: []expectation{on(80, tcp, deny("*", "x/a"))}},
			{note: "x/b labelled pod2=updated", policies: policies(np), podLabels: map[string]map[string]string{"x/b": {"pod": "b", "pod2": "updated"}},
				expect: []expectation{on(80, tcp, deny("*", "x/a"), allow("x/b", "x/a"))}},
		}
	}()},
	{23, "deny ingress from pods in other namespaces", "x/a x/b y/a z/a", only(
		policies(netpol("x", "deny-empty-policy", sel(), in(peers(podPeer(sel()))))),
		on(80, tcp, deny("y/*", "x/*"), deny("z/*", "x/*")))},
	{24, "deny ingress to updated pod", "x/a y/a", func() []netpolStep {
		np := netpol("x", "deny-ingress-via-label-selector", sel("target", "isolated"), types(pIn), in())
		return []netpolStep{
			{note: "before", policies: policies(np), expect: []expectation{on(80, tcp)}},
			{note: "x/a labelled target=isolated", policies: policies(np), podLabels: map[string]map[string]string{"x/a": {"pod": "a", "target": "isolated"}},
				expect: []expectation{on(80, tcp, deny("*", "x/a"))}},
		}
	}()},
	{25, "deny egress by podSelector", "x/a x/b y/a", only(
		policies(netpol("x", "deny-egress-pod-a", sel("pod", "a"), types(pEg), eg())),
		on(80, tcp, deny("x/a", "*")))},
	{26, "deny egress from all pods in a namespace", "x/a x/b y/a", only(
		policies(netpol("x", "deny-egress-ns-x", sel(), types(pEg), eg())),
		on(80, tcp, deny("x/*", "*")))},
	{27, "ingress and egress together", "x/a x/b x/c y/a", only(
		policies(netpol("x", "allow-client-a-via-pod-selector", sel("pod", "a"), types(pEg, pIn),
			in(peers(podPeer(sel("pod", "b")))), eg(peers().on(port(80, ""))))),
		on(80, tcp, deny("*", "x/a"), allow("x/b", "x/a")),
		on(81, tcp, deny("*", "x/a"), deny("x/a", "*"), allow("x/b", "x/a")))},
	{28, "egress denied on the client even if the server allows it", "x/a y/a y/b", only(
		policies(
			netpol("x", "allow-to-ns-y-pod-a", sel("pod", "a"), types(pEg), eg(peers(podNsPeer(sel("pod", "a"), sel(nsName, "y"))))),
			netpol("y", "allow-from-xa-on-ya-match-selector", sel("pod", "a"), in(peers(podNsPeer(sel("pod", "a"), sel(nsName, "x"))))),
			netpol("y", "allow-from-xa-on-yb-match-selector", sel("pod", "b"), in(peers(podNsPeer(sel("pod", "a"), sel(nsName, "x")))))),
		on(80, tcp, deny("x/a", "*"), deny("*", "y/a"), allow("x/a", "y/a"), deny("*", "y/b")))},
	{29, "egress to a server in another namespace by podSelector and namespaceSelector", "x/a y/a y/b", only(
		policies(netpol("x", "allow-to-ns-y-pod-a", sel("pod", "a"), types(pEg), eg(peers(podNsPeer(sel("pod", "a"), sel(nsName, "y")))))),
		on(80, tcp, deny("x/a", "*"), allow("x/a", "y/a")))},
	{30, "ingress on any port of one protocol", "x/a y/a", only(
		policies(netpol("x", "allow-ingress-by-proto", sel("pod", "a"), in(peers().on(protoOnly("TCP"))))),
		on(80, tcp), on(80, udp, deny("*", "x/a")))},
	{31, "ingress allow-all takes precedence", "x/a y/a", []netpolStep{
		{note: "port 80 only", policies: policies(netpol("x", "allow-ingress-port-80", sel(), in(peers().on(port(80, ""))))),
			expect: []expectation{on(81, tcp, deny("*", "x/*"))}},
		{note: "allow-all added", policies: policies(
			netpol("x", "allow-ingress-port-80", sel(), in(peers().on(port(80, "")))),
			netpol("x", "allow-ingress", sel(), in(peers()))),
			expect: []expectation{on(81, tcp)}},
	}},
	{32, "egress allow-all takes precedence", "x/a y/a", []netpolStep{
		{note: "port 80 only", policies: policies(netpol("x", "allow-egress-port-80", sel(), types(pEg), eg(peers().on(port(80, ""))))),
			expect: []expectation{on(81, tcp, deny("x/*", "*"))}},
		{note: "allow-all added", policies: policies(
			netpol("x", "allow-egress-port-80", sel(), types(pEg), eg(peers().on(port(80, "")))),
			netpol("x", "allow-egress", sel(), types(pEg), eg(peers()))),
			expect: []expectation{on(81, tcp)}},
	}},
	{33, "policies stop being enforced once deleted", "x/a y/a", []netpolStep{
		{note: "deny-all", policies: policies(netpol("x", "deny-all", sel(), types(pIn, pEg), in(), eg())),
			expect: []expectation{on(80, tcp, deny("x/*", "*"), deny("*", "x/*"))}},
		{note: "deleted", policies: nil, expect: []expectation{on(80, tcp)}},
	}},
	{34, "egress to a server in a CIDR block", "x/a y/a y/b", only(
		policies(netpol("x", "allow-client-a-via-cidr-egress-rule", sel("pod", "a"), types(pEg), eg(peers(ipPeer(gridIP("y/b").String()+"/32"))))),
		on(80, tcp, deny("x/a", "*"), allow("x/a", "y/b")))},
	{35, "except clause of an egress CIDR block", "x/a x/b x/c", only(
		policies(case35Policy),
		on(80, tcp, deny("x/a", "x/b")))},
	{36, "an IP in both cidr and except, then the policy updated", "x/a x/b x/c", []netpolStep{
		{note: "cidr except x/b", policies: policies(case35Policy), expect: []expectation{on(80, tcp, deny("x/a", "x/b"))}},
		{note: "replaced by x/b/32", policies: policies(netpol("x", "allow-client-a-via-cidr-egress-rule", sel("pod", "a"), types(pEg),
			eg(peers(ipPeer(gridIP("x/b").String()+"/32"))))),
			expect: []expectation{on(80, tcp, deny("x/a", "*"), allow("x/a", "x/b"))}},
	}},
	{37, "ingress and egress controlled independently", "x/a x/b y/a", func() []netpolStep {
		egress := netpol("x", "allow-egress-for-target", sel("pod", "a"), types(pEg), eg(peers()))
		return []netpolStep{
			{note: "egress allow-all", policies: policies(egress), expect: []expectation{on(80, tcp)}},
			{note: "ingress deny added", policies: policies(egress, netpol("x", "deny-ingress-via-label-selector", sel("pod", "a"), types(pIn), in())),
				expect: []expectation{on(80, tcp, deny("*", "x/a"))}},
		}
	}()},
	{38, "SCTP is not TCP", "x/a y/a", only(
		policies(
			netpol("x", "deny-ingress", sel(), types(pIn), in()),
			netpol("x", "allow-only-sctp-ingress-on-port-81", sel("pod", "a"), in(peers().on(port(81, "SCTP"))))),
		on(81, tcp, deny("*", "x/*")))},
	{39, "a policy allowing only SCTP isolates", "x/a y/a", only(
		policies(netpol("x", "allow-only-sctp-ingress-on-port-80", sel("pod", "a"), in(peers().on(port(80, "SCTP"))))),
		on(81, tcp, deny("*", "x/a")))},
	{40, "a policy allowing only UDP does not allow TCP", "x/a y/a", only(
		policies(netpol("x", "allow-only-udp-ingress-on-port-81", sel("pod", "a"), in(peers().on(port(81, "UDP"))))),
		on(81, tcp, deny("*", "x/a")))},
	{41, "namespaceSelector matchLabels on the default namespace label", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-client-a-via-ns-selector-for-immutable-ns-label", sel("pod", "a"), in(peers(nsPeer(sel(nsName, "y")))))),
		on(80, tcp, deny("x/*", "x/a"), deny("z/*", "x/a")))},
	{42, "namespaceSelector matchExpressions on the default namespace label", "x/a x/b y/a z/a", only(
		policies(netpol("x", "allow-ns-y-match-selector-for-immutable-ns-label", sel("pod", "a"), types(pEg),
			eg(peers(nsPeer(expr(nsName, metav1.LabelSelectorOpNotIn, "y")))))),
		on(80, tcp, deny("x/a", "y/*")))},
	{43, "UDP default-deny-ingress", "x/a x/b y/a y/b", udpCase43(udp)},
	{44, "UDP ports", "x/a x/b y/a z/a", udpCase44(udp)},
	{45, "UDP from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a", udpCase45(udp)},
	{46, "SCTP default-deny-ingress", "x/a x/b y/a y/b", udpCase43(sctp)},
	{47, "SCTP ports", "x/a x/b y/a z/a", udpCase44(sctp)},
	{48, "SCTP from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a", udpCase45(sctp)},
}
