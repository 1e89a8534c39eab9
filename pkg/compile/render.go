package compile

import (
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

func comboKey(p *Program, ids []PolicyID) string {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = p.Policies[id].Key
	}
	return strings.Join(keys, ",")
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
	// late is set once the policies' chains are rendered: the chains
	// created from then on come after them (groupTail).
	late bool
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
	r.verifyMeters()
	if r.cfg.Mode == ModeQueue {
		r.queueDispatch()
	} else {
		r.kernelDispatch()
	}
	r.late = true
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
	if r.late && c.place.group == groupStatic {
		c.place.group = groupTail
	}
	r.rs.Chains[c.Chain.Name] = c
	r.rs.ChainOrder = append(r.rs.ChainOrder, c.Chain.Name)
}

func (r *renderer) addSet(s *Set) *Set {
	if old, ok := r.rs.Sets[s.Name()]; ok {
		return old
	}
	// The declaration's type is the typed key's printing.
	if s.Map != nil {
		s.Map.Type = keyText(s.Key) + " : verdict"
	} else {
		s.Set.Type = keyText(s.Key)
	}
	r.rs.Sets[s.Name()] = s
	return s
}

// tierChains names, per direction, the chains that dispatch new connections
// to each tier, in evaluation order, and where a connection goes when every
// tier let it through.
type tierChains struct {
	entry, networkPolicy string
	allowed              RuleVerdict
	// addr is the address the direction dispatches on: the local pod's.
	addr string
}

func tiers(d Direction) tierChains {
	tc := tierChains{entry: tierChainName(TierAdmin, d), networkPolicy: tierChainName(0, d)}
	if d == Egress {
		// Egress allowed: the destination's ingress decides next.
		tc.allowed, tc.addr = gotoV(ChainIngress), "saddr"
	} else {
		tc.allowed, tc.addr = accept(), "daddr"
	}
	return tc
}

