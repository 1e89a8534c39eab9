package compile

import (
	"fmt"
	"net/netip"
	"sort"

	"k8s.io/apimachinery/pkg/labels"
)

// Protocol is an IP protocol number as it appears in the IP header.
type Protocol uint8

// The transport protocols NetworkPolicy ports can name.
const (
	ProtoTCP  Protocol = 6
	ProtoUDP  Protocol = 17
	ProtoSCTP Protocol = 132
)

// String returns the protocol's Kubernetes spelling ("TCP", "UDP", "SCTP"),
// or its number for any other protocol.
func (p Protocol) String() string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// Name returns the protocol's lowercase name as nft spells it ("tcp",
// "udp", "sctp", "udplite", "dccp", "icmp", "ipv6-icmp"), or its number:
// the ruleset, the logs and the metrics all use these names.
func (p Protocol) Name() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	case 136:
		return "udplite"
	case 33:
		return "dccp"
	case 1:
		return "icmp"
	case 58:
		return "ipv6-icmp"
	}
	return fmt.Sprintf("%d", uint8(p))
}

// namedProtocols are the protocols Name spells out.
var namedProtocols = []Protocol{1, ProtoTCP, ProtoUDP, 33, 58, ProtoSCTP, 136}

// ProtocolByName is Name's inverse (nft's "icmpv6" spelling is accepted too).
func ProtocolByName(s string) (Protocol, bool) {
	if s == "icmpv6" {
		return 58, true
	}
	for _, p := range namedProtocols {
		if p.Name() == s {
			return p, true
		}
	}
	return 0, false
}

// ParseProtocol maps a Kubernetes protocol name to its number.
func ParseProtocol(s string) (Protocol, bool) {
	switch s {
	case "TCP":
		return ProtoTCP, true
	case "UDP":
		return ProtoUDP, true
	case "SCTP":
		return ProtoSCTP, true
	}
	return 0, false
}

// Direction is the direction of a policy rule relative to the selected pod.
type Direction uint8

// Ingress rules admit traffic to selected pods, egress rules traffic from them.
const (
	Ingress Direction = iota
	Egress
)

// String returns "ingress" or "egress".
func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// PodID indexes Program.Pods.
type PodID int32

// PolicyID indexes Program.Policies.
type PolicyID int32

// SelectorID indexes Program.Selectors.
type SelectorID int32

// ContainerPort is a port a pod declares; named ports resolve against these.
type ContainerPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// Pod is a pod that policies can select or name as a peer: it has at least
// one IP, does not use the host network and is not in a terminal phase.
type Pod struct {
	// PodInfo is what the pod's object says (namespace, name, key,
	// labels, node, ports), shared with the informer's store, read-only.
	*PodInfo
	// IPs holds the addresses the pod owns (PodInfo.IPs but those another
	// pod owns), IPv4 first, each at most once.
	IPs []netip.Addr
	// MemberOf lists, sorted, the selector peer sets the pod belongs to:
	// one short contiguous slice per pod keeps the evaluator's peer checks
	// to a cache line or two.
	MemberOf []SelectorID
	// Subject is what the policies that select the pod say about it. Only
	// local pods are subjects: each has its own record, and every other
	// pod shares one empty record (notSubject), read-only, so that a
	// cluster's remote pods cost no room for it. Code that changes a
	// copied Pod's subject fields calls OwnSubject first.
	*Subject
	// Local is true for pods on the node the program was built for (every
	// pod when it was built for no node). Only local pods are enforced.
	Local bool
}

// Subject is what the policies that select a local pod say about it.
type Subject struct {
	// IngressPolicies and EgressPolicies list, in program order, the
	// policies that select this pod and isolate it in that direction.
	IngressPolicies []PolicyID
	EgressPolicies  []PolicyID
	// IngressTable and EgressTable index Program.Tables: the decision table
	// of the pod's combination of isolating policies (-1: not isolated).
	IngressTable, EgressTable int32
	// IngressDenied and EgressDenied are the reasons given when an isolated
	// pod's traffic matches no rule (empty when not isolated).
	IngressDenied string
	EgressDenied  string

	// AdminIngress, AdminEgress, BaselineIngress and BaselineEgress list the
	// ClusterNetworkPolicies that have this (local) pod as a subject and
	// rules in that direction, in precedence order: priority, then name.
	AdminIngress, AdminEgress       []ClusterPolicyID
	BaselineIngress, BaselineEgress []ClusterPolicyID

	// StagedSubject, indexed by Direction, says that a staged policy
	// (StagedAnnotation) selects this local pod in that direction: its
	// verdicts there may change once the staged policies are enforced.
	// Set only in programs built without Input.EnforceStaged.
	StagedSubject [2]bool
}

