package compile

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// Source-address validation: a pod must not send packets with a source
// address that is not its own.
//
// Every IP-based decision of the ruleset trusts the source address: the
// peer sets of podSelector and ipBlock rules, the egress dispatch of the
// sending pod (keyed on its address), and conntrack, which takes a packet
// from the resolver's address and port to a pod's open query as that
// query's established reply, ahead of any policy and of the DNS capture. A
// pod with NET_RAW on a CNI without anti-spoofing can write any source, and
// UDP needs no handshake: one forged datagram reaches a victim as a pod or
// an outside address it admits, feeds it a DNS answer, or escapes the
// sender's own egress rules.
//
// The check is strict reverse-path filtering, in the kernel, in a base
// chain of its own on the prerouting hook at priority raw (-300), before
// conntrack: it sees every packet before forward and input do (so before
// their DNS capture and "ct state established,related accept"), and a
// spoofed packet never creates or refreshes a conntrack entry:
//
//	meta iifkind { "veth", "bridge" } fib saddr . iif oif missing counter drop
//
// "fib saddr . iif oif" looks the packet's source up in the routing table
// as a destination and yields the interface the packet came in on if the
// node routes that address back out of it, else nothing ("missing"). A
// pod's own address always routes back through its interface: that is how
// the node reaches the pod. Any other source, another pod's (on this node
// or another), an outside address, a node or Service address (local routes
// yield nothing), does not. 0.0.0.0 to a broadcast or link-local multicast
// address (DHCP) passes (the kernel's fib expression answers the incoming
// interface for those); IPv6 link-local sources are looked up on the
// incoming interface only, so a pod's link-local traffic passes; neighbour
// discovery is accepted before the check (DAD's source is ::; accepting it
// in prerouting only ends this chain, forward and input still run).
// Prerouting, not forward and input: fib's interface lookups are allowed
// there on every kernel with nftables' fib (forward and input only since
// Linux 5.19), and one rule covers both paths.
//
// Which packets are checked: those that arrive on an interface of a kind
// a pod's traffic enters the node through (podIfaceKinds): veth with routed
// (ptp, one veth and a /32 or /128 route per pod: the lab, Calico, kindnet,
// Cilium's legacy routing) and bridge CNIs (the bridge, with or without
// br_netfilter), and netkit (Cilium's veth replacement). Not the uplinks:
// physical NICs, bonds and VLANs have other kinds (or none), so a
// multi-homed node whose replies come back on another uplink than the one
// it routes through (asymmetric routing) is not broken, nor are tunnels
// (vxlan, ipip, wireguard: other nodes' traffic, which their own agent
// checked when it left the pod; what may be decapsulated is the tunnel
// check's, below), nor lo (the node's traffic to itself). The kind comes
// with the interface, so there is no discovery to do, no set to keep up to
// date and no race with a pod's creation: a new pod's veth is checked from
// its first packet. The alternative, a set of "interface . pod address"
// pairs filled by resolving each local pod's route, is exact for bridges
// too but has to follow every pod and interface change and leaves a new
// pod unchecked until it is resolved. With kinds, a node whose uplink is
// itself a veth or a bridge (kind's Docker nodes, a bridge holding the
// node's address) has that uplink checked strictly too: correct unless the
// node is multi-homed with asymmetric routing through it.
//
// What it does not catch: on a bridge CNI the pods of a node share one
// subnet routed through the bridge, so a pod can still take another local
// pod's address of that subnet (anything outside it, other nodes' pods,
// outside addresses, is caught). Pods whose packets never enter the node's
// IP stack through an interface of their own are not checked, and cannot
// be by the node: macvlan and ipvlan pods' packets leave through the
// parent device (to the node they arrive on the parent, an uplink, like
// any host of that network), SR-IOV VFs switch in the NIC, and OVS ports
// are switched by the datapath before the IP stack sees them; those CNIs
// do their own anti-spoofing (the VF's spoofchk, OVS port security).
// hostNetwork pods are the node: their traffic leaves through output,
// which is not checked. Traffic from other nodes is not checked here, since
// it was checked on its own node, where nftpolicy runs too.
// RenderConfig.NoSourceValidation (--source-validation=false) leaves the
// chain out, for CNIs that already enforce it.
//
// The tunnel check: no packet that a node decapsulates may come from a
// pod. An overlay CNI's tunnel endpoint (Flannel's VXLAN on UDP 8472, the
// IANA VXLAN port 4789, Geneve 6081, IPIP, 6in4, GRE) decapsulates what
// any sender addresses to the node, and the inner packet, whose source the
// sender wrote, comes in on the tunnel device, where nothing above checks
// it: a pod with a plain UDP socket (no NET_RAW) sends a VXLAN datagram to
// its node, and the inner packet reaches a victim as any pod the victim
// admits. Only nodes send encapsulation to nodes, so encapsulation
// (tunnelMatches: the IP protocols ipip, ipv6 and gre, and UDP to
// RenderConfig.TunnelUDPPorts) jumps to ChainTunnel, which drops
//
//   - what a pod interface sends to any node's address (the node-addrs
//     sets: every Node's status addresses, and this node's own): caught on
//     the pod's own node, so also when the node masquerades it towards
//     another node, which then sees a node's source;
//   - what comes, on any interface but lo, to an address of this node
//     (local, broadcast or multicast: a UDP socket bound to the wildcard
//     gets all three) from a source that is not a node's address nor in
//     RenderConfig.TunnelPeers: pods of every CNI family (whatever interface
//     their packets enter by: macvlan and ipvlan pods too), and hosts that
//     are not nodes. This is the receiving node's half, as Calico's Felix
//     accepts VXLAN from known hosts only; a tunnel endpoint or load
//     balancer that sends encapsulation from an address no Node lists
//     needs --tunnel-peers.
//
// Before conntrack, so a dropped datagram leaves no entry. What it does
// not cover: a sender that holds a node's address (a hostNetwork pod is the
// node), an encapsulation protocol or port the configuration does not name,
// and a node that runs no agent (its own pods' encapsulation to it is
// unchecked there).