func (r *renderer) static() {
	kernel := r.cfg.Mode != ModeQueue
	for _, v4 := range []bool{true, false} {
		for _, d := range []Direction{Egress, Ingress} {
			r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Map: &knftables.Map{Name: tierMapName(0, d, v4),
				Comment: ptr("local pods isolated for " + d.String() + " by NetworkPolicies -> the chain that decides their new connections")}})
			if kernel {
				for _, t := range []Tier{TierAdmin, TierBaseline} {
					r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Map: &knftables.Map{Name: tierMapName(t, d, v4),
						Comment: ptr("local pods with " + t.String() + " ClusterNetworkPolicy " + d.String() + " rules -> their policies, in precedence order")}})
				}
			}
		}
		r.addSet(&Set{Key: []KeyKind{addrKind(v4), addrKind(v4)}, Set: &knftables.Set{Name: selfSetName(v4),
			Comment: ptr("local pods that policies select, twice: a pod can always reach itself")}})
		r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: clusterEgressSetName(v4),
			Comment: ptr("local pods with ClusterNetworkPolicy egress rules: their traffic to this node is decided too")}})
		if kernel {
			r.addSet(&Set{Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: nodeIPsSetName(v4),
				Comment: ptr("this node's addresses: NetworkPolicy never isolates a pod from its own node")}})
		}
	}
	for _, ip := range r.prog.NodeIPs {
		if kernel {
			s := r.rs.Sets[nodeIPsSetName(ip.Is4())]
			s.Elements = append(s.Elements, AddrElement(ip, nil))
		}
	}
	m := r.cfg.AllowMark
	// head is the start of both base chains: connections already decided.
	var head []TableRule
	if r.cfg.UsesQueue() {
		head = append(head, mkRule([]RuleExpr{nftOnly(fmt.Sprintf("meta mark & %#08x == %#08x ct mark set ct mark | %#08x meta mark set meta mark & %#08x",
			m, m, m, ^m))}, counted(accept()), "allowed by the userspace evaluator: remember it in the connection's mark"))
	}
	head = append(head, mkRule([]RuleExpr{nftOnly("ct state established,related")}, plain(accept()), ""))
	if r.cfg.UsesQueue() {
		head = append(head, mkRule([]RuleExpr{nftOnly(fmt.Sprintf("ct mark & %#08x == %#08x", m, m))}, plain(accept()), "connection allowed earlier by the userspace evaluator"))
	}
	nd := ndRule()
	fwd := append(append([]TableRule(nil), head...), nd,
		mkRule([]RuleExpr{lookup(selfSetName(true), FieldIPSaddr, FieldIPDaddr)}, plain(accept()), "a pod can always reach itself"),
		mkRule([]RuleExpr{lookup(selfSetName(false), FieldIP6Saddr, FieldIP6Daddr)}, plain(accept()), "a pod can always reach itself"),
	)
	fwd = append(fwd, midstreamRules()...)
	input := append(append([]TableRule(nil), head...), nd)
	stagedFwd, stagedInput := r.stagedLog()
	fwd = append(fwd, stagedFwd...)
	input = append(input, stagedInput...)
	fwd = append(fwd, r.unknownPods()...)
	if kernel {
		fwd = append(fwd, mkRule(nil, plain(gotoV(ChainEgress)), ""))
		input = append(input,
			mkRule([]RuleExpr{lookup(clusterEgressSetName(true), FieldIPSaddr)}, plain(gotoV(ChainEgress)), ""),
			mkRule([]RuleExpr{lookup(clusterEgressSetName(false), FieldIP6Saddr)}, plain(gotoV(ChainEgress)), ""))
		r.tierDispatch()
	} else {
		fwd = append(fwd,
			mkRule([]RuleExpr{vmap(tierMapName(0, Egress, true), FieldIPSaddr)}, ruleEnd{}, ""),
			mkRule([]RuleExpr{vmap(tierMapName(0, Egress, false), FieldIP6Saddr)}, ruleEnd{}, ""),
			mkRule([]RuleExpr{vmap(tierMapName(0, Ingress, true), FieldIPDaddr)}, ruleEnd{}, ""),
			mkRule([]RuleExpr{vmap(tierMapName(0, Ingress, false), FieldIP6Daddr)}, ruleEnd{}, ""))
		input = append(input,
			mkRule([]RuleExpr{lookup(clusterEgressSetName(true), FieldIPSaddr)}, plain(gotoV(ChainQueueShare)), ""),
			mkRule([]RuleExpr{lookup(clusterEgressSetName(false), FieldIP6Saddr)}, plain(gotoV(ChainQueueShare)), ""))
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

// midstreamRules drop a TCP packet without SYN that conntrack takes for a
// new connection (loose pickup: its entry was deleted, by the revoker or
// by hand, or expired) when either end is a local pod that policies
// select. Conntrack makes the packet's sender the client, so a server's
// late ACK would open the connection anew in reverse, decided as ingress
// to the pod, and the pod's own packets would then pass as replies, past
// the egress policy that revoked the connection. A pod's connections are
// admitted at their SYN only; one that lost its entry must reconnect.
func midstreamRules() []TableRule {
	const comment = "TCP without SYN opening a connection (its conntrack entry revoked or lost): a selected pod reconnects with a SYN"
	var out []TableRule
	for _, v4 := range []bool{true, false} {
		for _, end := range []string{"saddr", "daddr"} {
			f := addrField(v4, end)
			out = append(out, mkRule([]RuleExpr{nftOnly("ct state new tcp flags & syn == 0"), lookup(selfSetName(v4), f, f)}, counted(drop()), comment))
		}
	}
	return out
}

// tierDispatch renders the static chains that run the tiers in order, per
// direction: Admin, NetworkPolicy, Baseline, then allowed. Every chain ends
// in a verdict or a goto, so a Pass can goto the next tier's chain from any
// depth.
func (r *renderer) tierDispatch() {
	for _, d := range []Direction{Egress, Ingress} {
		tc := tiers(d)
		vmaps := func(t Tier) []TableRule {
			var out []TableRule
			for _, v4 := range []bool{true, false} {
				out = append(out, mkRule([]RuleExpr{vmap(tierMapName(t, d, v4), addrField(v4, tc.addr))}, ruleEnd{}, ""))
			}
			return out
		}
		// The NetworkPolicy tier's chain runs the Baseline tier's maps
		// itself, rather than going to a chain of its own: every level
		// saved keeps the tables' deepest path (egress's tiers, then
		// ingress's) under the kernel's jump stack (KernelJumpStack).
		np := &Chain{Chain: knftables.Chain{Name: tc.networkPolicy,
			Comment: ptr(d.String() + " of local pods, tier 2: NetworkPolicies (they decide for the pods they isolate), tier 3: Baseline")}}
		np.Rules = append(append(vmaps(0), vmaps(TierBaseline)...), r.withSamples(nil, plain(tc.allowed), "", verifyDefault(d), RuleOwner{})...)
		r.addChain(np)
		admin := &Chain{Chain: knftables.Chain{Name: tc.entry,
			Comment: ptr("new connections " + map[Direction]string{Egress: "from", Ingress: "to"}[d] + " local pods, tier 1: Admin ClusterNetworkPolicies")}}
		admin.Rules = append(vmaps(TierAdmin), mkRule(nil, plain(gotoV(tc.networkPolicy)), ""))
		r.addChain(admin)
	}
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
		c.Rules = []TableRule{mkRule([]RuleExpr{counter(), nftOnly(QueueStatement(r.cfg.QueueNum, r.cfg.Queues, r.cfg.FailOpen, true))}, ruleEnd{}, "")}
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
	combos := map[string]combo{}
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local {
			continue
		}
		podCombos(pod, func(c combo) {
			for _, id := range c.ids {
				u := used[id]
				u[c.d] = true
				used[id] = u
			}
			for _, id := range c.cids {
				u := cused[id]
				u[c.d] = true
				cused[id] = u
			}
			combos[c.name(r.prog)] = c
		})
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
		r.comboChain(c, func(i int) bool {
			if c.t == 0 {
				return hasRules[c.ids[i]][c.d]
			}
			return chasRules[c.cids[i]][c.d]
		})
	}
}

