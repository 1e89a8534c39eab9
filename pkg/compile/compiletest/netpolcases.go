package compiletest

import (
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The 48 cases of the upstream NetworkPolicy e2e suite (kubernetes
// test/e2e/network/netpol/network_policy.go), as truth tables over the
// grid. docs/netpol-cases.md lists them with upstream's test names. They
// are the one copy that pkg/evaluate's tests and tests/e2e's
// real-packet suite both read.
//
// Conventions:
//   - Expectations start all-allowed; deltas apply in order, later ones
//     win. Loopback is not probed.
//   - Pods lists the pods the current upstream test creates; older upstream
//     versions always created all nine, and two cases need one more delta
//     then (GridExtra).
//   - Cases with updates (15, 20, 21, 22, 24, 31, 32, 33, 36, 37) have one
//     step per state; a step holds every object of its state, not a diff.

// NetpolCase is one upstream test.
type NetpolCase struct {
	Num  int
	Name string // short description; docs/netpol-cases.md has upstream's title
	// Pods are the keys of the pods the upstream test creates, sorted.
	Pods []string
	// GridExtra are the deltas every expectation needs when all nine grid
	// pods exist, because a pod outside Pods is affected too.
	GridExtra []Delta
	Steps     []NetpolStep
}

// NetpolStep is one state of a case: the policies in force, label changes,
// and the expectations per port and protocol.
type NetpolStep struct {
	Note      string
	Policies  []*networkingv1.NetworkPolicy
	NSLabels  map[string]map[string]string
	PodLabels map[string]map[string]string
	Expect    []Expectation
}

// Grid is the step's objects with the given pods existing.
func (s NetpolStep) Grid(pods []string) GridState {
	return GridState{Pods: pods, NSLabels: s.NSLabels, PodLabels: s.PodLabels}
}

// Expectation is the truth table for one port and protocol, as deltas from
// all-allowed.
type Expectation struct {
	Port   uint16
	Proto  compile.Protocol
	Deltas []Delta
}

// On is the expectation for port and proto.
func On(port uint16, proto compile.Protocol, deltas ...Delta) Expectation {
	return Expectation{port, proto, deltas}
}

// Table is e's truth table over pods, with extra deltas applied last.
func (e Expectation) Table(pods []string, extra ...Delta) TruthTable {
	return NewTruthTable(pods, append(slices.Clone(e.Deltas), extra...))
}

// NetpolCases returns the 48 cases, numbered 1 to 48 in upstream's order.
// Every call builds new objects, so callers may change them.
func NetpolCases() []NetpolCase {
	data := netpolCaseData()
	out := make([]NetpolCase, 0, len(data))
	for _, d := range data {
		pods := strings.Fields(d.pods)
		slices.Sort(pods)
		out = append(out, NetpolCase{Num: d.num, Name: d.name, Pods: pods, GridExtra: gridExtra[d.num], Steps: d.steps})
	}
	return out
}

// gridExtra: in case 4, x/deny-all also isolates x/c; in case 11, z/a is
// not pod b or c, so z/a -> x/a is denied.
var gridExtra = map[int][]Delta{
	4:  {Deny("*", "x/c")},
	11: {Deny("z/a", "x/a")},
}

type caseData struct {
	num   int
	name  string
	pods  string // space-separated pod keys
	steps []NetpolStep
}

// only is a case with a single step.
func only(nps []*networkingv1.NetworkPolicy, expect ...Expectation) []NetpolStep {
	return []NetpolStep{{Policies: nps, Expect: expect}}
}

func udpCase43(proto compile.Protocol) []NetpolStep {
	return only(List(NetPol("x", "deny-all", Sel(), Types(PIn), Ingress())),
		On(80, proto, Deny("*", "x/*")))
}

func udpCase44(proto compile.Protocol) []NetpolStep {
	return only(List(NetPol("x", "allow-ingress-on-port-81-ns-x", Sel("pod", "a"),
		Ingress(Peers(NSPeer(Sel(NSName, "y"))).On(Port(81, proto.String()))))),
		On(81, proto, Deny("x/*", "x/a"), Deny("z/*", "x/a")))
}

func udpCase45(proto compile.Protocol) []NetpolStep {
	return only(List(NetPol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", Sel("pod", "a"),
		Ingress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "y")))))),
		On(80, proto, Deny("*", "x/a"), Allow("y/a", "x/a")))
}

