package compile

import (
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"
)

// Runtime verification: with VerifyConfig.Group set, every rule of the
// kernel path that decides a new connection in one direction (a
// NetworkPolicy or ClusterNetworkPolicy rule, a NetworkPolicy default deny,
// the default allow when no policy decides, a pod's own node) is preceded
// by a sampled copy of itself: the same matches and verdict, behind
// `numgen random` (the sampling fraction) and a per-source meter, with an
// NFLOG statement whose prefix is a short id of that decision. The agent
// reads the group and decides each sampled connection again with the
// evaluator; the id says which rule of the kernel decided.
//
// The copy comes first and draws a new random number at each rule it is
// met, so the connection decided by a rule is sampled there with the
// configured probability; a packet the sample skips, or over its source's
// share, goes on to the original rule unlogged. Traffic that no policy
// selects is sampled too, at the default allow, so a pod missing from a
// dispatch map (the kernel lets it through, the model isolates it) shows.
// With Group 0 nothing is rendered and the ruleset is unchanged.

// Kinds of decision a VerifyInfo describes, besides DenyKindNetworkPolicy
// and DenyKindClusterNetworkPolicy (a policy's rule or default deny).
const (
	// VerifyKindDefault: no policy decided the direction; allowed.
	VerifyKindDefault = "default"
	// VerifyKindNode: a NetworkPolicy egress subject's traffic to its own
	// node, never isolated.
	VerifyKindNode = "node"
)

// VerifyPerMillion is the scale of VerifyConfig.PerMillion.
const VerifyPerMillion = 1_000_000

// Defaults of the kernel's per-source limit on verification samples.
const (
	DefaultVerifySourceRate  = 20
	DefaultVerifySourceBurst = 40
)

// VerifyConfig configures runtime verification's sampling (RenderConfig.Verify).
type VerifyConfig struct {
	// Group is the NFLOG group samples go to (0: no verification).
	Group uint16
	// PerMillion is the fraction of decisions sampled, in millionths
	// (VerifyPerMillion: every one).
	PerMillion uint32
	// SourceRate and SourceBurst bound the samples of one source address,
	// per second: a source cannot make the agent decide its every packet.
	SourceRate, SourceBurst uint32
}

// Enabled reports whether the ruleset samples decisions.
func (c *VerifyConfig) Enabled() bool { return c.Group != 0 && c.PerMillion != 0 }

func (c *VerifyConfig) defaults() {
	if !c.Enabled() {
		return
	}
	if c.SourceRate == 0 {
		c.SourceRate = DefaultVerifySourceRate
	}
	if c.SourceBurst == 0 {
		c.SourceBurst = DefaultVerifySourceBurst
	}
}

// validate checks the verification settings of a configuration.
func (c *RenderConfig) validateVerify() error {
	v := &c.Verify
	if !v.Enabled() {
		return nil
	}
	if c.Mode == ModeQueue {
		return errors.New("runtime verification samples the kernel's verdicts: queue mode has none (the evaluator decides)")
	}
	if v.PerMillion > VerifyPerMillion {
		return fmt.Errorf("verification sampling %d per million: at most %d", v.PerMillion, VerifyPerMillion)
	}
	if v.SourceRate == 0 || v.SourceBurst == 0 {
		return fmt.Errorf("verification samples per source: rate %d/second burst %d: both must be positive", v.SourceRate, v.SourceBurst)
	}
	if v.Group == c.DenyLogGroup {
		return fmt.Errorf("verification NFLOG group %d is the deny log's", v.Group)
	}
	return nil
}

// VerifyInfo says which decision of the kernel a sample comes from.
type VerifyInfo struct {
	// Allow is the kernel's verdict for the direction.
	Allow     bool
	Direction Direction
	// Kind is DenyKindNetworkPolicy, DenyKindClusterNetworkPolicy,
	// VerifyKindDefault or VerifyKindNode.
	Kind string
	// Policy names the policy: a NetworkPolicy's key, a
	// ClusterNetworkPolicy's name, or for a NetworkPolicy default deny the
	// isolating policies' keys joined by ", ".
	Policy string
	// Tier is the ClusterNetworkPolicy's tier (0 for NetworkPolicy).
	Tier Tier
	// Rule is the rule's name (a NetworkPolicy's "ns/name ingress[i]"), or
	// DenyRuleDefault.
	Rule string
}

// ID is the decision's log prefix: "v" and a hash of what it describes,
// the same in every program that has the decision.
func (v VerifyInfo) ID() string {
	return "v" + shortHash(strings.Join([]string{v.Verdict(), v.Kind, v.Tier.String(), v.Policy, v.Direction.String(), v.Rule}, "\x00"))
}

// IsVerifyID reports whether a log prefix is a sample's (ID), not a
// denial's (DenyInfo.ID): readers of the ruleset tell the sampled copy of
// a rule from a deny chain's log by it.
func IsVerifyID(prefix string) bool { return strings.HasPrefix(prefix, "v") }

// Verdict is "allow" or "deny".
func (v VerifyInfo) Verdict() string {
	if v.Allow {
		return "allow"
	}
	return "deny"
}