// combo is a combination chain: for the local pods isolated by exactly the
// NetworkPolicies ids (tier 0), or that exactly the ClusterNetworkPolicies
// cids of tier t apply to, in direction d.
type combo struct {
	t    Tier
	d    Direction
	ids  []PolicyID
	cids []ClusterPolicyID
}

// podCombos calls f with each combination chain that dispatches a local
// pod's new connections (kernel and hybrid modes).
func podCombos(pod *Pod, f func(combo)) {
	for _, d := range []Direction{Ingress, Egress} {
		if ids := pod.Policies(d); len(ids) > 0 {
			f(combo{d: d, ids: ids})
		}
		for _, t := range []Tier{TierAdmin, TierBaseline} {
			if cids := pod.ClusterPolicies(t, d); len(cids) > 0 {
				f(combo{t: t, d: d, cids: cids})
			}
		}
	}
}

func (c combo) name(p *Program) string {
	if c.t == 0 {
		return IsolationChainName(p, c.d, c.ids)
	}
	return ClusterComboChainName(p, c.t, c.d, c.cids)
}

// size is the number of policies in the combination.
func (c combo) size() int { return len(c.ids) + len(c.cids) }

// ruleChainName is the rule chain of the combination's policy i.
func (c combo) ruleChainName(p *Program, i int) string {
	if c.t == 0 {
		return PolicyChainName(&p.Policies[c.ids[i]], c.d)
	}
	return ClusterPolicyChainName(&p.ClusterPolicies[c.cids[i]], c.d)
}

// comboChain renders a combination chain; hasRules(i) reports whether its
// policy i has a rule chain to jump to.
func (r *renderer) comboChain(c combo, hasRules func(i int) bool) {
	if c.t == 0 {
		r.isolationChain(c.d, c.ids, hasRules)
	} else {
		r.clusterComboChain(c.t, c.d, c.cids, hasRules)
	}
}

