package compile

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"
)

// QueuesUnknownPods reports whether the ruleset sends new connections of
// unknown addresses in the pod ranges to the userspace evaluator: in
// hybrid and queue mode unless SkipUnknownPods; never in kernel mode.
func (c *RenderConfig) QueuesUnknownPods() bool {
	return c.Mode != ModeKernel && !c.SkipUnknownPods
}

// unknownPods renders the known-pods and pod-cidrs sets and returns the
// forward chain's rules that queue a new connection from or to an address
// in the pod ranges that no known pod (or node) holds: a pod that started
// sending before this agent saw it. Without the rules such a pod would be
// unselected, its egress and its peers' view of it unrestricted; queued,
// the evaluator holds the packet until the pod is programmed (bounded) and
// then decides with the full program. Once a pod is known, its address is
// in known-pods and its traffic never reaches these rules' queue again.
// Each source address gets a bounded share of the queue on the way
// (ChainQueueHeld, render_share.go): a pod that opens connections to
// unused pod-range addresses cannot fill it for the others.
//
// Without pod ranges (no Node has spec.podCIDRs and --pod-cidrs is not
// given: CNIs with their own IPAM) nothing tells an unknown pod's address
// from an outside one, except where it comes in: a new connection from a
// source that no known pod or node holds, on a pod interface (the kinds of
// source validation: veth, bridge, netkit), is a pod this agent does not
// know, a new one or an address a pod added (on a bridge CNI, an unused
// address of the bridge's subnet passes source validation). It is dropped
// (unknownLocalRules): the evaluator cannot hold it, because it tells
// held connections by their addresses, and without ranges an unknown pod's
// address looks like an outside one. A new pod's first connections are
// then dropped until it is programmed (its SYN is retransmitted); the
// agent reports that it runs without ranges (nftpolicy_pod_ranges, a
// warning), and --pod-cidrs turns the drop into the hold.
func (r *renderer) unknownPods() []TableRule {
	if !r.cfg.QueuesUnknownPods() {
		return nil
	}
	var out []TableRule
	for _, v4 := range []bool{true, false} {
		r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: knownPodsSet(v4),
			Comment: ptr("every pod address this agent knows, on any node, and the nodes' addresses: their new connections are decided by policy")}})
		r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: podCIDRsSet(v4), Flags: []knftables.SetFlag{knftables.IntervalFlag},
			Comment: ptr("the cluster's pod address ranges (Nodes' spec.podCIDRs or --pod-cidrs)")}})
	}
	// Pods' addresses come with their other elements (podElements).
	r.knownNodeElements()
	for _, c := range r.prog.PodCIDRs {
		s := r.rs.Sets[podCIDRsSet(c.Addr().Is4())]
		s.Elements = append(s.Elements, PrefixElement(c))
	}
	r.queueChain()
	for _, v4 := range []bool{true, false} {
		for _, side := range []string{"saddr", "daddr"} {
			f := addrField(v4, side)
			out = append(out, mkRule([]RuleExpr{lookup(podCIDRsSet(v4), f), notIn(knownPodsSet(v4), f)}, counted(gotoV(ChainQueueHeld)),
				"unknown pod ("+side+" in the pod ranges, not yet programmed): the evaluator waits for it"))
		}
	}
	return append(out, r.unknownLocalRules()...)
}

// unknownLocalRules are the rules of unknown sources on pod interfaces
// without pod ranges (see unknownPods): none when ranges are known. The
// node's uplinks (RenderConfig.UplinkIfaces) are left out: a node whose
// uplink is a veth or a bridge (kind's nodes, a bridge holding the node's
// address) receives outside traffic on it, from addresses no pod holds.
func (r *renderer) unknownLocalRules() []TableRule {
	if len(r.prog.PodCIDRs) > 0 {
		return nil
	}
	var uplinks strings.Builder
	for _, u := range r.cfg.UplinkIfaces {
		fmt.Fprintf(&uplinks, "iifname != %q ", u)
	}
	var out []TableRule
	for _, v4 := range []bool{true, false} {
		out = append(out, mkRule([]RuleExpr{nftOnly(strings.TrimSuffix("meta iifkind "+podIfaceKinds+" "+uplinks.String(), " ")), notIn(knownPodsSet(v4), addrField(v4, "saddr"))}, counted(drop()),
			"unknown source on a pod interface, no pod ranges known: dropped until programmed; --pod-cidrs holds it instead"))
	}
	return out
}

// knownPodElements adds one pod's addresses to the known-pods sets. Every
// pod of the program counts, local or remote: an unknown remote pod is as
// unrestricted for a local peer's policies as an unknown local one.
//
// These elements carry no comment, unlike those of the sets that decide
// (peers, self, the tier maps), which name their pod: known-pods holds
// every pod of the cluster, so it is most of the elements nft parses on a
// full sync, and a comment each cost 9% of that nft's CPU at 50k pods
// (measured with nft 1.0.6). Which pod holds an address is still told by
// the sets that decide for it (on its node) and by the API. Node addresses
// keep theirs: they are few and explain why a non-pod address is here.
func (r *renderer) knownPodElements(pod *Pod, pt *podText, emit func(set string, e Element)) {
	if !r.cfg.QueuesUnknownPods() {
		return
	}
	for _, ip := range pod.IPs {
		emit(knownPodsSet(ip.Is4()), AddrElement(ip, nil))
	}
}

// knownNodeElements adds node addresses that lie in the pod ranges (some
// CNIs give nodes a pod-range address in status) to the known-pods sets:
// a node is no pod to wait for. Without pod ranges every node address is
// added: the rules of unknown local sources (unknownLocalRules) look at
// every source, and a node whose uplink is a veth or a bridge receives
// the other nodes' traffic on it.
func (r *renderer) knownNodeElements() {
	names := make([]string, 0, len(r.prog.NodeAddrs))
	for n := range r.prog.NodeAddrs {
		names = append(names, n)
	}
	sort.Strings(names)
	add := func(ip netip.Addr, comment string) {
		if len(r.prog.PodCIDRs) > 0 && !r.prog.InPodCIDRs(ip) {
			return
		}
		if _, ok := r.prog.PodByIP(ip); ok {
			return // already there, as the pod
		}
		s := r.rs.Sets[knownPodsSet(ip.Is4())]
		s.Elements = append(s.Elements, AddrElement(ip, truncComment(comment)))
	}
	for _, n := range names {
		for _, ip := range r.prog.NodeAddrs[n] {
			add(ip, "node "+n)
		}
	}
	for _, ip := range r.prog.NodeIPs {
		add(ip, "this node")
	}
}
