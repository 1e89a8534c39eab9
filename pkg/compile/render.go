package compile

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

func ptr[T any](v T) *T { return &v }

// truncComment keeps comments within nftables' limit.
func truncComment(s string) *string {
	s = truncText(s)
	return &s
}

func truncText(s string) string {
	if len(s) > knftables.CommentLengthMax {
		s = s[:knftables.CommentLengthMax-3] + "..."
	}
	return s
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(h[:])[:8])
}

// policyRef is a policy's readable part of object names: "ns/name",
// shortened with a hash when long.
func policyRef(p *Policy) string {
	ref := p.Key
	if len(ref) > maxPolicyRefChars {
		ref = ref[:maxPolicyRefChars-9] + "_" + shortHash(p.Key)
	}
	return ref
}

// PolicyChainName is the chain holding a policy's rules in one direction.
func PolicyChainName(p *Policy, d Direction) string { return d.String() + "-" + policyRef(p) }

// IsolationChainName is the chain for the pods isolated by exactly this
// combination of policies in one direction.
func IsolationChainName(p *Program, d Direction, ids []PolicyID) string {
	return d.String() + "-isolated-" + shortHash(comboKey(p, ids))
}

func comboKey(p *Program, ids []PolicyID) string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = p.Policies[id].Key
	}
	return strings.Join(keys, ",")
}

func famSuffix(v4 bool) string {
	if v4 {
		return "-v4"
	}
	return "-v6"
}

func famWord(v4 bool) string {
	if v4 {
		return "ip"
	}
	return "ip6"
}

func addrType(v4 bool) string {
	if v4 {
		return "ipv4_addr"
	}
	return "ipv6_addr"
}

type renderer struct {
	prog           *Program
	cfg            RenderConfig
	rs             *Ruleset
	forward, input *Chain
	// output exists only to hold DNS learning's capture rules.
	output *Chain
	// prerouting holds the source-address validation (render_source.go).
	prerouting *Chain
	// dnsQueries are the base chains that capture DNS queries after the
	// policy accepted them (render_fqdn.go).
	dnsQueries []*Chain
	// named lists the named-port sets (by base name, in namedBases), whose
	// elements come from the pods they resolve on.
	named      []namedPortUser
	namedBases map[string]bool
	// combos lists the ClusterNetworkPolicy combination chains with a
	// tier-skip set, whose elements come from their rules' peers.
	combos []comboSet
	// fqdnPolicies are the ClusterNetworkPolicies with domainNames egress
	// rules and local subjects (nil when DNS is not learned).
	fqdnPolicies map[ClusterPolicyID]bool
	// peerSets names the peer sets rendered, by selector (podElements).
	peerSets peerSetNames
	// addrs, when set, lists a selector's member addresses for the
	// tier-skip sets instead of the program's members: a Tracker's
	// members are its tracked pods (tracker_cluster.go).
	addrs func(SelectorID, func(netip.Addr))
	// full is set while a full render emits every pod's elements
	// (render_elements.go).
	full *fullRender
}

// subjectOfPolicy reports whether a pod is isolated by NetworkPolicy id in
// direction d: the subjects of the policy's chain in that direction.
func subjectOfPolicy(id PolicyID, d Direction) func(*Pod) bool {
	return func(p *Pod) bool { return slices.Contains(p.Policies(d), id) }
}

// Render turns a program into the desired ruleset of the nftpolicy table.
// It is pure: the same program and config give the same ruleset.
func Render(prog *Program, cfg RenderConfig) (*Ruleset, error) {
	r, err := newRenderer(prog, cfg)
	if err != nil {
		return nil, err
	}
	r.render()
	return r.rs, nil
}

func newRenderer(prog *Program, cfg RenderConfig) (*renderer, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &renderer{prog: prog, cfg: cfg, rs: &Ruleset{
		Table:  knftables.Table{Comment: ptr(fmt.Sprintf("nftpolicy: network policy enforcement, NetworkPolicy and ClusterNetworkPolicy (mode %s)", cfg.Mode))},
		Chains: map[string]*Chain{},
		Sets:   map[string]*Set{},
	}}, nil
}