// ruleChain renders the rule chain of a combination's policy i; false when
// the policy has no rule in the direction (no chain).
func (r *renderer) ruleChain(c combo, i int) bool {
	if c.t == 0 {
		return r.policyChain(c.ids[i], c.d)
	}
	return r.clusterPolicyChain(c.cids[i], c.d)
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
func (r *renderer) podElements(pod *Pod, emit func(set string, e Element)) {
	pt := r.podText(pod)
	r.podElementsWith(pod, &pt, emit)
}

// podElementsWith is podElements with the pod's shared comment.
func (r *renderer) podElementsWith(pod *Pod, pt *podText, emit func(set string, e Element)) {
	r.knownPodElements(pod, pt, emit)
	r.fqdnPodElements(pod, pt, emit)
	if pod.Local {
		r.stagedElements(pod, pt, emit)
		r.localPodElements(pod, pt, emit)
	}
	for _, sid := range pod.MemberOf {
		for _, v4 := range []bool{true, false} {
			name := r.peerSets.lookup(sid, v4)
			if name == "" {
				continue
			}
			for _, ip := range pod.IPs {
				if ip.Is4() == v4 {
					emit(name, AddrElement(ip, pt.comment))
				}
			}
		}
	}
	r.namedElements(pod, pt, emit)
}

// localPodElements emits a local pod's self and dispatch elements.
func (r *renderer) localPodElements(pod *Pod, pt *podText, emit func(set string, e Element)) {
	cnpEgress := len(pod.AdminEgress) > 0 || len(pod.BaselineEgress) > 0
	egress := len(pod.EgressPolicies) > 0 || cnpEgress
	ingress := len(pod.IngressPolicies) > 0 || len(pod.AdminIngress) > 0 || len(pod.BaselineIngress) > 0
	if !egress && !ingress {
		return
	}
	dispatch := func(t Tier, d Direction, chain string) {
		for _, ip := range pod.IPs {
			emit(tierMapName(t, d, ip.Is4()), Element{Addr: ip, Verdict: VerdictGoto, Chain: chain, Comment: pt.comment})
		}
	}
	for _, ip := range pod.IPs {
		// A pod can always reach itself, before any policy is consulted;
		// the input chain dispatches ClusterNetworkPolicy egress subjects.
		emit(selfSetName(ip.Is4()), Element{Addr: ip, Shape: ShapeAddrAddr, Comment: pt.comment})
		if cnpEgress {
			emit(clusterEgressSetName(ip.Is4()), AddrElement(ip, pt.comment))
		}
	}
	if r.cfg.Mode == ModeQueue {
		if egress {
			dispatch(0, Egress, ChainQueueShare)
		}
		if ingress {
			dispatch(0, Ingress, ChainQueueShare)
		}
		return
	}
	podCombos(pod, func(c combo) { dispatch(c.t, c.d, c.name(r.prog)) })
}

func (r *renderer) isolationChain(d Direction, ids []PolicyID, hasRules func(i int) bool) string {
	name := IsolationChainName(r.prog, d, ids)
	if _, ok := r.rs.Chains[name]; ok {
		return name
	}
	keys := comboKey(r.prog, ids)
	c := &Chain{Chain: knftables.Chain{Name: name, Comment: truncComment("isolated for " + d.String() + " by " + strings.ReplaceAll(keys, ",", ", "))},
		place: chainPlace{group: groupCombo, key: name}}
	if d == Egress {
		// Only the input chain sends a pod's traffic to its own node here.
		const comment = "to this node: NetworkPolicy never isolates a pod from its node"
		for _, v4 := range []bool{true, false} {
			matches := []RuleExpr{lookup(nodeIPsSetName(v4), addrField(v4, "daddr"))}
			c.Rules = append(append(c.Rules, r.sampledRules(matches, plain(accept()), comment, verifyNode, RuleOwner{}, v4)...), mkRule(matches, plain(accept()), comment))
		}
	}
	pols := make([]string, len(ids))
	for i, id := range ids {
		pols[i] = r.prog.Policies[id].Key
		if hasRules(i) {
			c.Rules = append(c.Rules, mkRule(nil, plain(jump(PolicyChainName(&r.prog.Policies[id], d))), ""))
		}
	}
	deny := networkPolicyDeny(r.prog, d, ids)
	owner := RuleOwner{Kind: OwnerDeny, Direction: d, Policies: pols}
	c.Rules = append(c.Rules, r.withSamples(nil, counted(r.dropVerdict(deny, c)), "default deny "+d.String()+": "+strings.ReplaceAll(keys, ",", ", "), verifyOfDeny(deny), owner)...)
	r.addChain(c)
	return name
}

// policyChain renders the rules of one policy in one direction; it reports
// whether the chain has any rule (a policy that only isolates has none).
func (r *renderer) policyChain(id PolicyID, d Direction) bool {
	pol := &r.prog.Policies[id]
	c := &Chain{Chain: knftables.Chain{Name: PolicyChainName(pol, d)}, place: chainPlace{group: groupPolicy, key: policyChainKey(pol.Key, d)}}
	// Chain comments depend only on the name: syncs never rewrite them.
	c.Chain.Comment = truncComment(pol.Key + " " + d.String())
	verdict := accept()
	if d == Egress {
		verdict = jump(ChainIngress)
	}
	for ri := range pol.Rules(d) {
		rl := &pol.Rules(d)[ri]
		if rl.MatchesNothing() {
			continue
		}
		info := verifyOfRule(pol, rl)
		owner := RuleOwner{Kind: OwnerAllow, Direction: d, Policies: []string{pol.Key}, Rule: rl.Name}
		r.matchRules(c, &rl.Match, ruleSetBase(c.Chain.Name, ri), rl.Name, d, subjectOfPolicy(id, d), counted(verdict), &info, owner)
	}
	if len(c.Rules) == 0 {
		return false
	}
	r.addChain(c)
	return true
}

// matchRules appends to a rule chain one nft rule per peer and port
// alternative of a match, both families, each ending in end and
// belonging to owner, and records the shared sets they name. Sets the
// rules use are named after base and owned by the chain. Named ports
// resolve on the subjects (the local pods subject reports) for ingress,
// on the peers for egress.
func (r *renderer) matchRules(c *Chain, m *Match, base, comment string, d Direction, subject func(*Pod) bool, end ruleEnd, sample *VerifyInfo, owner RuleOwner) {
	// The same rule from both families (a rule with no address in it)
	// comes once; a match has as many alternatives as its author writes,
	// so they are looked up, not scanned for.
	type alternative struct {
		matches []RuleExpr
		shared  string
		// first is set on the first alternative of a peer.
		first bool
	}
	var alts [2][]alternative
	for i, v4 := range []bool{true, false} {
		peers := r.peerAlternatives(c, m, base, comment, d, v4)
		ports := r.portAlternatives(c, m, base, comment, d, subject, v4)
		for _, pe := range peers {
			for j, po := range ports {
				matches := append(append(make([]RuleExpr, 0, len(pe.matches)+len(po)), pe.matches...), po...)
				alts[i] = append(alts[i], alternative{matches: matches, shared: pe.shared, first: j == 0})
			}
		}
	}
	var seen, inV6 map[string]bool
	if sample != nil {
		// Sampled copies come before their rule, one per family (the
		// meter's key): a rule without an address has both.
		inV6 = map[string]bool{}
		for _, a := range alts[1] {
			inV6[matchesKey(a.matches)] = true
		}
	}
	for i, v4 := range []bool{true, false} {
		named := false
		for _, a := range alts[i] {
			named = named && !a.first
			rl := mkRule(a.matches, end, comment)
			rl.Owner = owner
			key := matchesKey(a.matches)
			if seen[key] {
				continue
			}
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[key] = true
			if sample != nil {
				fams := []bool{v4}
				if v4 && inV6[key] {
					fams = append(fams, false)
				}
				c.Rules = append(c.Rules, r.sampledRules(a.matches, end, comment, *sample, owner, fams...)...)
			}
			c.Rules = append(c.Rules, rl)
			if a.shared != "" && !named {
				c.shares = append(c.shares, a.shared)
				named = true
			}
		}
	}
}

// matchesKey tells apart a rule's matches (the printing of a rule made of
// them alone): two alternatives with the same key are the same rule.
func matchesKey(matches []RuleExpr) string {
	r := TableRule{Exprs: matches}
	return r.Text()
}

// peerAlternative is the peer part of a rule, and the shared set it
// names ("" for none).
type peerAlternative struct {
	matches []RuleExpr
	shared  string
}

// peerAlternatives are a match's peers of one family: each is one nft rule.
func (r *renderer) peerAlternatives(c *Chain, m *Match, base, comment string, d Direction, v4 bool) []peerAlternative {
	if m.AllPeers {
		return []peerAlternative{{}}
	}
	var peers []peerAlternative
	in := func(set string) []RuleExpr { return []RuleExpr{lookup(set, addrField(v4, peerAddr(d)))} }
	for _, sid := range m.Selectors {
		set := r.peerSet(sid, v4)
		peers = append(peers, peerAlternative{in(set), set})
	}
	for _, nid := range m.Nodes {
		if set := r.nodeSet(nid, v4); set != "" {
			peers = append(peers, peerAlternative{in(set), set})
		}
	}
	if blocks := familyRanges(m.IPBlocks, v4); len(blocks) > 0 {
		name := ruleCIDRsSetName(base, v4)
		s := r.addSet(&Set{owner: c.Chain.Name, Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: name, Flags: []knftables.SetFlag{knftables.IntervalFlag},
			Comment: truncComment(comment + " address peers")}})
		for _, b := range blocks {
			s.Elements = append(s.Elements, RangeElement(b))
		}
		peers = append(peers, peerAlternative{matches: in(name)})
	}
	if matches := r.fqdnPeer(c, m, base, comment, d, v4); matches != nil {
		peers = append(peers, peerAlternative{matches: matches})
	}
	return peers
}

