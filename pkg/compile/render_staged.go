package compile

import (
	"fmt"

	"sigs.k8s.io/knftables"
)

// The staged log: with RenderConfig.StagedLogGroup set and at least one
// local pod that a staged policy selects (Pod.StagedSubject), the forward
// chain copies the first packet of every new connection from a staged
// egress subject or to a staged ingress subject to that NFLOG group, and
// the input chain those of staged egress subjects to the node. The copy
// changes nothing: the rule jumps to ChainStagedLog, which logs and
// returns, and the connection goes on to the policies in force. The agent
// (pkg/staged) decides the copy under the enforced and the staged program
// and logs the connections whose verdict would change. Connections
// between pods no staged policy selects never match these rules; with no
// staged policy on the node nothing of this is rendered.
//
// The copies are rate limited per source address in the kernel, as the
// deny log's messages are (render_share.go): one pod opening connections
// fast cannot spend another's share; and overall, so that many sources
// together send the agent a bounded number of copies. Over either limit a
// packet is not copied, and still passes on to its verdict.

// Defaults of the staged log's limits: the deny log's (render_share.go
// explains them).
const (
	DefaultStagedLogRate       = DefaultDenyLogRate
	DefaultStagedLogBurst      = DefaultDenyLogBurst
	DefaultStagedLogTotalRate  = DefaultDenyLogTotalRate
	DefaultStagedLogTotalBurst = DefaultDenyLogTotalBurst
)

// StagedLogPrefix is the log prefix of the staged log's messages.
const StagedLogPrefix = "staged"

// stagedLogOn reports whether the ruleset has the staged log: it is on and
// a local pod is a staged subject.
func (r *renderer) stagedLogOn() bool {
	if r.cfg.StagedLogGroup == 0 {
		return false
	}
	for i := range r.prog.Pods {
		if stagedLocal(&r.prog.Pods[i]) {
			return true
		}
	}
	return false
}

// stagedLog renders the staged log's sets and chain, and returns the rules
// of the forward and input chains that jump to it (none when it is off).
func (r *renderer) stagedLog() (forward, input []TableRule) {
	if !r.stagedLogOn() {
		return nil, nil
	}
	for _, v4 := range []bool{true, false} {
		for _, d := range []Direction{Ingress, Egress} {
			r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: stagedSubjectsSetName(d, v4),
				Comment: ptr("local pods a staged policy selects for " + d.String() + ": their new connections are copied to the staged log")}})
		}
	}
	c := r.addrLimitChainOver(ChainStagedLog, meterStaged, true, r.cfg.StagedLogRate, r.cfg.StagedLogBurst, RuleVerdict{}, returnV(),
		"staged log: copies first packets to NFLOG within per-source and overall budgets; never decides")
	c.Rules = append(c.Rules, mkRule([]RuleExpr{limitOver(r.cfg.StagedLogTotalRate, r.cfg.StagedLogTotalBurst)}, counted(returnV()),
		"over the overall staged log budget"))
	c.Rules = append(c.Rules, mkRule([]RuleExpr{counter(), logTo(StagedLogPrefix, r.cfg.StagedLogGroup)}, ruleEnd{}, ""))
	for _, v4 := range []bool{true, false} {
		src, dst := addrField(v4, "saddr"), addrField(v4, "daddr")
		eg, in := stagedSubjectsSetName(Egress, v4), stagedSubjectsSetName(Ingress, v4)
		toLog := plain(jump(ChainStagedLog))
		forward = append(forward,
			mkRule([]RuleExpr{lookup(eg, src)}, toLog, "from a staged egress subject"),
			// Once per connection: a connection between two subjects
			// was copied by the rule before.
			mkRule([]RuleExpr{lookup(in, dst), notIn(eg, src)}, toLog, "to a staged ingress subject"))
		input = append(input, mkRule([]RuleExpr{lookup(eg, src)}, toLog, "from a staged egress subject to this node"))
	}
	return forward, input
}

// stagedElements emits a local pod's staged subject elements, when the
// ruleset has the staged log.
func (r *renderer) stagedElements(pod *Pod, pt *podText, emit func(set string, e Element)) {
	for _, d := range []Direction{Ingress, Egress} {
		if !pod.StagedSubject[d] {
			continue
		}
		for _, ip := range pod.IPs {
			if name := stagedSubjectsSetName(d, ip.Is4()); r.rs.Sets[name] != nil {
				emit(name, AddrElement(ip, pt.comment))
			}
		}
	}
}

// validateStagedLog checks the staged log's settings.
func (c *RenderConfig) validateStagedLog() error {
	if c.StagedLogGroup == 0 {
		return nil
	}
	if c.StagedLogRate == 0 || c.StagedLogBurst == 0 || c.StagedLogTotalRate == 0 || c.StagedLogTotalBurst == 0 {
		return fmt.Errorf("staged log rate %d/second burst %d, overall %d/second burst %d: all must be positive",
			c.StagedLogRate, c.StagedLogBurst, c.StagedLogTotalRate, c.StagedLogTotalBurst)
	}
	if c.StagedLogGroup == c.DenyLogGroup {
		return fmt.Errorf("staged log group %d is the deny log's", c.StagedLogGroup)
	}
	if c.StagedLogGroup == c.Verify.Group {
		return fmt.Errorf("staged log group %d is runtime verification's", c.StagedLogGroup)
	}
	return nil
}

// stagedLogDefaults fills the staged log's unset limits.
func (c *RenderConfig) stagedLogDefaults() {
	if c.StagedLogGroup == 0 {
		return
	}
	for _, l := range []struct {
		v *uint32
		d uint32
	}{
		{&c.StagedLogRate, DefaultStagedLogRate}, {&c.StagedLogBurst, DefaultStagedLogBurst},
		{&c.StagedLogTotalRate, DefaultStagedLogTotalRate}, {&c.StagedLogTotalBurst, DefaultStagedLogTotalBurst},
	} {
		if *l.v == 0 {
			*l.v = l.d
		}
	}
}