// notSubject is the subject record every pod that is not local shares:
// no policy selects it. Never written.
var notSubject = Subject{IngressTable: -1, EgressTable: -1}

// subjectFor returns the subject record of a new Pod: its own, not
// isolated until policies are added to it, for a local pod; the shared
// notSubject for any other.
func subjectFor(local bool) *Subject {
	if !local {
		return &notSubject
	}
	return &Subject{IngressTable: -1, EgressTable: -1}
}

// OwnSubject gives the pod a copy of its subject record of its own: a Pod
// copied from another shares the record, which the other's program reads.
func (p *Pod) OwnSubject() {
	s := *p.Subject
	p.Subject = &s
}

// Policies returns the NetworkPolicies isolating the pod in one direction.
func (p *Pod) Policies(d Direction) []PolicyID {
	if d == Egress {
		return p.EgressPolicies
	}
	return p.IngressPolicies
}

// ClusterPolicies returns the pod's ClusterNetworkPolicies of one tier and
// direction, in precedence order.
func (p *Pod) ClusterPolicies(t Tier, d Direction) []ClusterPolicyID {
	switch {
	case t == TierAdmin && d == Ingress:
		return p.AdminIngress
	case t == TierAdmin:
		return p.AdminEgress
	case d == Ingress:
		return p.BaselineIngress
	}
	return p.BaselineEgress
}

