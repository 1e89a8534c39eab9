package compile

import (
	"fmt"

	"sigs.k8s.io/knftables"
)

// How domainNames peers reach the kernel.
//
// The kernel cannot see names, only the addresses a pod's DNS lookups
// returned. Each egress rule with domainNames peers gets one set per family,
// "<policy chain>-<rule>-fqdn-<names hash>-v4" typed "ipv4_addr . ipv4_addr"
// with timeouts: "pod address . learned address". The rule matches
// "ip saddr . ip daddr @set", so a pod reaches only what it resolved itself,
// and pod churn changes elements, never rules. The agent's DNS learner
// (pkg/fqdn) owns these elements: the desired ruleset never lists any
// (Set.Dynamic), and syncs never rewrite them. An element expires with the
// answer's TTL; established connections stay accepted by conntrack (the
// revoker cuts those a change denies, pkg/conntrack). The set is named
// after the rule's names too (fqdnSetName): a change of the names replaces
// it, and with it what was learned for names the rule no longer has.
//
// Learning: in hybrid and queue modes, DNS replies (source port 53, a reply
// of a connection the pod opened) to a local pod that a rule with
// domainNames applies to ("fqdn-pods-v4/-v6") go to the chain "dns-replies",
// which queues them to their own NFQUEUE (RenderConfig.DNSQueueNum). The
// learner writes the answers' elements and only then accepts the reply, so
// the pod cannot connect before the kernel knows the address. The capture
// rules come first in forward (a DNS server pod, or one beyond the node)
// and in output (a DNS server on the node's network), before
// "ct state established,related accept": replies are established. In kernel
// mode nothing is queued and the sets stay empty: domainNames peers match
// nothing.

// Names of the DNS learning objects.
const (
	ChainDNS    = "dns-replies"
	ChainOutput = "output"
	// SetFQDNPodsV4 and SetFQDNPodsV6 hold the local pods whose DNS replies
	// are learned.
	SetFQDNPodsV4 = "fqdn-pods-v4"
	SetFQDNPodsV6 = "fqdn-pods-v6"
)

// LearnsDNS reports whether the ruleset queues DNS replies for domainNames
// peers: in hybrid and queue modes, unless NoDNSLearning.
func (c *RenderConfig) LearnsDNS() bool { return c.Mode != ModeKernel && !c.NoDNSLearning }

func (c *RenderConfig) dnsDefaults() {
	if c.DNSQueueNum == 0 {
		// After the connection queues and their alternate range (the
		// agent's queue hand-over on updates).
		c.DNSQueueNum = uint16(min(uint32(c.QueueNum)+2*uint32(c.Queues), 0xffff))
	}
}

func (c *RenderConfig) validateDNSQueue() error {
	if c.DNSQueueNum >= c.QueueNum && uint32(c.DNSQueueNum) < uint32(c.QueueNum)+uint32(c.Queues) {
		return fmt.Errorf("DNS queue %d is one of the connection queues %s", c.DNSQueueNum, QueueRange(c.QueueNum, c.Queues))
	}
	return nil
}

// DNSQueueStatement is the counted queue statement of the dns-replies chain.
func DNSQueueStatement(cfg RenderConfig) string {
	return "counter " + QueueStatement(cfg.DNSQueueNum, 1, cfg.FailOpen, false)
}

// fqdnPeer is matchRules' peer alternative for a rule's domainNames: the
// rule's learned set of the family. Only egress rules have them.
func (r *renderer) fqdnPeer(m *Match, base, comment string, d Direction, v4 bool) []string {
	if len(m.Domains) == 0 || d != Egress {
		return nil
	}
	name := fqdnSetName(base, m.Domains, v4)
	t := addrType(v4) + " . " + addrType(v4)
	r.addSet(&Set{Dynamic: true, Set: &knftables.Set{Name: name, Type: t, Flags: []knftables.SetFlag{knftables.TimeoutFlag},
		Comment: truncComment(comment + " pod . address it resolved (learned, TTL) for " + domainsKey(m.Domains))}})
	return []string{fmt.Sprintf("%s saddr . %s daddr @%s ", famWord(v4), famWord(v4), name)}
}