func (r *renderer) render() {
	r.static()
	r.denyLogLimits()
	if r.cfg.Mode == ModeQueue {
		r.queueDispatch()
	} else {
		r.kernelDispatch()
	}
	r.dnsCapture()
	r.sourceValidation()
	// Every set and map exists now: the pods' elements.
	r.allPodElements()
	// Base chains last: everything they reference exists by then.
	r.addChain(r.input)
	r.addChain(r.forward)
	if r.output != nil {
		r.addChain(r.output)
	}
	if r.prerouting != nil {
		r.addChain(r.prerouting)
	}
	for _, c := range r.dnsQueries {
		r.addChain(c)
	}
	var so elementSorter
	for _, s := range r.rs.Sets {
		s.Elements = so.sort(s.Elements)
	}
}

func (r *renderer) addChain(c *Chain) {
	if _, ok := r.rs.Chains[c.Chain.Name]; ok {
		return
	}
	r.rs.Chains[c.Chain.Name] = c
	r.rs.ChainOrder = append(r.rs.ChainOrder, c.Chain.Name)
}

func (r *renderer) addSet(s *Set) *Set {
	if old, ok := r.rs.Sets[s.Name()]; ok {
		return old
	}
	r.rs.Sets[s.Name()] = s
	return s
}

func rule(text, comment string) knftables.Rule {
	kr := knftables.Rule{Rule: text}
	if comment != "" {
		kr.Comment = truncComment(comment)
	}
	return kr
}

// tierChains names, per direction, the chains that dispatch new connections
// to each tier, in evaluation order, and where a connection goes when every
// tier let it through.
type tierChains struct {
	entry, networkPolicy, baseline, allowed string
	// addr is the address the direction dispatches on: the local pod's.
	addr string
}

func tiers(d Direction) tierChains {
	if d == Egress {
		return tierChains{entry: ChainEgress, networkPolicy: "egress-networkpolicy", baseline: "egress-baseline",
			allowed: "goto " + ChainEgressAllow, addr: "saddr"}
	}
	return tierChains{entry: ChainIngress, networkPolicy: "ingress-networkpolicy", baseline: "ingress-baseline",
		allowed: "accept", addr: "daddr"}
}

// Map names of one direction's dispatch: pod IP -> the chain deciding its
// new connections in a tier. The NetworkPolicy maps keep their names.
func tierMap(t Tier, d Direction, v4 bool) string { return tierMapPrefix(t, d) + famSuffix(v4) }

func tierMapPrefix(t Tier, d Direction) string {
	switch t {
	case TierAdmin:
		return d.String() + "-admin-pods"
	case TierBaseline:
		return d.String() + "-baseline-pods"
	}
	return d.String() + "-pods"
}

// clusterEgressSet holds the local pods with ClusterNetworkPolicy egress
// rules: only their traffic to the node itself is filtered (input hook).
func clusterEgressSet(v4 bool) string { return "cluster-egress-pods" + famSuffix(v4) }

