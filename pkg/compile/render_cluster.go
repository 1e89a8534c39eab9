package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// clusterPolicyRef is a ClusterNetworkPolicy's readable part of object
// names, shortened with a hash when long.
func clusterPolicyRef(p *ClusterPolicy) string {
	ref := p.Name
	if len(ref) > maxPolicyRefChars {
		ref = ref[:maxPolicyRefChars-9] + "_" + shortHash(p.Name)
	}
	return ref
}

func tierWord(t Tier) string { return strings.ToLower(t.String()) }

// ClusterPolicyChainName is the chain holding a ClusterNetworkPolicy's rules
// in one direction: "admin-<name>-egress", "baseline-<name>-ingress".
func ClusterPolicyChainName(p *ClusterPolicy, d Direction) string {
	return tierWord(p.Tier) + "-" + clusterPolicyRef(p) + "-" + d.String()
}

// ClusterComboChainName is the chain for the pods that exactly this list of
// ClusterNetworkPolicies of one tier applies to, in one direction.
func ClusterComboChainName(p *Program, t Tier, d Direction, ids []ClusterPolicyID) string {
	return d.String() + "-" + tierWord(t) + "-" + shortHash(clusterComboKey(p, ids))
}

func clusterComboKey(p *Program, ids []ClusterPolicyID) string {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = p.ClusterPolicies[id].Name
	}
	return strings.Join(names, ",")
}

// clusterVerdicts are the nft verdicts of a rule's action in one tier and
// direction: Accept moves on to what an allowed connection does next, Pass
// to the next tier.
func clusterVerdict(t Tier, d Direction, a Action) string {
	tc := tiers(d)
	switch a {
	case ActionDeny:
		return "drop"
	case ActionPass:
		if t == TierAdmin {
			return "goto " + tc.networkPolicy
		}
		return tc.allowed
	}
	return tc.allowed
}

// clusterPolicyChain renders a ClusterNetworkPolicy's rules in one direction,
// in written order; it reports whether the chain has any rule.
func (r *renderer) clusterPolicyChain(id ClusterPolicyID, d Direction) bool {
	cp := &r.prog.ClusterPolicies[id]
	name := ClusterPolicyChainName(cp, d)
	c := &Chain{Chain: knftables.Chain{Name: name, Comment: truncComment(cp.Label + " " + d.String())}}
	for ri := range cp.Rules(d) {
		rl := &cp.Rules(d)[ri]
		if rl.MatchesNothing() {
			continue
		}
		comment := fmt.Sprintf("%s %s rule %s (%s)", cp.Name, d, rl.Name, rl.Action)
		verdict := clusterVerdict(cp.Tier, d, rl.Action)
		if rl.Action == ActionDeny {
			verdict = r.dropVerdict(clusterPolicyDeny(cp, rl))
		}
		c.Rules = r.matchRules(c.Rules, &rl.Match, name+"-"+itoa(ri), comment, d, subjectOfClusterPolicy(cp.Tier, id, d), "counter "+verdict)
	}
	if len(c.Rules) == 0 {
		return false
	}
	r.addChain(c)
	return true
}

// clusterComboChain jumps to the policies of one tier that apply to a set of
// pods, in precedence order; when none decides, the next tier does.
func (r *renderer) clusterComboChain(t Tier, d Direction, ids []ClusterPolicyID, hasRules map[ClusterPolicyID][2]bool) string {
	name := ClusterComboChainName(r.prog, t, d, ids)
	if _, ok := r.rs.Chains[name]; ok {
		return name
	}
	labels := make([]string, len(ids))
	for i, id := range ids {
		cp := &r.prog.ClusterPolicies[id]
		labels[i] = fmt.Sprintf("%s (%d)", cp.Name, cp.Priority)
	}
	c := &Chain{Chain: knftables.Chain{Name: name,
		Comment: truncComment(t.String() + " ClusterNetworkPolicies for " + d.String() + ", in precedence order: " + strings.Join(labels, ", "))}}
	tc := tiers(d)
	next := "goto " + tc.networkPolicy
	if t == TierBaseline {
		next = tc.allowed
	}
	// A remote end that no rule of these policies names skips the tier in
	// one lookup instead of walking every policy chain.
	addrs := r.selectorAddrs
	if r.addrs != nil {
		addrs = r.addrs
	}
	if ranges, ok := comboRanges(r.prog, d, ids, addrs); ok {
		r.combos = append(r.combos, comboSet{chain: name, d: d, ids: ids})
		for _, v4 := range []bool{true, false} {
			set := name + famSuffix(v4)
			s := r.addSet(&Set{Set: &knftables.Set{Name: set, Type: addrType(v4), Flags: []knftables.SetFlag{knftables.IntervalFlag},
				Comment: truncComment("every address a rule of " + name + " names")}})
			s.Elements = comboElements(ranges, v4)
			c.Rules = append(c.Rules, rule(fmt.Sprintf("%s %s != @%s %s", famWord(v4), peerAddr(d), set, next), "no rule of these policies names the "+peerWord(d)))
		}
	}
	for _, id := range ids {
		if hasRules[id][d] {
			c.Rules = append(c.Rules, rule("jump "+ClusterPolicyChainName(&r.prog.ClusterPolicies[id], d), ""))
		}
	}
	c.Rules = append(c.Rules, rule(next, ""))
	r.addChain(c)
	return name
}

