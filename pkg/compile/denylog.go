package compile

import (
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"
)

// Deny logging: with RenderConfig.DenyLogGroup set, every drop of the kernel
// path (a NetworkPolicy isolation chain's default deny, a ClusterNetworkPolicy
// Deny rule) jumps to a small per-denial chain that first sends the packet to
// an NFLOG group, with a short id as the log prefix, then drops it. The
// messages are rate limited in the kernel per source address and overall
// (ChainDenyLogLimits, render_share.go), not per denial: one pod's denials
// cannot crowd out another's. Allowed connections never reach these
// chains, so the kernel path's cost for them does not change.

// Kinds of denial a DenyInfo describes.
const (
	DenyKindNetworkPolicy        = "NetworkPolicy"
	DenyKindClusterNetworkPolicy = "ClusterNetworkPolicy"
)

// DenyRuleDefault is DenyInfo.Rule for a NetworkPolicy default deny: no rule
// of the isolating policies matched.
const DenyRuleDefault = "default deny"

// Defaults of the kernel's rate limit on deny log messages, per source
// address (render_share.go explains the numbers).
const (
	DefaultDenyLogRate  = 5
	DefaultDenyLogBurst = 10
)

// DenyInfo says which policy and rule a logged drop belongs to.
type DenyInfo struct {
	// Kind is DenyKindNetworkPolicy or DenyKindClusterNetworkPolicy.
	Kind string
	// Policy is the ClusterNetworkPolicy's name, or for a NetworkPolicy
	// default deny the isolating policies' keys joined by ", ".
	Policy string
	// Tier is the ClusterNetworkPolicy's tier (0 for NetworkPolicy).
	Tier Tier
	// Rule is the ClusterNetworkPolicy rule's name, or DenyRuleDefault.
	Rule      string
	Direction Direction
}

// ID is the denial's log prefix: "d" and a hash of what it describes, so it
// is the same in every program that has this denial (incremental syncs do
// not rewrite its rules) and fits nft's 127-character prefix limit.
func (d DenyInfo) ID() string {
	return "d" + shortHash(strings.Join([]string{d.Kind, d.Tier.String(), d.Policy, d.Direction.String(), d.Rule}, "\x00"))
}

// IsDenyID reports whether a log prefix is a deny id (ID), not a
// verification sample's (IsVerifyID) or the staged log's.
func IsDenyID(prefix string) bool { return strings.HasPrefix(prefix, "d") }

// String reads e.g. "NetworkPolicy x/deny-all ingress default deny" or
// "ClusterNetworkPolicy no-y (Admin) egress rule no-y".
func (d DenyInfo) String() string {
	if d.Kind == DenyKindClusterNetworkPolicy {
		return fmt.Sprintf("%s %s (%s) %s rule %s", d.Kind, d.Policy, d.Tier, d.Direction, d.Rule)
	}
	return fmt.Sprintf("%s %s %s %s", d.Kind, d.Policy, d.Direction, d.Rule)
}

func networkPolicyDeny(p *Program, d Direction, ids []PolicyID) DenyInfo {
	return DenyInfo{Kind: DenyKindNetworkPolicy, Policy: strings.ReplaceAll(comboKey(p, ids), ",", ", "), Rule: DenyRuleDefault, Direction: d}
}

func clusterPolicyDeny(cp *ClusterPolicy, r *ClusterRule) DenyInfo {
	return DenyInfo{Kind: DenyKindClusterNetworkPolicy, Policy: cp.Name, Tier: cp.Tier, Rule: r.Name, Direction: r.Direction}
}

// DenyIDs lists every denial the kernel ruleset of the program can log, by
// id: the isolation combinations of local pods and the Deny rules of the
// ClusterNetworkPolicies that apply to local pods. It is what Render puts in
// Ruleset.DenyIDs (kernel and hybrid modes), computed without rendering, for
// readers of the log that hold only the program.
func DenyIDs(p *Program) map[string]DenyInfo {
	out := map[string]DenyInfo{}
	cps := map[ClusterPolicyID][2]bool{}
	for i := range p.Pods {
		pod := &p.Pods[i]
		if !pod.Local {
			continue
		}
		for _, d := range []Direction{Ingress, Egress} {
			if ids := pod.Policies(d); len(ids) > 0 {
				info := networkPolicyDeny(p, d, ids)
				out[info.ID()] = info
			}
			for _, t := range []Tier{TierAdmin, TierBaseline} {
				for _, id := range pod.ClusterPolicies(t, d) {
					u := cps[id]
					u[d] = true
					cps[id] = u
				}
			}
		}
	}
	for id, dirs := range cps {
		cp := &p.ClusterPolicies[id]
		for _, d := range []Direction{Ingress, Egress} {
			if !dirs[d] {
				continue
			}
			for i := range cp.Rules(d) {
				r := &cp.Rules(d)[i]
				if r.Action == ActionDeny && !r.MatchesNothing() {
					info := clusterPolicyDeny(cp, r)
					out[info.ID()] = info
				}
			}
		}
	}
	return out
}

// dropVerdict is the verdict of a rule of chain from that drops a denied
// connection's packet: "drop", or with deny logging a goto to the denial's
// chain, which it creates on first use, just before from, and records in
// the ruleset's DenyIDs.
func (r *renderer) dropVerdict(info DenyInfo, from *Chain) RuleVerdict {
	if r.cfg.DenyLogGroup == 0 {
		return drop()
	}
	id := info.ID()
	name := DenyChainName(id)
	if _, ok := r.rs.Chains[name]; !ok {
		if r.rs.DenyIDs == nil {
			r.rs.DenyIDs = map[string]DenyInfo{}
		}
		r.rs.DenyIDs[id] = info
		place := from.place
		place.deny = true
		r.addChain(&Chain{Chain: knftables.Chain{Name: name, Comment: truncComment("logs and drops: " + info.String())}, place: place,
			Rules: []TableRule{
				// The limits chain drops, unlogged, what exceeds its
				// source's or the overall budget; the rest is logged. The
				// counters tell all dropped packets from logged ones.
				mkRule(nil, counted(jump(ChainDenyLogLimits)), ""),
				mkRule([]RuleExpr{counter(), logTo(id, r.cfg.DenyLogGroup)}, ruleEnd{}, ""),
				mkRule(nil, plain(drop()), ""),
			}})
	}
	return gotoV(name)
}

// validateDenyLog checks the deny log settings of a configuration.
func (c *RenderConfig) validateDenyLog() error {
	if c.DenyLogGroup == 0 {
		return nil
	}
	if c.DenyLogRate == 0 || c.DenyLogBurst == 0 {
		return fmt.Errorf("deny log rate %d/second burst %d: both must be positive", c.DenyLogRate, c.DenyLogBurst)
	}
	return nil
}