func (r *renderer) static() {
	kernel := r.cfg.Mode != ModeQueue
	for _, v4 := range []bool{true, false} {
		for _, d := range []Direction{Egress, Ingress} {
			r.addSet(&Set{Map: &knftables.Map{Name: tierMap(0, d, v4), Type: addrType(v4) + " : verdict",
				Comment: ptr("local pods isolated for " + d.String() + " by NetworkPolicies -> the chain that decides their new connections")}})
			if kernel {
				for _, t := range []Tier{TierAdmin, TierBaseline} {
					r.addSet(&Set{Map: &knftables.Map{Name: tierMap(t, d, v4), Type: addrType(v4) + " : verdict",
						Comment: ptr("local pods with " + t.String() + " ClusterNetworkPolicy " + d.String() + " rules -> their policies, in precedence order")}})
				}
			}
		}
		r.addSet(&Set{Set: &knftables.Set{Name: "self" + famSuffix(v4), Type: addrType(v4) + " . " + addrType(v4),
			Comment: ptr("local pods that policies select, twice: a pod can always reach itself")}})
		r.addSet(&Set{Set: &knftables.Set{Name: clusterEgressSet(v4), Type: addrType(v4),
			Comment: ptr("local pods with ClusterNetworkPolicy egress rules: their traffic to this node is decided too")}})
		if kernel {
			r.addSet(&Set{Set: &knftables.Set{Name: "node-ips" + famSuffix(v4), Type: addrType(v4),
				Comment: ptr("this node's addresses: NetworkPolicy never isolates a pod from its own node")}})
		}
	}
	for _, ip := range r.prog.NodeIPs {
		if kernel {
			s := r.rs.Sets["node-ips"+famSuffix(ip.Is4())]
			s.Elements = append(s.Elements, knftables.Element{Key: []string{ip.String()}})
		}
	}
	m := r.cfg.AllowMark
	// head is the start of both base chains: connections already decided.
	var head []knftables.Rule
	if r.cfg.UsesQueue() {
		head = append(head, rule(fmt.Sprintf("meta mark & %#08x == %#08x ct mark set ct mark | %#08x meta mark set meta mark & %#08x counter accept",
			m, m, m, ^m), "allowed by the userspace evaluator: remember it in the connection's mark"))
	}
	head = append(head, rule("ct state established,related accept", ""))
	if r.cfg.UsesQueue() {
		head = append(head, rule(fmt.Sprintf("ct mark & %#08x == %#08x accept", m, m), "connection allowed earlier by the userspace evaluator"))
	}
	nd := ndRule()
	fwd := append(append([]knftables.Rule(nil), head...), nd,
		rule("ip saddr . ip daddr @self-v4 accept", "a pod can always reach itself"),
		rule("ip6 saddr . ip6 daddr @self-v6 accept", "a pod can always reach itself"),
	)
	input := append(append([]knftables.Rule(nil), head...), nd)
	fwd = append(fwd, r.unknownPods()...)
	if kernel {
		fwd = append(fwd, rule("goto "+ChainEgress, ""))
		input = append(input,
			rule("ip saddr @"+clusterEgressSet(true)+" goto "+ChainEgress, ""),
			rule("ip6 saddr @"+clusterEgressSet(false)+" goto "+ChainEgress, ""))
		r.tierDispatch()
	} else {
		fwd = append(fwd,
			rule("ip saddr vmap @egress-pods-v4", ""),
			rule("ip6 saddr vmap @egress-pods-v6", ""),
			rule("ip daddr vmap @ingress-pods-v4", ""),
			rule("ip6 daddr vmap @ingress-pods-v6", ""))
		input = append(input,
			rule("ip saddr @"+clusterEgressSet(true)+" goto "+ChainQueueShare, ""),
			rule("ip6 saddr @"+clusterEgressSet(false)+" goto "+ChainQueueShare, ""))
		r.queueChain()
	}
	r.forward = &Chain{Chain: knftables.Chain{Name: ChainForward,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.ForwardHook), Priority: ptr(knftables.BaseChainPriority(filterPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("pod traffic after Service DNAT, before SNAT: new connections of local pods that policies select")}, Rules: fwd}
	r.input = &Chain{Chain: knftables.Chain{Name: ChainInput,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.InputHook), Priority: ptr(knftables.BaseChainPriority(filterPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("traffic to this node: only new connections of ClusterNetworkPolicy egress subjects")}, Rules: input}
}

// tierDispatch renders the static chains that run the tiers in order, per
// direction: Admin, NetworkPolicy, Baseline, then allowed. Every chain ends
// in a verdict or a goto, so a Pass can goto the next tier's chain from any
// depth.
func (r *renderer) tierDispatch() {
	for _, d := range []Direction{Egress, Ingress} {
		tc := tiers(d)
		chain := func(name, comment string, next string, maps ...string) {
			c := &Chain{Chain: knftables.Chain{Name: name, Comment: ptr(comment)}}
			for _, v4 := range []bool{true, false} {
				for _, m := range maps {
					c.Rules = append(c.Rules, rule(fmt.Sprintf("%s %s vmap @%s%s", famWord(v4), tc.addr, m, famSuffix(v4)), ""))
				}
			}
			c.Rules = append(c.Rules, rule(next, ""))
			r.addChain(c)
		}
		chain(tc.baseline, d.String()+" of local pods, tier 3: Baseline ClusterNetworkPolicies", tc.allowed, tierMapPrefix(TierBaseline, d))
		chain(tc.networkPolicy, d.String()+" of local pods, tier 2: NetworkPolicies (they decide for the pods they isolate)", "goto "+tc.baseline, tierMapPrefix(0, d))
		chain(tc.entry, "new connections "+map[Direction]string{Egress: "from", Ingress: "to"}[d]+" local pods, tier 1: Admin ClusterNetworkPolicies",
			"goto "+tc.networkPolicy, tierMapPrefix(TierAdmin, d))
	}
	r.addChain(&Chain{Chain: knftables.Chain{Name: ChainEgressAllow, Comment: ptr("egress allowed: the destination's ingress decides next")},
		Rules: []knftables.Rule{rule("goto "+ChainIngress, "")}})
}

// queueChain renders the chain that queues (ChainQueue) and, after it, the
// per-source share chains that lead to it.
func (r *renderer) queueChain() {
	if _, ok := r.rs.Chains[ChainQueue]; ok {
		return
	}
	c := &Chain{Chain: knftables.Chain{Name: ChainQueue,
		Comment: ptr(fmt.Sprintf("new connections decided by the userspace evaluator (NFQUEUE %s, %s)", QueueRange(r.cfg.QueueNum, r.cfg.Queues), r.cfg.QueueVariant))}}
	if r.cfg.QueueVariant == QueueXTCompat {
		c.External = true
	} else {
		c.Rules = []knftables.Rule{rule(NativeQueueStatement(r.cfg), "")}
	}
	r.addChain(c)
	r.queueShareChains()
}

// queueDispatch sends every new connection of a local pod that any policy
// selects in a direction to the userspace evaluator: the pods' elements
// in the dispatch maps are all there is.
func (r *renderer) queueDispatch() {}

// kernelDispatch renders what decides each local pod's new connections in
// each tier: per-policy chains, one chain per distinct combination of
// policies, and the pod's elements in the tier maps.
func (r *renderer) kernelDispatch() {
	// Which policies are used, per direction, and the distinct combinations.
	used := map[PolicyID][2]bool{}
	cused := map[ClusterPolicyID][2]bool{}
	type combo struct {
		d    Direction
		t    Tier // 0: NetworkPolicy
		ids  []PolicyID
		cids []ClusterPolicyID
	}
	combos := map[string]combo{}
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local {
			continue
		}
		for _, d := range []Direction{Ingress, Egress} {
			ids := pod.Policies(d)
			for _, id := range ids {
				u := used[id]
				u[d] = true
				used[id] = u
			}
			if len(ids) > 0 {
				combos[IsolationChainName(r.prog, d, ids)] = combo{d: d, ids: ids}
			}
			for _, t := range []Tier{TierAdmin, TierBaseline} {
				cids := pod.ClusterPolicies(t, d)
				for _, id := range cids {
					u := cused[id]
					u[d] = true
					cused[id] = u
				}
				if len(cids) > 0 {
					combos[ClusterComboChainName(r.prog, t, d, cids)] = combo{d: d, t: t, cids: cids}
				}
			}
		}
	}
	// Policy chains first, in policy order.
	hasRules := map[PolicyID][2]bool{}
	for id := range r.prog.Policies {
		u := used[PolicyID(id)]
		var h [2]bool
		for _, d := range []Direction{Ingress, Egress} {
			if u[d] {
				h[d] = r.policyChain(PolicyID(id), d)
			}
		}
		hasRules[PolicyID(id)] = h
	}
	chasRules := map[ClusterPolicyID][2]bool{}
	for id := range r.prog.ClusterPolicies {
		u := cused[ClusterPolicyID(id)]
		var h [2]bool
		for _, d := range []Direction{Ingress, Egress} {
			if u[d] {
				h[d] = r.clusterPolicyChain(ClusterPolicyID(id), d)
			}
		}
		chasRules[ClusterPolicyID(id)] = h
	}
	// Then the combination chains, in name order: the ruleset does not
	// depend on the order of the pods.
	for _, n := range slices.Sorted(maps.Keys(combos)) {
		c := combos[n]
		if c.t == 0 {
			r.isolationChain(c.d, c.ids, hasRules)
		} else {
			r.clusterComboChain(c.t, c.d, c.cids, chasRules)
		}
	}
}

// podElements emits what one pod contributes to the sets and maps whose
// elements are pods: the self and ClusterNetworkPolicy egress sets and the
// tier maps (local pods), the peer sets of the selectors it belongs to and
// the named-port sets its ports resolve in, the known-pods sets of the
// unknown-pod rules and the DNS-capture set of domainNames subjects. Sets and maps the ruleset does
// not have (a selector no rendered rule uses) get nothing. Nothing else in
// the ruleset depends on a single pod, except the tier-skip sets of
// ClusterNetworkPolicy combination chains (comboRanges), which list every
// address their rules name: pod churn is these elements.
func (r *renderer) podElements(pod *Pod, emit func(set string, e knftables.Element)) {
	pt := r.podText(pod)
	r.podElementsWith(pod, &pt, emit)
}

// podElementsWith is podElements with the pod's texts.
func (r *renderer) podElementsWith(pod *Pod, pt *podText, emit func(set string, e knftables.Element)) {
	r.knownPodElements(pod, pt, emit)
	r.fqdnPodElements(pod, pt, emit)
	if pod.Local {
		r.localPodElements(pod, pt, emit)
	}
	for _, sid := range pod.MemberOf {
		for _, v4 := range []bool{true, false} {
			name := r.peerSets.lookup(sid, v4)
			if name == "" {
				continue
			}
			for i, ip := range pod.IPs {
				if ip.Is4() == v4 {
					emit(name, knftables.Element{Key: pt.addrKey(i), Comment: pt.comment})
				}
			}
		}
	}
	r.namedElements(pod, pt, emit)
}

// localPodElements emits a local pod's self and dispatch elements.
func (r *renderer) localPodElements(pod *Pod, pt *podText, emit func(set string, e knftables.Element)) {
	cnpEgress := len(pod.AdminEgress) > 0 || len(pod.BaselineEgress) > 0
	egress := len(pod.EgressPolicies) > 0 || cnpEgress
	ingress := len(pod.IngressPolicies) > 0 || len(pod.AdminIngress) > 0 || len(pod.BaselineIngress) > 0
	if !egress && !ingress {
		return
	}
	vmap := func(prefix string, verdict string) {
		value := []string{verdict}
		for i, ip := range pod.IPs {
			emit(prefix+famSuffix(ip.Is4()), knftables.Element{Key: pt.addrKey(i), Value: value, Comment: pt.comment})
		}
	}
	for i, ip := range pod.IPs {
		// A pod can always reach itself, before any policy is consulted;
		// the input chain dispatches ClusterNetworkPolicy egress subjects.
		self := r.strs(2)
		self[0], self[1] = pt.addrs[i], pt.addrs[i]
		emit("self"+famSuffix(ip.Is4()), knftables.Element{Key: self, Comment: pt.comment})
		if cnpEgress {
			emit(clusterEgressSet(ip.Is4()), knftables.Element{Key: pt.addrKey(i), Comment: pt.comment})
		}
	}
	if r.cfg.Mode == ModeQueue {
		if egress {
			vmap("egress-pods", "goto "+ChainQueueShare)
		}
		if ingress {
			vmap("ingress-pods", "goto "+ChainQueueShare)
		}
		return
	}
	for _, d := range []Direction{Ingress, Egress} {
		if ids := pod.Policies(d); len(ids) > 0 {
			vmap(d.String()+"-pods", "goto "+IsolationChainName(r.prog, d, ids))
		}
		for _, t := range []Tier{TierAdmin, TierBaseline} {
			if cids := pod.ClusterPolicies(t, d); len(cids) > 0 {
				vmap(tierMapPrefix(t, d), "goto "+ClusterComboChainName(r.prog, t, d, cids))
			}
		}
	}
}

func (r *renderer) isolationChain(d Direction, ids []PolicyID, hasRules map[PolicyID][2]bool) string {
	name := IsolationChainName(r.prog, d, ids)
	if _, ok := r.rs.Chains[name]; ok {
		return name
	}
	keys := comboKey(r.prog, ids)
	c := &Chain{Chain: knftables.Chain{Name: name, Comment: truncComment("isolated for " + d.String() + " by " + strings.ReplaceAll(keys, ",", ", "))}}
	if d == Egress {
		// Only the input chain sends a pod's traffic to its own node here.
		c.Rules = append(c.Rules,
			rule("ip daddr @node-ips-v4 accept", "to this node: NetworkPolicy never isolates a pod from its node"),
			rule("ip6 daddr @node-ips-v6 accept", "to this node: NetworkPolicy never isolates a pod from its node"))
	}
	for _, id := range ids {
		if hasRules[id][d] {
			c.Rules = append(c.Rules, rule("jump "+PolicyChainName(&r.prog.Policies[id], d), ""))
		}
	}
	c.Rules = append(c.Rules, rule("counter "+r.dropVerdict(networkPolicyDeny(r.prog, d, ids)), "default deny "+d.String()+": "+strings.ReplaceAll(keys, ",", ", ")))
	r.addChain(c)
	return name
}

// policyChain renders the rules of one policy in one direction; it reports
// whether the chain has any rule (a policy that only isolates has none).
func (r *renderer) policyChain(id PolicyID, d Direction) bool {
	pol := &r.prog.Policies[id]
	c := &Chain{Chain: knftables.Chain{Name: PolicyChainName(pol, d)}}
	// Chain comments depend only on the name: syncs never rewrite them.
	c.Chain.Comment = truncComment(pol.Key + " " + d.String())
	verdict := "accept"
	if d == Egress {
		verdict = "jump " + ChainEgressAllow
	}
	for ri := range pol.Rules(d) {
		rl := &pol.Rules(d)[ri]
		if rl.MatchesNothing() {
			continue
		}
		base := PolicyChainName(pol, d) + "-" + itoa(ri)
		c.Rules = r.matchRules(c.Rules, &rl.Match, base, rl.Name, d, subjectOfPolicy(id, d), "counter "+verdict)
	}
	if len(c.Rules) == 0 {
		return false
	}
	r.addChain(c)
	return true
}

// matchRules appends one nft rule per peer and port alternative of a match,
// both families, each ending in verdict. Sets the rules use are named after
// base. Named ports resolve on the subjects (the local pods subject reports)
// for ingress, on the peers for egress.
func (r *renderer) matchRules(out []knftables.Rule, m *Match, base, comment string, d Direction, subject func(*Pod) bool, verdict string) []knftables.Rule {
	peerDir := peerAddr(d)
	// The same text from both families (a rule with no address in it)
	// comes once; a match has as many alternatives as its author writes,
	// so they are looked up, not scanned for.
	var seen map[string]bool
	for _, v4 := range []bool{true, false} {
		// Peers: each alternative is one nft rule.
		var peers []string
		if m.AllPeers {
			peers = []string{""}
		} else {
			for _, sid := range m.Selectors {
				set := r.peerSet(sid, v4)
				peers = append(peers, fmt.Sprintf("%s %s @%s ", famWord(v4), peerDir, set))
			}
			for _, nid := range m.Nodes {
				if set := r.nodeSet(nid, v4); set != "" {
					peers = append(peers, fmt.Sprintf("%s %s @%s ", famWord(v4), peerDir, set))
				}
			}
			if blocks := familyRanges(m.IPBlocks, v4); len(blocks) > 0 {
				name := base + "-cidrs" + famSuffix(v4)
				s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4), Flags: []knftables.SetFlag{knftables.IntervalFlag},
					Comment: truncComment(comment + " address peers")}})
				for _, b := range blocks {
					s.Elements = append(s.Elements, knftables.Element{Key: []string{b.String()}})
				}
				peers = append(peers, fmt.Sprintf("%s %s @%s ", famWord(v4), peerDir, name))
			}
			peers = append(peers, r.fqdnPeer(m, base, comment, d, v4)...)
		}
		// Ports: each alternative is one nft rule.
		var ports []string
		if m.AllPorts {
			ports = []string{""}
		} else {
			if len(m.Ports) > 0 {
				name := base + "-ports"
				s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: "inet_proto . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag},
					Comment: truncComment(comment + " ports")}})
				if len(s.Elements) == 0 {
					for _, p := range m.Ports {
						s.Elements = append(s.Elements, knftables.Element{Key: []string{p.Protocol.Name(), portText(p)}})
					}
				}
				ports = append(ports, "meta l4proto . th dport @"+name+" ")
			}
			if len(m.NamedPorts) > 0 {
				name := r.namedPortSet(base+"-named", m, comment, d, subject, v4)
				ports = append(ports, fmt.Sprintf("%s daddr . meta l4proto . th dport @%s ", famWord(v4), name))
			}
		}
		for _, pe := range peers {
			for _, po := range ports {
				text := pe + po + verdict
				if seen[text] {
					continue
				}
				if seen == nil {
					seen = map[string]bool{}
				}
				seen[text] = true
				out = append(out, rule(text, comment))
			}
		}
	}
	return out
}