// peerAddr is the address of the remote end: the destination of egress,
// the source of ingress.
func peerAddr(d Direction) string {
	if d == Egress {
		return "daddr"
	}
	return "saddr"
}

func peerWord(d Direction) string {
	if d == Egress {
		return "destination"
	}
	return "source"
}

// comboSet is a ClusterNetworkPolicy combination chain with a tier-skip
// set: its sets are chain-v4 and chain-v6.
type comboSet struct {
	chain string
	d     Direction
	ids   []ClusterPolicyID
}

// comboRanges returns the union of the addresses the rules of these
// policies name in direction d, or false when a rule matches every peer.
// addrs lists a selector's member addresses.
func comboRanges(p *Program, d Direction, ids []ClusterPolicyID, addrs func(SelectorID, func(netip.Addr))) ([]IPRange, bool) {
	var out []IPRange
	addr := func(a netip.Addr) { out = append(out, IPRange{From: a, To: a}) }
	for _, id := range ids {
		rules := p.ClusterPolicies[id].Rules(d)
		for i := range rules {
			rl := &rules[i]
			if rl.MatchesNothing() {
				continue
			}
			if rl.AllPeers || len(rl.Domains) > 0 {
				// Learned addresses are not known when rendering.
				return nil, false
			}
			for _, sid := range rl.Selectors {
				addrs(sid, addr)
			}
			for _, nid := range rl.Nodes {
				for _, a := range p.NodeSets[nid].Addrs {
					addr(a)
				}
			}
			out = append(out, rl.IPBlocks...)
		}
	}
	return normalizeRanges(out), true
}

// comboElements are the elements of one family of a tier-skip set.
func comboElements(ranges []IPRange, v4 bool) []knftables.Element {
	var out []knftables.Element
	for _, rg := range familyRanges(ranges, v4) {
		out = append(out, knftables.Element{Key: []string{rg.String()}})
	}
	return out
}

// selectorAddrs lists the addresses of a selector's members.
func (r *renderer) selectorAddrs(sid SelectorID, f func(netip.Addr)) {
	for _, pid := range r.prog.Selectors[sid].Members {
		for _, a := range r.prog.Pods[pid].IPs {
			f(a)
		}
	}
}

// subjectOfClusterPolicy reports whether a pod is a subject of
// ClusterNetworkPolicy id with rules in direction d.
func subjectOfClusterPolicy(t Tier, id ClusterPolicyID, d Direction) func(*Pod) bool {
	return func(p *Pod) bool { return slices.Contains(p.ClusterPolicies(t, d), id) }
}

// NodeSetName is the set holding the addresses of one family of a nodes peer.
func NodeSetName(s *NodeSet, v4 bool) string { return "nodes-" + shortHash(s.Key) + famSuffix(v4) }

// nodeSet renders a nodes peer's addresses of one family; a set with no
// address of the family is still created (nodes may gain addresses).
func (r *renderer) nodeSet(id NodeSetID, v4 bool) string {
	ns := &r.prog.NodeSets[id]
	name := NodeSetName(ns, v4)
	if _, ok := r.rs.Sets[name]; ok {
		return name
	}
	s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4), Comment: truncComment(ns.Description)}})
	// Addresses are sorted; a node name per address for the listing.
	for _, a := range ns.Addrs {
		if a.Is4() != v4 {
			continue
		}
		node := ""
		for _, n := range ns.Nodes {
			for _, x := range r.prog.NodeAddrs[n] {
				if x == a && node == "" {
					node = n
				}
			}
		}
		s.Elements = append(s.Elements, knftables.Element{Key: []string{a.String()}, Comment: truncComment(node)})
	}
	return name
}