// dnsCapture renders the DNS learning objects when some local pod has an
// egress rule with domainNames peers. The output base chain exists whenever
// the agent learns DNS, empty while no pod needs it: the kernel drops every
// packet waiting in any queue of the namespace when a hook is removed, so
// the first or last domainNames policy of a node must not add or delete a
// base chain while connections and DNS replies are held.
func (r *renderer) dnsCapture() {
	if !r.cfg.LearnsDNS() {
		return
	}
	r.output = &Chain{Chain: knftables.Chain{Name: ChainOutput,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.OutputHook), Priority: ptr(knftables.BaseChainPriority(filterPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("from this node: only DNS replies of a DNS server on the node's network to pods with domainNames rules")}}
	rules := r.prog.FQDNRules()
	seen := map[PodID]bool{}
	var pods []PodID
	for _, fr := range rules {
		for _, pid := range fr.Subjects {
			if !seen[pid] && r.prog.Pods[pid].Local {
				seen[pid] = true
				pods = append(pods, pid)
			}
		}
	}
	if len(pods) == 0 {
		return
	}
	r.fqdnPolicies = map[ClusterPolicyID]bool{}
	for _, fr := range rules {
		r.fqdnPolicies[fr.Policy] = true
	}
	// Created empty: podElements fills them (fqdnPodElements).
	for _, v4 := range []bool{true, false} {
		r.addSet(&Set{Set: &knftables.Set{Name: fqdnPodsSet(v4), Type: addrType(v4),
			Comment: ptr("local pods with domainNames egress rules: their DNS replies are learned")}})
	}
	c := &Chain{Chain: knftables.Chain{Name: ChainDNS,
		Comment: ptr(fmt.Sprintf("DNS replies held in NFQUEUE %d until their answers are learned (%s)", r.cfg.DNSQueueNum, r.cfg.QueueVariant))}}
	if r.cfg.QueueVariant == QueueXTCompat {
		c.External = true
	} else {
		c.Rules = []knftables.Rule{rule(DNSQueueStatement(r.cfg), "")}
	}
	r.addChain(c)
	var capture []knftables.Rule
	for _, v4 := range []bool{true, false} {
		for _, l4 := range []string{"udp sport 53", "tcp sport 53 tcp flags & (syn | rst) == 0"} {
			capture = append(capture, rule(fmt.Sprintf("%s daddr @%s %s ct state established ct direction reply goto %s", famWord(v4), fqdnPodsSet(v4), l4, ChainDNS),
				"DNS reply to a pod with domainNames rules: learn it first"))
		}
	}
	r.forward.Rules = append(append([]knftables.Rule(nil), capture...), r.forward.Rules...)
	r.output.Rules = capture
}

// fqdnSubject reports whether a local pod is a subject of a
// ClusterNetworkPolicy with domainNames egress rules (fqdnPolicies, set by
// dnsCapture).
func (r *renderer) fqdnSubject(pod *Pod) bool {
	if !pod.Local || len(r.fqdnPolicies) == 0 {
		return false
	}
	for _, ids := range [][]ClusterPolicyID{pod.AdminEgress, pod.BaselineEgress} {
		for _, id := range ids {
			if r.fqdnPolicies[id] {
				return true
			}
		}
	}
	return false
}

// fqdnPodElements adds a pod with domainNames egress rules to the set whose
// DNS replies are captured.
func (r *renderer) fqdnPodElements(pod *Pod, pt *podText, emit func(set string, e knftables.Element)) {
	if !r.fqdnSubject(pod) {
		return
	}
	for i, ip := range pod.IPs {
		emit(fqdnPodsSet(ip.Is4()), knftables.Element{Key: pt.addrKey(i), Comment: pt.comment})
	}
}

func fqdnPodsSet(v4 bool) string {
	if v4 {
		return SetFQDNPodsV4
	}
	return SetFQDNPodsV6
}
