package compile

import (
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
// Which packets are checked: those that arrive on a veth or a bridge, the
// kinds of interface a pod's traffic enters the node through with routed
// (ptp, one veth and a /32 or /128 route per pod: the lab, Calico, kindnet,
// Cilium's legacy routing) and bridge CNIs (the bridge, with or without
// br_netfilter). Not the uplinks: physical NICs, bonds and VLANs have other
// kinds (or none), so a multi-homed node whose replies come back on another
// uplink than the one it routes through (asymmetric routing) is not broken,
// nor are tunnels (vxlan, ipip, wireguard: other nodes' traffic, which their
// own agent checked when it left the pod), nor lo (the node's traffic to
// itself). The kind comes with the interface, so there is no discovery to
// do, no set to keep up to date and no race with a pod's creation: a new
// pod's veth is checked from its first packet. The alternative, a set of
// "interface . pod address" pairs filled by resolving each local pod's
// route, is exact for bridges too but has to follow every pod and interface
// change and leaves a new pod unchecked until it is resolved. With kinds,
// a node whose uplink is itself a veth or a bridge (kind's Docker nodes, a
// bridge holding the node's address) has that uplink checked strictly too:
// correct unless the node is multi-homed with asymmetric routing through it.
//
// What it does not catch: on a bridge CNI the pods of a node share one
// subnet routed through the bridge, so a pod can still take another local
// pod's address of that subnet (anything outside it, other nodes' pods,
// outside addresses, is caught). Pods behind interfaces of other kinds
// (macvlan, ipvlan, SR-IOV, OVS ports) are not checked: those CNIs do their
// own anti-spoofing. hostNetwork pods are the node: their traffic leaves
// through output, which is not checked. Traffic from other nodes is not
// checked here, since it was checked on its own node, where nftpolicy runs
// too. RenderConfig.NoSourceValidation (--source-validation=false) leaves
// the chain out, for CNIs that already enforce it.

// sourceCheckComment is the drop rule's comment: what it drops and how to
// turn it off.
const sourceCheckComment = "spoofed source: came in on a pod interface (veth/bridge) that does not route back to it; --source-validation=false disables"

// ndRule accepts IPv6 neighbour discovery, which the ruleset never filters.
func ndRule() knftables.Rule {
	return rule("meta l4proto ipv6-icmp icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept", "IPv6 neighbour discovery")
}

// sourceValidation renders the prerouting chain of the check (see above).
func (r *renderer) sourceValidation() {
	if r.cfg.NoSourceValidation {
		return
	}
	r.prerouting = &Chain{Chain: knftables.Chain{Name: ChainPrerouting,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.PreroutingHook), Priority: ptr(knftables.RawPriority),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("before conntrack: drops packets that pods sent with a source address not their own")},
		Rules: []knftables.Rule{ndRule(),
			rule(`meta iifkind { "veth", "bridge" } fib saddr . iif oif missing counter drop`, sourceCheckComment)}}
}