// podIfaceKinds are the interface kinds through which pods' packets enter
// the node's IP stack on an interface of their own (see above).
const podIfaceKinds = `{ "veth", "bridge", "netkit" }`

// tunnelProtocols are the IP protocols of IP-in-IP encapsulation: ipip (4,
// also IPv4 in IPv6), ipv6 (41: 6in4 and ip6ip6, sit) and gre (47, also
// GRE over IPv6).
const tunnelProtocols = "{ ipip, ipv6, gre }"

// sourceCheckComment is the drop rule's comment: what it drops and how to
// turn it off.
const sourceCheckComment = "spoofed source: came in on a pod interface that does not route back to it; --source-validation=false disables"

// ndRule accepts IPv6 neighbour discovery, which the ruleset never filters.
func ndRule() TableRule {
	return mkRule([]RuleExpr{nftOnly("meta l4proto ipv6-icmp icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert }")}, plain(accept()), "IPv6 neighbour discovery")
}

// sourceValidation renders the prerouting chain of the check and the
// tunnel check's chain (see above).
func (r *renderer) sourceValidation() {
	if r.cfg.NoSourceValidation {
		return
	}
	r.prerouting = &Chain{Chain: knftables.Chain{Name: ChainPrerouting,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.PreroutingHook), Priority: ptr(knftables.RawPriority),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("before conntrack: drops packets that pods sent with a source address not their own, and encapsulation from anything but a node")},
		Rules: []TableRule{ndRule(),
			mkRule([]RuleExpr{nftOnly(`meta iifkind ` + podIfaceKinds + ` fib saddr . iif oif missing`)}, counted(drop()), sourceCheckComment)}}
	for _, m := range r.cfg.tunnelMatches() {
		r.prerouting.Rules = append(r.prerouting.Rules, mkRule([]RuleExpr{nftOnly(m)}, plain(jump(ChainTunnel)), "encapsulation: only nodes may send it to nodes"))
	}
	r.tunnelChain()
}