// String reads e.g. "allow ingress by NetworkPolicy x/allow-web ingress[0]",
// "deny egress by ClusterNetworkPolicy no-y (Admin) rule no-y", "allow
// ingress by default (no policy decides)".
func (v VerifyInfo) String() string {
	head := v.Verdict() + " " + v.Direction.String()
	switch v.Kind {
	case VerifyKindDefault:
		return head + " by default (no policy decides)"
	case VerifyKindNode:
		return head + " to the pod's own node"
	case DenyKindClusterNetworkPolicy:
		return fmt.Sprintf("%s by %s %s (%s) rule %s", head, v.Kind, v.Policy, v.Tier, v.Rule)
	}
	if v.Rule == DenyRuleDefault {
		return fmt.Sprintf("%s by %s %s %s", head, v.Kind, v.Policy, v.Rule)
	}
	return fmt.Sprintf("%s by %s %s", head, v.Kind, v.Rule)
}

func verifyOfDeny(d DenyInfo) VerifyInfo {
	return VerifyInfo{Direction: d.Direction, Kind: d.Kind, Policy: d.Policy, Tier: d.Tier, Rule: d.Rule}
}

func verifyOfRule(pol *Policy, rl *Rule) VerifyInfo {
	return VerifyInfo{Allow: true, Direction: rl.Direction, Kind: DenyKindNetworkPolicy, Policy: pol.Key, Rule: rl.Name}
}

func verifyOfClusterRule(cp *ClusterPolicy, rl *ClusterRule) VerifyInfo {
	return VerifyInfo{Allow: rl.Action != ActionDeny, Direction: rl.Direction, Kind: DenyKindClusterNetworkPolicy, Policy: cp.Name, Tier: cp.Tier, Rule: rl.Name}
}

func verifyDefault(d Direction) VerifyInfo {
	return VerifyInfo{Allow: true, Direction: d, Kind: VerifyKindDefault}
}

var verifyNode = VerifyInfo{Allow: true, Direction: Egress, Kind: VerifyKindNode}

// VerifyIDs lists every decision the kernel ruleset of the program can
// sample, by id, computed without rendering (a superset: every rule of
// every policy, not only those of local pods), for the reader of the
// samples, which holds only the program.
func VerifyIDs(p *Program) map[string]VerifyInfo {
	out := map[string]VerifyInfo{}
	add := func(v VerifyInfo) { out[v.ID()] = v }
	for _, d := range DenyIDs(p) {
		add(verifyOfDeny(d))
	}
	for _, d := range []Direction{Ingress, Egress} {
		add(verifyDefault(d))
		for i := range p.Policies {
			pol := &p.Policies[i]
			for ri := range pol.Rules(d) {
				add(verifyOfRule(pol, &pol.Rules(d)[ri]))
			}
		}
		for i := range p.ClusterPolicies {
			cp := &p.ClusterPolicies[i]
			for ri := range cp.Rules(d) {
				add(verifyOfClusterRule(cp, &cp.Rules(d)[ri]))
			}
		}
	}
	add(verifyNode)
	return out
}

// verifyMeters renders the per-source meters of the samples.
func (r *renderer) verifyMeters() {
	v := &r.cfg.Verify
	if !v.Enabled() {
		return
	}
	for _, v4 := range []bool{true, false} {
		r.addSet(&Set{Dynamic: true, Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: meterSetName(meterVerify, true, v4),
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Size: ptr(uint64(sourceSetSize)), Timeout: ptr(sourceSetTimeout),
			Comment: ptr(fmt.Sprintf("per source address: %d verification samples/second, burst %d (written by the sampled copies of deciding rules)", v.SourceRate, v.SourceBurst))}})
	}
}

// sampledRules are the sampled copies of a deciding rule made of matches
// and end, belonging to owner, for the families listed: nil with
// verification off.
func (r *renderer) sampledRules(matches []RuleExpr, end ruleEnd, comment string, info VerifyInfo, owner RuleOwner, fams ...bool) []TableRule {
	v := &r.cfg.Verify
	if !v.Enabled() {
		return nil
	}
	var out []TableRule
	for _, v4 := range fams {
		pre := []RuleExpr{{Kind: ExprNfproto, V4: v4}}
		if v.PerMillion < VerifyPerMillion {
			pre = append(pre, RuleExpr{Kind: ExprNumgen, Mod: VerifyPerMillion, Below: v.PerMillion})
		}
		pre = append(append(pre, matches...),
			meter(meterSetName(meterVerify, true, v4), addrField(v4, "saddr"), v.SourceRate, v.SourceBurst, false),
			logTo(info.ID(), v.Group))
		rl := mkRule(pre, end, comment)
		rl.Owner = owner
		out = append(out, rl)
	}
	return out
}

// withSamples returns a deciding rule of both families (matches without
// an address) preceded by its sampled copies.
func (r *renderer) withSamples(matches []RuleExpr, end ruleEnd, comment string, info VerifyInfo, owner RuleOwner) []TableRule {
	rl := mkRule(matches, end, comment)
	rl.Owner = owner
	return append(r.sampledRules(matches, end, comment, info, owner, true, false), rl)
}