// netpolCaseData builds the cases' objects afresh. Case 35's cidr is x/b's
// /4 written canonically (0.0.0.0/4), as upstream's makeLargeCIDRForIP
// does: the API server rejects a cidr with host bits set.
func netpolCaseData() []caseData {
	case14Policy := NetPol("x", "allow-client-a-via-ns-selector", Sel("pod", "a"),
		Ingress(Peers(NSPeer(Sel(NSName, "y"))).On(Port(81, "TCP"))))
	case35Policy := NetPol("x", "allow-client-a-via-cidr-egress-rule", Sel("pod", "a"), Types(PEg),
		Egress(Peers(IPPeer(netip.PrefixFrom(GridIP("x/b"), 4).Masked().String(), GridIP("x/b").String()+"/32"))))
	return []caseData{
		{1, "default-deny-ingress", "x/a x/b y/a y/b", only(
			List(NetPol("x", "deny-ingress", Sel(), Types(PIn), Ingress())),
			On(80, TCP, Deny("*", "x/*")))},
		{2, "default-deny-all", "x/a x/b y/a", only(
			List(NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress())),
			On(80, TCP, Deny("*", "x/*"), Deny("x/*", "*")))},
		{3, "allow from pods within server namespace by podSelector", "x/a x/b x/c y/a", only(
			List(NetPol("x", "x-a-allows-x-b", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "b")))))),
			On(80, TCP, Deny("*", "x/a"), Allow("x/b", "x/a")))},
		{4, "allow ingress traffic for a target", "x/a x/b y/a", only(
			List(
				NetPol("x", "deny-all", Sel(), Types(PIn), Ingress()),
				NetPol("x", "allow-all-to-a", Sel("pod", "a"), Ingress(Peers(PodNSPeer(Sel(), Sel()))))),
			On(80, TCP, Allow("*", "x/a"), Deny("*", "x/b")))},
		{5, "allow ingress from pods in all namespaces", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-from-another-ns", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel()))))),
			On(80, TCP))},
		{6, "allow only from a different namespace by namespaceSelector", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-client-a-via-ns-selector", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(NSName, "y")))))),
			On(80, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")))},
		{7, "podSelector with matchExpressions", "x/a x/b y/a", only(
			List(NetPol("x", "x-a-allows-x-b", Sel("pod", "a"), Ingress(Peers(PodPeer(Expr("pod", metav1.LabelSelectorOpIn, "b")))))),
			On(80, TCP, Deny("*", "x/a"), Allow("x/b", "x/a")))},
		{8, "namespaceSelector with matchExpressions", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-ns-y-match-selector", Sel("pod", "a"), Ingress(Peers(NSPeer(Expr(NSName, metav1.LabelSelectorOpIn, "y")))))),
			On(80, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")))},
		{9, "podSelector or namespaceSelector", "x/a x/b x/c y/a", only(
			List(NetPol("x", "allow-ns-y-match-selector", Sel("pod", "a"),
				Ingress(Peers(NSPeer(Expr(NSName, metav1.LabelSelectorOpNotIn, "x")), PodPeer(Sel("pod", "b")))))),
			On(80, TCP, Deny("x/c", "x/a")))},
		{10, "podSelector and namespaceSelector", "x/a x/b y/a y/b z/b", only(
			List(NetPol("x", "allow-ns-y-podselector-and-nsselector", Sel("pod", "a"),
				Ingress(Peers(PodNSPeer(Sel("pod", "b"), Expr(NSName, metav1.LabelSelectorOpNotIn, "x")))))),
			On(80, TCP, Deny("*", "x/a"), Allow("y/b", "x/a"), Allow("z/b", "x/a")))},
		{11, "multiple podSelectors and namespaceSelectors", "x/a x/b y/a y/b y/c", only(
			List(NetPol("x", "allow-ns-y-z-pod-b-c", Sel("pod", "a"),
				Ingress(Peers(PodNSPeer(Expr("pod", metav1.LabelSelectorOpIn, "b", "c"), Expr(NSName, metav1.LabelSelectorOpNotIn, "x")))))),
			On(80, TCP, Deny("x/*", "x/a"), Deny("y/a", "x/a")))},
		{12, "any podSelectors", "x/a x/b x/c", only(
			List(NetPol("x", "allow-ns-x-pod-b-c", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "b")), PodPeer(Sel("pod", "c")))))),
			On(80, TCP, Deny("*", "x/a"), Allow("x/b", "x/a"), Allow("x/c", "x/a")))},
		{13, "only from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a y/b z/a", only(
			List(NetPol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", Sel("pod", "a"),
				Ingress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "y")))))),
			On(80, TCP, Deny("*", "x/a"), Allow("y/a", "x/a")))},
		{14, "ports", "x/a x/b y/a y/b z/a", only(
			List(case14Policy),
			On(81, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a"), Allow("y/*", "x/a")))},
		{15, "stacked policies with overlapping podSelectors", "x/a x/b y/a y/b z/a", []NetpolStep{
			{Note: "81 only", Policies: List(case14Policy), Expect: []Expectation{
				On(81, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")),
				On(80, TCP, Deny("*", "x/a")),
			}},
			{Note: "80 added", Policies: List(case14Policy,
				NetPol("x", "allow-client-a-via-ns-selector-80", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(NSName, "y"))).On(Port(80, "TCP"))))),
				Expect: []Expectation{
					On(81, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")),
					On(80, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a"), Allow("y/*", "x/a")),
				}},
		}},
		{16, "allow-all", "x/a x/b y/a", only(
			List(NetPol("x", "allow-all", Sel(), Ingress(Peers()))),
			On(80, TCP), On(81, TCP))},
		{17, "ingress on one named port", "x/a x/b y/a", only(
			List(NetPol("x", "allow-all", Sel(), Ingress(Peers().On(NamedPort("serve-81-tcp", ""))))),
			On(81, TCP), On(80, TCP, Deny("*", "x/*")))},
		{18, "ingress from namespace on one named port", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-client-a-via-ns-selector-80", Sel("pod", "a"),
				Ingress(Peers(NSPeer(Sel(NSName, "y"))).On(NamedPort("serve-80-tcp", "TCP"))))),
			On(80, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")), On(81, TCP, Deny("*", "x/a")))},
		{19, "egress on one named port", "x/a y/a", only(
			List(NetPol("x", "allow-egress", Sel(), Types(PEg), Egress(Peers().On(NamedPort("serve-80-tcp", ""))))),
			On(80, TCP), On(81, TCP, Deny("x/*", "*")))},
		{20, "updated policy", "x/a y/a", []NetpolStep{
			{Note: "allow all", Policies: List(NetPol("x", "allow-all-mutate-to-deny-all", Sel(), Ingress(Peers()))),
				Expect: []Expectation{On(81, TCP)}},
			{Note: "updated to deny all", Policies: List(NetPol("x", "allow-all-mutate-to-deny-all", Sel(), Ingress())),
				Expect: []Expectation{On(81, TCP, Deny("*", "x/*"))}},
		}},
		{21, "ingress from updated namespace", "x/a y/a", func() []NetpolStep {
			np := NetPol("x", "allow-client-a-via-ns-selector", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel("ns2", "updated")))))
			return []NetpolStep{
				{Note: "before", Policies: List(np), Expect: []Expectation{On(80, TCP, Deny("*", "x/a"))}},
				{Note: "y labelled ns2=updated", Policies: List(np), NSLabels: map[string]map[string]string{"y": {"ns2": "updated"}},
					Expect: []Expectation{On(80, TCP, Deny("*", "x/a"), Allow("y/*", "x/a"))}},
			}
		}()},
		{22, "ingress from updated pod", "x/a x/b", func() []NetpolStep {
			np := NetPol("x", "allow-client-a-via-pod-selector", Sel("pod", "a"), Ingress(Peers(PodPeer(Sel("pod", "b", "pod2", "updated")))))
			return []NetpolStep{
				{Note: "before", Policies: List(np), Expect: []Expectation{On(80, TCP, Deny("*", "x/a"))}},
				{Note: "x/b labelled pod2=updated", Policies: List(np), PodLabels: map[string]map[string]string{"x/b": {"pod": "b", "pod2": "updated"}},
					Expect: []Expectation{On(80, TCP, Deny("*", "x/a"), Allow("x/b", "x/a"))}},
			}
		}()},
		{23, "deny ingress from pods in other namespaces", "x/a x/b y/a z/a", only(
			List(NetPol("x", "deny-empty-policy", Sel(), Ingress(Peers(PodPeer(Sel()))))),
			On(80, TCP, Deny("y/*", "x/*"), Deny("z/*", "x/*")))},
		{24, "deny ingress to updated pod", "x/a y/a", func() []NetpolStep {
			np := NetPol("x", "deny-ingress-via-label-selector", Sel("target", "isolated"), Types(PIn), Ingress())
			return []NetpolStep{
				{Note: "before", Policies: List(np), Expect: []Expectation{On(80, TCP)}},
				{Note: "x/a labelled target=isolated", Policies: List(np), PodLabels: map[string]map[string]string{"x/a": {"pod": "a", "target": "isolated"}},
					Expect: []Expectation{On(80, TCP, Deny("*", "x/a"))}},
			}
		}()},
		{25, "deny egress by podSelector", "x/a x/b y/a", only(
			List(NetPol("x", "deny-egress-pod-a", Sel("pod", "a"), Types(PEg), Egress())),
			On(80, TCP, Deny("x/a", "*")))},
		{26, "deny egress from all pods in a namespace", "x/a x/b y/a", only(
			List(NetPol("x", "deny-egress-ns-x", Sel(), Types(PEg), Egress())),
			On(80, TCP, Deny("x/*", "*")))},
		{27, "ingress and egress together", "x/a x/b x/c y/a", only(
			List(NetPol("x", "allow-client-a-via-pod-selector", Sel("pod", "a"), Types(PEg, PIn),
				Ingress(Peers(PodPeer(Sel("pod", "b")))), Egress(Peers().On(Port(80, ""))))),
			On(80, TCP, Deny("*", "x/a"), Allow("x/b", "x/a")),
			On(81, TCP, Deny("*", "x/a"), Deny("x/a", "*"), Allow("x/b", "x/a")))},
		{28, "egress denied on the client even if the server allows it", "x/a y/a y/b", only(
			List(
				NetPol("x", "allow-to-ns-y-pod-a", Sel("pod", "a"), Types(PEg), Egress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "y"))))),
				NetPol("y", "allow-from-xa-on-ya-match-selector", Sel("pod", "a"), Ingress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "x"))))),
				NetPol("y", "allow-from-xa-on-yb-match-selector", Sel("pod", "b"), Ingress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "x")))))),
			On(80, TCP, Deny("x/a", "*"), Deny("*", "y/a"), Allow("x/a", "y/a"), Deny("*", "y/b")))},
		{29, "egress to a server in another namespace by podSelector and namespaceSelector", "x/a y/a y/b", only(
			List(NetPol("x", "allow-to-ns-y-pod-a", Sel("pod", "a"), Types(PEg), Egress(Peers(PodNSPeer(Sel("pod", "a"), Sel(NSName, "y")))))),
			On(80, TCP, Deny("x/a", "*"), Allow("x/a", "y/a")))},
		{30, "ingress on any port of one protocol", "x/a y/a", only(
			List(NetPol("x", "allow-ingress-by-proto", Sel("pod", "a"), Ingress(Peers().On(ProtoOnly("TCP"))))),
			On(80, TCP), On(80, UDP, Deny("*", "x/a")))},
		{31, "ingress allow-all takes precedence", "x/a y/a", []NetpolStep{
			{Note: "port 80 only", Policies: List(NetPol("x", "allow-ingress-port-80", Sel(), Ingress(Peers().On(Port(80, ""))))),
				Expect: []Expectation{On(81, TCP, Deny("*", "x/*"))}},
			{Note: "allow-all added", Policies: List(
				NetPol("x", "allow-ingress-port-80", Sel(), Ingress(Peers().On(Port(80, "")))),
				NetPol("x", "allow-ingress", Sel(), Ingress(Peers()))),
				Expect: []Expectation{On(81, TCP)}},
		}},
		{32, "egress allow-all takes precedence", "x/a y/a", []NetpolStep{
			{Note: "port 80 only", Policies: List(NetPol("x", "allow-egress-port-80", Sel(), Types(PEg), Egress(Peers().On(Port(80, ""))))),
				Expect: []Expectation{On(81, TCP, Deny("x/*", "*"))}},
			{Note: "allow-all added", Policies: List(
				NetPol("x", "allow-egress-port-80", Sel(), Types(PEg), Egress(Peers().On(Port(80, "")))),
				NetPol("x", "allow-egress", Sel(), Types(PEg), Egress(Peers()))),
				Expect: []Expectation{On(81, TCP)}},
		}},
		{33, "policies stop being enforced once deleted", "x/a y/a", []NetpolStep{
			{Note: "deny-all", Policies: List(NetPol("x", "deny-all", Sel(), Types(PIn, PEg), Ingress(), Egress())),
				Expect: []Expectation{On(80, TCP, Deny("x/*", "*"), Deny("*", "x/*"))}},
			{Note: "deleted", Policies: nil, Expect: []Expectation{On(80, TCP)}},
		}},
		{34, "egress to a server in a CIDR block", "x/a y/a y/b", only(
			List(NetPol("x", "allow-client-a-via-cidr-egress-rule", Sel("pod", "a"), Types(PEg), Egress(Peers(IPPeer(GridIP("y/b").String()+"/32"))))),
			On(80, TCP, Deny("x/a", "*"), Allow("x/a", "y/b")))},
		{35, "except clause of an egress CIDR block", "x/a x/b x/c", only(
			List(case35Policy),
			On(80, TCP, Deny("x/a", "x/b")))},
		{36, "an IP in both cidr and except, then the policy updated", "x/a x/b x/c", []NetpolStep{
			{Note: "cidr except x/b", Policies: List(case35Policy), Expect: []Expectation{On(80, TCP, Deny("x/a", "x/b"))}},
			{Note: "replaced by x/b/32", Policies: List(NetPol("x", "allow-client-a-via-cidr-egress-rule", Sel("pod", "a"), Types(PEg),
				Egress(Peers(IPPeer(GridIP("x/b").String()+"/32"))))),
				Expect: []Expectation{On(80, TCP, Deny("x/a", "*"), Allow("x/a", "x/b"))}},
		}},
		{37, "ingress and egress controlled independently", "x/a x/b y/a", func() []NetpolStep {
			egress := NetPol("x", "allow-egress-for-target", Sel("pod", "a"), Types(PEg), Egress(Peers()))
			return []NetpolStep{
				{Note: "egress allow-all", Policies: List(egress), Expect: []Expectation{On(80, TCP)}},
				{Note: "ingress deny added", Policies: List(egress, NetPol("x", "deny-ingress-via-label-selector", Sel("pod", "a"), Types(PIn), Ingress())),
					Expect: []Expectation{On(80, TCP, Deny("*", "x/a"))}},
			}
		}()},
		{38, "SCTP is not TCP", "x/a y/a", only(
			List(
				NetPol("x", "deny-ingress", Sel(), Types(PIn), Ingress()),
				NetPol("x", "allow-only-sctp-ingress-on-port-81", Sel("pod", "a"), Ingress(Peers().On(Port(81, "SCTP"))))),
			On(81, TCP, Deny("*", "x/*")))},
		{39, "a policy allowing only SCTP isolates", "x/a y/a", only(
			List(NetPol("x", "allow-only-sctp-ingress-on-port-80", Sel("pod", "a"), Ingress(Peers().On(Port(80, "SCTP"))))),
			On(81, TCP, Deny("*", "x/a")))},
		{40, "a policy allowing only UDP does not allow TCP", "x/a y/a", only(
			List(NetPol("x", "allow-only-udp-ingress-on-port-81", Sel("pod", "a"), Ingress(Peers().On(Port(81, "UDP"))))),
			On(81, TCP, Deny("*", "x/a")))},
		{41, "namespaceSelector matchLabels on the default namespace label", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-client-a-via-ns-selector-for-immutable-ns-label", Sel("pod", "a"), Ingress(Peers(NSPeer(Sel(NSName, "y")))))),
			On(80, TCP, Deny("x/*", "x/a"), Deny("z/*", "x/a")))},
		{42, "namespaceSelector matchExpressions on the default namespace label", "x/a x/b y/a z/a", only(
			List(NetPol("x", "allow-ns-y-match-selector-for-immutable-ns-label", Sel("pod", "a"), Types(PEg),
				Egress(Peers(NSPeer(Expr(NSName, metav1.LabelSelectorOpNotIn, "y")))))),
			On(80, TCP, Deny("x/a", "y/*")))},
		{43, "UDP default-deny-ingress", "x/a x/b y/a y/b", udpCase43(UDP)},
		{44, "UDP ports", "x/a x/b y/a z/a", udpCase44(UDP)},
		{45, "UDP from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a", udpCase45(UDP)},
		{46, "SCTP default-deny-ingress", "x/a x/b y/a y/b", udpCase43(SCTP)},
		{47, "SCTP ports", "x/a x/b y/a z/a", udpCase44(SCTP)},
		{48, "SCTP from a pod in a different namespace by podSelector and namespaceSelector", "x/a x/b y/a", udpCase45(SCTP)},
	}
}
