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
// Learning: in hybrid and queue modes, the DNS traffic of local pods that a
// rule with domainNames applies to ("fqdn-pods-v4/-v6") goes to the chain
// "dns-replies", which queues it to its own NFQUEUE
// (RenderConfig.DNSQueueNum), read by one reader (pkg/fqdn):
//
//   - the pods' queries (UDP or TCP to port 53, the original direction, to
//     any server): the learner records each (addresses, ports, ID,
//     question) and accepts it. They are captured in the base chains
//     "dns-queries-forward" (a server beyond the node, or a pod) and
//     "dns-queries-input" (a server on the node's network), at a priority
//     after the policy's chains: only a query the policy let through is
//     queued, and the verdict NF_ACCEPT then ends nothing but that chain.
//   - the replies (port 53, the reply direction): UDP replies, and every
//     segment of a TCP connection from the server (its SYN-ACK starts the
//     learner's reassembly, FIN and RST end it, data segments are read in
//     sequence order). They are captured first in forward and in output (a
//     DNS server on the node's network), before "ct state
//     established,related accept": replies are established. The learner
//     writes the answers of a reply that answers an outstanding query and
//     only then accepts it, so the pod cannot connect before the kernel
//     knows the address.
//
// Each pod gets a bounded share of that one queue (ChainDNSQueryShare,
// ChainDNSReplyShare, render_share.go): one pod flooding queries cannot
// fill it and starve every other pod's lookups.
//
// The pod's queries on a TCP connection are captured too (all its
// segments but the SYN), so the learner reads both streams. One queue, one
// reader: a query is always read before its reply can exist. In kernel
// mode nothing is queued and the sets stay empty: domainNames peers match
// nothing.

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

// dnsQueueRule is the counted queue rule of the dns-replies chain.
func dnsQueueRule(cfg RenderConfig) TableRule {
	return mkRule([]RuleExpr{counter(), nftOnly(QueueStatement(cfg.DNSQueueNum, 1, cfg.FailOpen, false))}, ruleEnd{}, "")
}

// fqdnPeer is matchRules' peer alternative for a rule's domainNames: the
// rule's learned set of the family, owned by its chain c. Only egress rules
// have them ("" for none).
func (r *renderer) fqdnPeer(c *Chain, m *Match, base, comment string, d Direction, v4 bool) []RuleExpr {
	if len(m.Domains) == 0 || d != Egress {
		return nil
	}
	name := fqdnSetName(base, m.Domains, v4)
	r.addSet(&Set{Dynamic: true, owner: c.Chain.Name, Key: []KeyKind{addrKind(v4), addrKind(v4)}, Set: &knftables.Set{Name: name, Flags: []knftables.SetFlag{knftables.TimeoutFlag},
		Comment: truncComment(comment + " pod . address it resolved (learned, TTL) for " + domainsKey(m.Domains))}})
	return []RuleExpr{lookup(name, addrField(v4, "saddr"), addrField(v4, "daddr"))}
}

// dnsQueryPriority is the priority of the query capture chains: right
// after the policy's base chains (filterPriority), so a query reaches them
// only once the policy accepted it.
const dnsQueryPriority = "filter - 4"

// dnsCapture renders the DNS learning objects when some local pod has an
// egress rule with domainNames peers. The base chains output,
// dns-queries-forward and dns-queries-input exist whenever the agent
// learns DNS, empty while no pod needs them: the kernel drops every packet
// waiting in any queue of the namespace when a hook is removed, so the
// first or last domainNames policy of a node must not add or delete a base
// chain while connections and DNS packets are held. (The input base chain
// always exists: queries to the node's network add rules only.)
func (r *renderer) dnsCapture() {
	if !r.cfg.LearnsDNS() {
		return
	}
	r.output = &Chain{Chain: knftables.Chain{Name: ChainOutput,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.OutputHook), Priority: ptr(knftables.BaseChainPriority(filterPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("from this node: only DNS replies of a DNS server on the node's network to pods with domainNames rules")}}
	qfwd := &Chain{Chain: knftables.Chain{Name: ChainDNSQueriesForward,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.ForwardHook), Priority: ptr(knftables.BaseChainPriority(dnsQueryPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("DNS queries of pods with domainNames rules, after the policy accepted them: recorded before they leave")}}
	qin := &Chain{Chain: knftables.Chain{Name: ChainDNSQueriesInput,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.InputHook), Priority: ptr(knftables.BaseChainPriority(dnsQueryPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("DNS queries of pods with domainNames rules to the node's network, after the policy accepted them")}}
	r.dnsQueries = []*Chain{qfwd, qin}
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
		r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: fqdnPodsSet(v4),
			Comment: ptr("local pods with domainNames egress rules: their DNS replies are learned")}})
	}
	c := &Chain{Chain: knftables.Chain{Name: ChainDNS,
		Comment: ptr(fmt.Sprintf("DNS queries and replies held in NFQUEUE %d: queries recorded, replies learned (%s)", r.cfg.DNSQueueNum, r.cfg.QueueVariant))}}
	if r.cfg.QueueVariant == QueueXTCompat {
		c.External = true
	} else {
		c.Rules = []TableRule{dnsQueueRule(r.cfg)}
	}
	r.addChain(c)
	r.dnsShareChains()
	var capture, queries []TableRule
	for _, v4 := range []bool{true, false} {
		for _, l4 := range []string{"udp sport 53", "tcp sport 53"} {
			capture = append(capture, mkRule([]RuleExpr{lookup(fqdnPodsSet(v4), addrField(v4, "daddr")), nftOnly(l4 + " ct state established ct direction reply")},
				plain(gotoV(ChainDNSReplyShare)), "DNS reply to a pod with domainNames rules: learn it first"))
		}
		for _, l4 := range []string{"udp dport 53", "tcp dport 53 tcp flags & syn == 0"} {
			queries = append(queries, mkRule([]RuleExpr{lookup(fqdnPodsSet(v4), addrField(v4, "saddr")), nftOnly(l4 + " ct direction original")},
				plain(gotoV(ChainDNSQueryShare)), "DNS query of a pod with domainNames rules: only its replies are learned"))
		}
	}
	r.forward.Rules = append(append([]TableRule(nil), capture...), r.forward.Rules...)
	r.output.Rules = capture
	qfwd.Rules = queries
	qin.Rules = queries
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
func (r *renderer) fqdnPodElements(pod *Pod, pt *podText, emit func(set string, e Element)) {
	if !r.fqdnSubject(pod) {
		return
	}
	for _, ip := range pod.IPs {
		emit(fqdnPodsSet(ip.Is4()), AddrElement(ip, pt.comment))
	}
}