func portText(p PortRange) string {
	if p.First == p.Last {
		return itoa(int(p.First))
	}
	return itoa(int(p.First)) + "-" + itoa(int(p.Last))
}

func familyRanges(rs []IPRange, v4 bool) []IPRange {
	var out []IPRange
	for _, x := range rs {
		if x.From.Is4() == v4 {
			out = append(out, x)
		}
	}
	return out
}

// PeerSetName is the set holding the addresses of one family of a shared
// pod-selecting peer.
func PeerSetName(s *Selector, v4 bool) string { return "peers-" + shortHash(s.Key) + famSuffix(v4) }

func (r *renderer) peerSet(id SelectorID, v4 bool) string {
	sel := &r.prog.Selectors[id]
	name := PeerSetName(sel, v4)
	// Created empty: podElements fills it with its members.
	r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4), Comment: truncComment(sel.Description)}})
	r.peerSets.note(id, v4, name)
	return name
}

// namedPortUser is a rule's named-port set: (destination IP, protocol,
// port) for every pod a named port of the match can resolve on: the
// policy's subjects for ingress; for egress the pods among the match's peers.
type namedPortUser struct {
	base string // the set is base-v4 or base-v6
	m    *Match
	// subject reports whether a pod is a subject of the rule's policy (ingress).
	subject func(*Pod) bool
}