// portAlternatives are a match's ports of one family: each is one nft
// rule.
func (r *renderer) portAlternatives(c *Chain, m *Match, base, comment string, d Direction, subject func(*Pod) bool, v4 bool) [][]RuleExpr {
	if m.AllPorts {
		return [][]RuleExpr{nil}
	}
	var ports [][]RuleExpr
	if len(m.Ports) > 0 {
		name := rulePortsSetName(base)
		s := r.addSet(&Set{owner: c.Chain.Name, Key: []KeyKind{KeyProto, KeyService}, Set: &knftables.Set{Name: name, Flags: []knftables.SetFlag{knftables.IntervalFlag},
			Comment: truncComment(comment + " ports")}})
		if len(s.Elements) == 0 {
			for _, p := range m.Ports {
				s.Elements = append(s.Elements, Element{Ports: p, Shape: ShapeProtoPorts})
			}
		}
		ports = append(ports, []RuleExpr{lookup(name, FieldL4Proto, FieldTHDport)})
	}
	if len(m.NamedPorts) > 0 {
		name := r.namedPortSet(c.Chain.Name, base, m, comment, d, subject, v4)
		ports = append(ports, []RuleExpr{lookup(name, addrField(v4, "daddr"), FieldL4Proto, FieldTHDport)})
	}
	return ports
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

func (r *renderer) peerSet(id SelectorID, v4 bool) string {
	sel := &r.prog.Selectors[id]
	name := PeerSetName(sel, v4)
	// Created empty: podElements fills it with its members.
	r.addSet(&Set{shared: true, Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: name, Comment: truncComment(sel.setComment())}})
	r.peerSets.note(id, v4, name)
	return name
}