// InSelector reports whether the pod belongs to the selector peer set.
func (p *Pod) InSelector(id SelectorID) bool {
	m := p.MemberOf
	if len(m) <= 16 {
		for _, x := range m {
			if x == id {
				return true
			}
		}
		return false
	}
	lo, hi := 0, len(m)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if m[mid] < id {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo < len(m) && m[lo] == id
}

// NamedPort resolves a named port on the pod: the number of the container
// port with that name and protocol.
func (p *Pod) NamedPort(name string, proto Protocol) (uint16, bool) {
	for i := range p.Ports {
		if p.Ports[i].Name == name && p.Ports[i].Protocol == proto {
			return p.Ports[i].Port, true
		}
	}
	return 0, false
}

// Policy is one NetworkPolicy, resolved.
type Policy struct {
	Namespace string
	Name      string
	// Key is "namespace/name".
	Key string
	// IsolatesIngress and IsolatesEgress come from policyTypes after defaulting.
	IsolatesIngress bool
	IsolatesEgress  bool
	// Selected lists the local pods the policy selects (Pod.Local: those on
	// the program's node, every pod when it was built for no node), in pod
	// order: remote pods are never enforced here, so they are not listed.
	// It is empty for a policy compiled only for its shape (validation).
	Selected []PodID
	Ingress  []Rule
	Egress   []Rule
	// Problems holds what made parts of the policy invalid; those parts
	// allow nothing (see docs/semantics.md).
	Problems []Problem
	// Rejected is set when the policy's cost (NetworkPolicyCost) is over
	// MaxPolicyCost, or what building it makes is over its budget
	// (RejectedFor says which; budget.go): its rules were not compiled (it
	// has none), and it isolates the pods it selects, allowing nothing.
	Rejected    bool
	RejectedFor RejectReason
	// Cost is what building the policy was charged (budget.go): its
	// entries, the pods its selectors were matched against and the
	// elements of its peer sets; for a rejected policy, what was charged
	// before the build stopped, at most its budget. Zero for a policy
	// compiled only for its shape.
	Cost int
}

// Rules returns the policy's rules in one direction.
func (p *Policy) Rules(d Direction) []Rule {
	if d == Egress {
		return p.Egress
	}
	return p.Ingress
}

// Rule is one ingress or egress rule of a policy with its peers and ports
// resolved. A rule allows a connection when a peer matches the remote end
// and a port matches the destination.
type Rule struct {
	Policy    PolicyID
	Direction Direction
	// Index is the rule's position in spec.ingress or spec.egress.
	Index int
	// Name reads "namespace/policy ingress[i]".
	Name string
	// AllowReason reads "allowed by namespace/policy ingress[i]".
	AllowReason string

	// Match holds the rule's peers and ports. AllPeers is true when
	// from/to was absent or empty, AllPorts when ports was; a protocol
	// without a port is the range 0-65535; named ports resolve on the
	// destination pod (the selected pod for ingress, the peer for egress).
	Match

	// Disabled rules allow nothing because they were invalid.
	Disabled bool
	// Order is the rule's position among all rules of its direction in
	// program order: when several rules allow a connection, the reason
	// names the first.
	Order int32
}

// MatchesNothing reports whether the rule can never allow a connection.
func (r *Rule) MatchesNothing() bool { return r.Disabled || r.Match.empty() }

// Match is what a rule of either kind matches: a peer (the remote end of the
// connection) and a destination port. Peer and port alternatives are ORed.
type Match struct {
	// AllPeers matches every remote end.
	AllPeers bool
	// Selectors are pod-selecting peers, as indices of shared peer sets.
	Selectors []SelectorID
	// Nodes are ClusterNetworkPolicy `nodes` peers, as node address sets.
	Nodes []NodeSetID
	// IPBlocks are address peers (ipBlock with its except removed, or
	// networks), as sorted disjoint ranges.
	IPBlocks []IPRange
	// Domains are ClusterNetworkPolicy domainNames patterns, sorted: the
	// peer is an address the local pod itself resolved a matching name to
	// (learned from DNS replies, see fqdn.go).
	Domains []DomainPattern

	// AllPorts matches every protocol and port.
	AllPorts bool
	// Ports are protocols with a port range (0-65535 for a protocol alone).
	Ports []PortRange
	// NamedPorts resolve on the destination pod.
	NamedPorts []NamedPortRef
}

// empty reports whether no connection can match: no peer or no port.
func (m *Match) empty() bool {
	noPeers := !m.AllPeers && len(m.Selectors) == 0 && len(m.Nodes) == 0 && len(m.IPBlocks) == 0 && len(m.Domains) == 0
	noPorts := !m.AllPorts && len(m.Ports) == 0 && len(m.NamedPorts) == 0
	return noPeers || noPorts
}

// PortRange is a protocol and an inclusive range of destination ports.
type PortRange struct {
	Protocol    Protocol
	First, Last uint16
}

// NamedPortRef is a port named by a rule. Protocol 0 (ClusterNetworkPolicy's
// destinationNamedPort) matches a container port of that name whatever its
// protocol.
type NamedPortRef struct {
	Name     string
	Protocol Protocol
}

// Selector is a set of pods named by a peer: a podSelector in the policy's
// namespace, a namespaceSelector, or both. Identical peers of different rules
// and policies share one Selector.
type Selector struct {
	// Key identifies the peer canonically.
	Key string
	// Description says in words which pods the peer selects.
	Description string
	// Members lists the selected pods, in pod order.
	Members []PodID
	// Users names the rules that use this peer set ("x/p ingress[0]").
	Users []string
	// Aliases are the keys of the peers that select the same pods as
	// this one but say something else, and use its set (peershare.go).
	// Key, Description and the selectors below are the first peer's.
	Aliases []string
	// Namespace is the policy's namespace when the peer has no namespace
	// selector; otherwise NamespaceSelector is that selector, in label
	// selector syntax (labels.Parse reads it back), as PodSelector always is.
	// Explanations read them to say which label a pod or namespace lacks.
	Namespace                      string
	NamespaceSelector, PodSelector string
}

// Contains reports whether the pod belongs to the set.
func (s *Selector) Contains(id PodID) bool {
	m := s.Members
	i := sort.Search(len(m), func(i int) bool { return m[i] >= id })
	return i < len(m) && m[i] == id
}

// Table is the decision table of one combination of policies isolating
// pods in one direction: their rules, regrouped so that a verdict reads a
// few contiguous slices instead of every rule of every policy.
type Table struct {
	// Policies is the combination, in program order.
	Policies []PolicyID
	// AnyPeer holds the rules that match every peer, in rule order.
	AnyPeer []*Rule
	// BySelector holds (selector, rule) pairs sorted by selector, then
	// rule order: a remote pod's MemberOf is merged against it.
	BySelector []SelectorRule
	// Blocks holds the rules with ipBlock peers, in rule order.
	Blocks []*Rule
}

// SelectorRule pairs a selector peer set with a rule that names it.
type SelectorRule struct {
	Selector SelectorID
	Rule     *Rule
}

// Problem is a part of a policy that could not be used as written.
type Problem struct {
	// Cluster is true for a ClusterNetworkPolicy's problem.
	Cluster bool
	// Policy is "namespace/name" (a ClusterNetworkPolicy: its name).
	Policy string
	// Field is the path of the offending field, e.g. "spec.ingress[0].from[1].ipBlock.except[0]".
	Field   string
	Message string
}

// Error formats the problem for logs and events.
func (p Problem) Error() string {
	kind := "networkpolicy"
	if p.Cluster {
		kind = "clusternetworkpolicy"
	}
	return fmt.Sprintf("%s %s: %s: %s", kind, p.Policy, p.Field, p.Message)
}

// Program is the compiled, immutable form of every NetworkPolicy as seen by
// one node. Both executors read it: the kernel ruleset is rendered from it,
// and the userspace evaluator decides from it. It must not be modified after
// Build returns it.
type Program struct {
	// Node is the node the program was built for; empty for a cluster-wide view.
	Node      string
	NodeIPs   []netip.Addr
	Pods      []Pod
	Policies  []Policy
	Selectors []Selector
	// Tables holds the decision tables referenced by pods.
	Tables []Table
	// Problems collects the problems of all policies, NetworkPolicies first.
	Problems []Problem

	// ClusterPolicies holds the ClusterNetworkPolicies, sorted by name.
	ClusterPolicies []ClusterPolicy
	// NodeSets holds the address sets of `nodes` peers.
	NodeSets []NodeSet
	// NodeAddrs maps each known node's name to its addresses (the scenario's
	// nodes, or Node objects' status.addresses).
	NodeAddrs map[string][]netip.Addr
	// PodCIDRs are the cluster's pod address ranges (Input.PodCIDRs, else
	// every Node's spec.podCIDRs), masked, sorted, each once. An address in
	// them that no pod or node holds is a pod the agent has not seen yet.
	PodCIDRs []netip.Prefix
	// NamespaceLabels holds each namespace's labels as selectors saw them
	// (with kubernetes.io/metadata.name); explanations read it.
	NamespaceLabels map[string]labels.Set

	// Eval is the same program laid out for the userspace evaluator.
	Eval EvalIndex

	// Source is the input the program was built from. It shares the
	// input's objects (which informers never modify): the agent saves it
	// so that a restarted agent can rebuild the program in force before
	// its first sync (pkg/evaluate's snapshot).
	Source Input

	// NamespaceCosts is, by namespace, the sum of its NetworkPolicies'
	// Cost, which Input.Budgets.Namespace bounds.
	NamespaceCosts map[string]int

	// StagedPolicies lists, sorted, the staged policies the program leaves
	// out: NetworkPolicy keys ("namespace/name") and ClusterNetworkPolicy
	// names (empty when the input enforces them, or has none).
	StagedPolicies []string
}

// IsOwnNode reports whether ip is an address of the pod's own node: the
// program's node for a node's program, the pod's node in a cluster-wide view.
func (p *Program) IsOwnNode(pod *Pod, ip netip.Addr) bool {
	if p.Node != "" || pod.Node == "" {
		return p.IsNodeIP(ip)
	}
	for _, a := range p.NodeAddrs[pod.Node] {
		if a == ip {
			return true
		}
	}
	return false
}

// PodByIP returns the pod that owns the address.
func (p *Program) PodByIP(ip netip.Addr) (PodID, bool) {
	return p.Eval.PodByAddr(ip)
}

// IsNodeIP reports whether ip is one of the node's own addresses.
func (p *Program) IsNodeIP(ip netip.Addr) bool {
	for _, n := range p.NodeIPs {
		if n == ip {
			return true
		}
	}
	return false
}

// PodByKey finds a pod by "namespace/name".
func (p *Program) PodByKey(key string) (PodID, bool) {
	i := sort.Search(len(p.Pods), func(i int) bool { return p.Pods[i].Key >= key })
	if i < len(p.Pods) && p.Pods[i].Key == key {
		return PodID(i), true
	}
	return 0, false
}

// PolicyByKey finds a policy by "namespace/name".
func (p *Program) PolicyByKey(key string) (PolicyID, bool) {
	i := sort.Search(len(p.Policies), func(i int) bool { return p.Policies[i].Key >= key })
	if i < len(p.Policies) && p.Policies[i].Key == key {
		return PolicyID(i), true
	}
	return 0, false
}

// Tier is a ClusterNetworkPolicy tier. Per direction, the Admin tier decides
// first, then NetworkPolicy v1 (only for pods a v1 policy isolates), then
// the Baseline tier, then the default: allow.
type Tier uint8

// The two tiers a ClusterNetworkPolicy can use.
const (
	TierAdmin Tier = iota + 1
	TierBaseline
)

// String returns "Admin" or "Baseline", the API's spelling.
func (t Tier) String() string {
	if t == TierBaseline {
		return "Baseline"
	}
	return "Admin"
}

// Action is what a ClusterNetworkPolicy rule does with the traffic it matches.
type Action uint8

// The rule actions: Accept and Deny decide; Pass skips the rest of the tier.
const (
	ActionAccept Action = iota + 1
	ActionDeny
	ActionPass
)

// String returns the API's spelling ("Accept", "Deny", "Pass").
func (a Action) String() string {
	switch a {
	case ActionDeny:
		return "Deny"
	case ActionPass:
		return "Pass"
	}
	return "Accept"
}

// ClusterPolicyID indexes Program.ClusterPolicies.
type ClusterPolicyID int32

// NodeSetID indexes Program.NodeSets.
type NodeSetID int32

// ClusterPolicy is one ClusterNetworkPolicy, resolved.
type ClusterPolicy struct {
	Name     string
	Tier     Tier
	Priority int32
	// Label reads "ClusterNetworkPolicy NAME (Tier, priority N)".
	Label string
	// Subjects lists the local pods the policy applies to, in pod order.
	Subjects []PodID
	Ingress  []ClusterRule
	Egress   []ClusterRule
	// Problems holds what made parts of the policy invalid or unsupported;
	// those parts are enforced safely (docs/semantics.md).
	Problems []Problem
	// Rejected is set when the policy's cost (ClusterPolicyCost) is over
	// MaxPolicyCost, or what building it makes is over
	// Budgets.ClusterPolicy (RejectedFor says which): its rules' peers and
	// protocols were not compiled; its Accept rules match nothing and its
	// Deny and Pass rules deny all traffic of its subjects in their
	// direction.
	Rejected    bool
	RejectedFor RejectReason
	// Cost is what building it was charged (budget.go), as Policy.Cost.
	Cost int
}

// Rules returns the policy's rules in one direction.
func (p *ClusterPolicy) Rules(d Direction) []ClusterRule {
	if d == Egress {
		return p.Egress
	}
	return p.Ingress
}

// ClusterRule is one ingress or egress rule of a ClusterNetworkPolicy with its
// peers and protocols resolved. It matches a connection when a peer matches
// the remote end and a protocol entry matches the destination port; the
// first matching rule of the tier's first matching policy decides.
type ClusterRule struct {
	Policy    ClusterPolicyID
	Direction Direction
	// Index is the rule's position in spec.ingress or spec.egress.
	Index int
	// Name is the rule's name, or "#i" (its index) when it has none.
	Name   string
	Action Action
	// Reason reads e.g. "denied by ClusterNetworkPolicy no-y (Admin,
	// priority 10) egress rule no-y".
	Reason string

	// Match holds the peers (namespaces and pods peers as shared peer sets,
	// nodes, networks) and protocols (AllPorts when protocols was absent).
	// destinationNamedPort entries have Protocol 0: the name resolves on
	// the destination pod whatever its container port's protocol. A Deny or
	// Pass rule that cannot be used as written fails closed: AllPeers and
	// AllPorts, action Deny.
	Match

	// Disabled rules match nothing (an Accept rule that could not be used
	// as written).
	Disabled bool
}

// MatchesNothing reports whether the rule can never match a connection.
func (r *ClusterRule) MatchesNothing() bool { return r.Disabled || r.Match.empty() }

// NodeSet is the addresses of the nodes a `nodes` peer selects. Identical
// selectors share one NodeSet.
type NodeSet struct {
	// Key identifies the selector canonically.
	Key string
	// Description says in words which nodes the peer selects.
	Description string
	// Nodes names the selected nodes, sorted.
	Nodes []string
	// Addrs holds their addresses, sorted.
	Addrs []netip.Addr
}

// Contains reports whether ip is an address of a selected node.
func (s *NodeSet) Contains(ip netip.Addr) bool {
	i := sort.Search(len(s.Addrs), func(i int) bool { return s.Addrs[i].Compare(ip) >= 0 })
	return i < len(s.Addrs) && s.Addrs[i] == ip
}
