package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

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
func clusterVerdict(t Tier, d Direction, a Action) RuleVerdict {
	tc := tiers(d)
	switch a {
	case ActionDeny:
		return drop()
	case ActionPass:
		if t == TierAdmin {
			return gotoV(tc.networkPolicy)
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
	c := &Chain{Chain: knftables.Chain{Name: name, Comment: truncComment(cp.Label + " " + d.String())},
		place: chainPlace{group: groupClusterPolicy, key: policyChainKey(cp.Name, d)}}
	for ri := range cp.Rules(d) {
		rl := &cp.Rules(d)[ri]
		if rl.MatchesNothing() {
			continue
		}
		comment := fmt.Sprintf("%s %s rule %s (%s)", cp.Name, d, rl.Name, rl.Action)
		verdict := clusterVerdict(cp.Tier, d, rl.Action)
		if rl.Action == ActionDeny {
			verdict = r.dropVerdict(clusterPolicyDeny(cp, rl), c)
		}
		var sample *VerifyInfo
		if rl.Action != ActionPass || cp.Tier == TierBaseline {
			// An Admin Pass decides nothing yet.
			info := verifyOfClusterRule(cp, rl)
			sample = &info
		}
		owner := RuleOwner{Kind: OwnerClusterRule, Direction: d, Policies: []string{cp.Name}, Rule: rl.Name}
		r.matchRules(c, &rl.Match, ruleSetBase(name, ri), comment, d, subjectOfClusterPolicy(cp.Tier, id, d), counted(verdict), sample, owner)
	}
	if len(c.Rules) == 0 {
		return false
	}
	r.addChain(c)
	return true
}

// clusterComboChain jumps to the policies of one tier that apply to a set of
// pods, in precedence order; when none decides, the next tier does.
func (r *renderer) clusterComboChain(t Tier, d Direction, ids []ClusterPolicyID, hasRules func(i int) bool) string {
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
		Comment: truncComment(t.String() + " ClusterNetworkPolicies for " + d.String() + ", in precedence order: " + strings.Join(labels, ", "))},
		place: chainPlace{group: groupCombo, key: name}}
	tc := tiers(d)
	next := gotoV(tc.networkPolicy)
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
		r.combos = append(r.combos, comboSet{chain: name, d: d, ids: ids, sets: [2]string{tierSkipSetName(name, true), tierSkipSetName(name, false)}})
		for _, v4 := range []bool{true, false} {
			set := tierSkipSetName(name, v4)
			s := r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: set, Flags: []knftables.SetFlag{knftables.IntervalFlag},
				Comment: truncComment("every address a rule of " + name + " names")}})
			s.Elements = comboElements(ranges, v4)
			matches, comment := []RuleExpr{notIn(set, addrField(v4, peerAddr(d)))}, "no rule of these policies names the "+peerWord(d)
			if t == TierBaseline {
				c.Rules = append(c.Rules, r.sampledRules(matches, plain(next), comment, verifyDefault(d), RuleOwner{}, v4)...)
			}
			c.Rules = append(c.Rules, mkRule(matches, plain(next), comment))
		}
	}
	for i, id := range ids {
		if hasRules(i) {
			c.Rules = append(c.Rules, mkRule(nil, plain(jump(ClusterPolicyChainName(&r.prog.ClusterPolicies[id], d))), ""))
		}
	}
	if t == TierBaseline {
		c.Rules = append(c.Rules, r.withSamples(nil, plain(next), "", verifyDefault(d), RuleOwner{})...)
	} else {
		c.Rules = append(c.Rules, mkRule(nil, plain(next), ""))
	}
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
// set: sets are its sets' names, IPv4 and IPv6.
type comboSet struct {
	chain string
	sets  [2]string
	d     Direction
	ids   []ClusterPolicyID
}

// comboRanges returns the union of the addresses the rules of these
// policies name in direction d, or false when a rule matches every peer.
// addrs lists a selector's member addresses.
func comboRanges(p *Program, d Direction, ids []ClusterPolicyID, addrs func(SelectorID, func(netip.Addr))) ([]IPRange, bool) {
	sels, out, ok := comboSources(p, d, ids)
	if !ok {
		return nil, false
	}
	for _, sid := range sels {
		addrs(sid, func(a netip.Addr) { out = append(out, IPRange{From: a, To: a}) })
	}
	return normalizeRanges(out), true
}

// comboSources are what comboRanges unites: the selectors whose members'
// addresses count, and the ranges that do not depend on pods (networks,
// nodes' addresses); false when a rule matches every peer.
func comboSources(p *Program, d Direction, ids []ClusterPolicyID) (sels []SelectorID, static []IPRange, ok bool) {
	for _, id := range ids {
		rules := p.ClusterPolicies[id].Rules(d)
		for i := range rules {
			rl := &rules[i]
			if rl.MatchesNothing() {
				continue
			}
			if rl.AllPeers || len(rl.Domains) > 0 {
				// Learned addresses are not known when rendering.
				return nil, nil, false
			}
			sels = append(sels, rl.Selectors...)
			for _, nid := range rl.Nodes {
				for _, a := range p.NodeSets[nid].Addrs {
					static = append(static, IPRange{From: a, To: a})
				}
			}
			static = append(static, rl.IPBlocks...)
		}
	}
	return sels, static, true
}

// comboElements are the elements of one family of a tier-skip set.
func comboElements(ranges []IPRange, v4 bool) []Element {
	var out []Element
	for _, rg := range familyRanges(ranges, v4) {
		out = append(out, RangeElement(rg))
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

// nodeSet renders a nodes peer's addresses of one family; a set with no
// address of the family is still created (nodes may gain addresses).
func (r *renderer) nodeSet(id NodeSetID, v4 bool) string {
	ns := &r.prog.NodeSets[id]
	name := NodeSetName(ns, v4)
	if _, ok := r.rs.Sets[name]; ok {
		return name
	}
	s := r.addSet(&Set{shared: true, Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: name, Comment: truncComment(ns.Description)}})
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
		s.Elements = append(s.Elements, AddrElement(a, truncComment(node)))
	}
	return name
}