// tunnelMatches are the prerouting matches of encapsulated packets.
func (c *RenderConfig) tunnelMatches() []string {
	out := []string{"meta l4proto " + tunnelProtocols}
	if len(c.TunnelUDPPorts) > 0 {
		// Sorted, each once: nft refuses a set with an element twice.
		var ports []string
		for _, p := range slices.Compact(slices.Sorted(slices.Values(c.TunnelUDPPorts))) {
			ports = append(ports, strconv.Itoa(int(p)))
		}
		out = append(out, "udp dport { "+strings.Join(ports, ", ")+" }")
	}
	return out
}

// tunnelChain renders ChainTunnel and its sets (see above). Every Node's
// addresses are single addresses in a plain set, as the other node address
// sets are: they change with the cluster's nodes, element by element. The
// configured peers may be prefixes: they live in interval sets of their
// own, which change only with the agent's flags.
func (r *renderer) tunnelChain() {
	c := &Chain{Chain: knftables.Chain{Name: ChainTunnel,
		Comment: ptr("encapsulated packets (IPIP, 6in4, GRE, UDP tunnel ports): no packet a node decapsulates may come from a pod")}}
	for _, v4 := range []bool{true, false} {
		s := r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: nodeAddrsSet(v4),
			Comment: ptr("every Node's addresses and this node's: the senders of encapsulation to this node")}})
		s.Elements = append(s.Elements, r.nodeAddrElements(v4)...)
		p := r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: tunnelPeersSet(v4), Flags: []knftables.SetFlag{knftables.IntervalFlag},
			Comment: ptr("--tunnel-peers: more senders of encapsulation to this node")}})
		p.Elements = append(p.Elements, r.tunnelPeerElements(v4)...)
	}
	for _, v4 := range []bool{true, false} {
		for _, set := range []string{nodeAddrsSet(v4), tunnelPeersSet(v4)} {
			c.Rules = append(c.Rules, mkRule([]RuleExpr{nftOnly("meta iifkind " + podIfaceKinds), lookup(set, addrField(v4, "daddr"))}, counted(drop()),
				"encapsulation from a pod interface to a node: --source-validation=false disables"))
		}
	}
	for _, v4 := range []bool{true, false} {
		// The source first: a node's own tunnel traffic, nearly all of what
		// comes here, ends at a set lookup, before the routing lookup.
		src := addrField(v4, "saddr")
		c.Rules = append(c.Rules, mkRule([]RuleExpr{nftOnly(`iifname != "lo"`), notIn(nodeAddrsSet(v4), src), notIn(tunnelPeersSet(v4), src),
			nftOnly("fib daddr type { local, broadcast, multicast }")}, counted(drop()),
			"encapsulation to this node from no node (a pod, any interface): --tunnel-peers admits more, --source-validation=false disables"))
	}
	r.addChain(c)
}

// nodeAddrElements are the elements of a node-addrs set: every known
// node's addresses of the family and this node's, each once, sorted.
func (r *renderer) nodeAddrElements(v4 bool) []Element {
	var addrs []netip.Addr
	add := func(ip netip.Addr) {
		if ip = ip.Unmap(); ip.Is4() == v4 {
			addrs = append(addrs, ip)
		}
	}
	for _, ips := range r.prog.NodeAddrs {
		for _, ip := range ips {
			add(ip)
		}
	}
	for _, ip := range r.prog.NodeIPs {
		add(ip)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	var out []Element
	for _, ip := range slices.Compact(addrs) {
		out = append(out, Element{Addr: ip})
	}
	return out
}

// tunnelPeerElements are the elements of a tunnel-peers set: the
// configured peers of the family, disjoint, adjacent ones merged (the form
// the kernel keeps an interval set in).
func (r *renderer) tunnelPeerElements(v4 bool) []Element {
	var ranges []IPRange
	for _, p := range normalizePrefixes(r.cfg.TunnelPeers) {
		if p.Addr().Is4() == v4 {
			ranges = append(ranges, prefixRange(p))
		}
	}
	var out []Element
	for _, rg := range normalizeRanges(ranges) {
		out = append(out, RangeElement(rg))
	}
	return out
}