// namedPortUser is a rule's named-port set: (destination IP, protocol,
// port) for every pod a named port of the match can resolve on: the
// policy's subjects for ingress; for egress the pods among the match's peers.
type namedPortUser struct {
	// base is the rule's (ruleSetBase), owner its chain; sets are the
	// set's names, IPv4 and IPv6.
	base, owner string
	sets        [2]string
	m           *Match
	// subject reports whether a pod is a subject of the rule's policy (ingress).
	subject func(*Pod) bool
}

func (u *namedPortUser) covers(pod *Pod) bool {
	if u.subject != nil {
		return pod.Local && u.subject(pod)
	}
	return matchCoversPod(u.m, pod)
}

func (u *namedPortUser) elements(r *renderer, pod *Pod, pt *podText, emit func(set string, e Element)) {
	for _, np := range u.m.NamedPorts {
		for _, cp := range pod.Ports {
			if cp.Name != np.Name || (np.Protocol != 0 && cp.Protocol != np.Protocol) {
				continue
			}
			if n, ok := pod.NamedPort(np.Name, cp.Protocol); !ok || n != cp.Port {
				continue // an earlier container port of that name and protocol wins
			}
			comment := truncComment(pod.Key + " " + np.Name)
			ports := PortRange{Protocol: cp.Protocol, First: cp.Port, Last: cp.Port}
			for _, ip := range pod.IPs {
				emit(u.sets[famIndex(ip.Is4())], Element{Addr: ip, Ports: ports, Shape: ShapeAddrProtoPort, Comment: comment})
			}
		}
	}
}

// namedPortSet creates a rule's named-port set of one family (podElements
// fills it) and registers the rule once for both families.
func (r *renderer) namedPortSet(owner, base string, m *Match, comment string, d Direction, subject func(*Pod) bool, v4 bool) string {
	name := ruleNamedSetName(base, v4)
	if _, ok := r.rs.Sets[name]; !ok && !r.namedBases[base] {
		if r.namedBases == nil {
			r.namedBases = map[string]bool{}
		}
		r.namedBases[base] = true
		u := namedPortUser{base: base, owner: owner, m: m, sets: [2]string{ruleNamedSetName(base, true), ruleNamedSetName(base, false)}}
		if d == Ingress {
			u.subject = subject
		}
		r.named = append(r.named, u)
	}
	r.addSet(&Set{owner: owner, Key: []KeyKind{addrKind(v4), KeyProto, KeyService}, Set: &knftables.Set{Name: name,
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