func (u *namedPortUser) covers(pod *Pod) bool {
	if u.subject != nil {
		return pod.Local && u.subject(pod)
	}
	return matchCoversPod(u.m, pod)
}

func (u *namedPortUser) elements(r *renderer, pod *Pod, pt *podText, emit func(set string, e knftables.Element)) {
	for _, np := range u.m.NamedPorts {
		for _, cp := range pod.Ports {
			if cp.Name != np.Name || (np.Protocol != 0 && cp.Protocol != np.Protocol) {
				continue
			}
			if n, ok := pod.NamedPort(np.Name, cp.Protocol); !ok || n != cp.Port {
				continue // an earlier container port of that name and protocol wins
			}
			comment, port := truncComment(pod.Key+" "+np.Name), itoa(int(cp.Port))
			for i, ip := range pod.IPs {
				key := r.strs(3)
				key[0], key[1], key[2] = pt.addrs[i], cp.Protocol.Name(), port
				emit(u.base+famSuffix(ip.Is4()), knftables.Element{Key: key, Comment: comment})
			}
		}
	}
}

// namedPortSet creates a rule's named-port set of one family (podElements
// fills it) and registers the rule once for both families.
func (r *renderer) namedPortSet(base string, m *Match, comment string, d Direction, subject func(*Pod) bool, v4 bool) string {
	name := base + famSuffix(v4)
	if _, ok := r.rs.Sets[name]; !ok && !r.namedBases[base] {
		if r.namedBases == nil {
			r.namedBases = map[string]bool{}
		}
		r.namedBases[base] = true
		u := namedPortUser{base: base, m: m}
		if d == Ingress {
			u.subject = subject
		}
		r.named = append(r.named, u)
	}
	r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4) + " . inet_proto . inet_service",
		Comment: truncComment(comment + " named ports, resolved per destination pod")}})
	return name
}

// matchCoversPod reports whether a pod is among a match's peers.
func matchCoversPod(m *Match, pod *Pod) bool {
	if m.AllPeers {
		return true
	}
	for _, sid := range m.Selectors {
		if pod.InSelector(sid) {
			return true
		}
	}
	for _, ip := range pod.IPs {
		if rangesContain(m.IPBlocks, ip) {
			return true
		}
	}
	return false
}
