package compile

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"

	"sigs.k8s.io/knftables"
)

func ptr[T any](v T) *T { return &v }

// truncComment keeps comments within nftables' limit.
func truncComment(s string) *string {
	if len(s) > knftables.CommentLengthMax {
		s = s[:knftables.CommentLengthMax-3] + "..."
	}
	return &s
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
		ref = ref[:maxPolicyRefChars-9] + "~" + shortHash(p.Key)
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
	prog    *Program
	cfg     RenderConfig
	rs      *Ruleset
	forward *Chain
}

// Render turns a program into the desired ruleset of the nftpolicy table.
// It is pure: the same program and config give the same ruleset.
func Render(prog *Program, cfg RenderConfig) (*Ruleset, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &renderer{prog: prog, cfg: cfg, rs: &Ruleset{
		Table:  knftables.Table{Comment: ptr(fmt.Sprintf("nftpolicy: NetworkPolicy enforcement (mode %s)", cfg.Mode))},
		Chains: map[string]*Chain{},
		Sets:   map[string]*Set{},
	}}
	r.static()
	if cfg.Mode == ModeQueue {
		r.queueDispatch()
	} else {
		r.kernelDispatch()
	}
	// Base chains last: everything they reference exists by then.
	r.addChain(r.forward)
	for _, s := range r.rs.Sets {
		s.Elements = sortElements(s.Elements)
	}
	return r.rs, nil
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

func (r *renderer) static() {
	// Pod IP -> what decides its new connections.
	for _, v4 := range []bool{true, false} {
		r.addSet(&Set{Map: &knftables.Map{Name: "egress-pods" + famSuffix(v4), Type: addrType(v4) + " : verdict",
			Comment: ptr("local pods isolated for egress -> the chain that decides their new connections")}})
		r.addSet(&Set{Map: &knftables.Map{Name: "ingress-pods" + famSuffix(v4), Type: addrType(v4) + " : verdict",
			Comment: ptr("local pods isolated for ingress -> the chain that decides their new connections")}})
		r.addSet(&Set{Set: &knftables.Set{Name: "self" + famSuffix(v4), Type: addrType(v4) + " . " + addrType(v4),
			Comment: ptr("isolated local pods, twice: a pod can always reach itself")}})
	}
	m := r.cfg.AllowMark
	var fwd []knftables.Rule
	if r.cfg.UsesQueue() {
		fwd = append(fwd, rule(fmt.Sprintf("meta mark & %#08x == %#08x ct mark set ct mark | %#08x meta mark set meta mark & %#08x counter accept",
			m, m, m, ^m), "allowed by the userspace evaluator: remember it in the connection's mark"))
	}
	fwd = append(fwd, rule("ct state established,related accept", ""))
	if r.cfg.UsesQueue() {
		fwd = append(fwd, rule(fmt.Sprintf("ct mark & %#08x == %#08x accept", m, m), "connection allowed earlier by the userspace evaluator"))
	}
	fwd = append(fwd,
		rule("meta l4proto ipv6-icmp icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept", "IPv6 neighbour discovery"),
		rule("ip saddr . ip daddr @self-v4 accept", "a pod can always reach itself"),
		rule("ip6 saddr . ip6 daddr @self-v6 accept", "a pod can always reach itself"),
		rule("ip saddr vmap @egress-pods-v4", ""),
		rule("ip6 saddr vmap @egress-pods-v6", ""),
		rule("jump "+ChainIngress, ""),
	)
	r.addChain(&Chain{Chain: knftables.Chain{Name: ChainIngress, Comment: ptr("new connections to local pods: dispatch by destination")},
		Rules: []knftables.Rule{rule("ip daddr vmap @ingress-pods-v4", ""), rule("ip6 daddr vmap @ingress-pods-v6", "")}})
	if r.cfg.Mode != ModeQueue {
		r.addChain(&Chain{Chain: knftables.Chain{Name: ChainEgressAllow, Comment: ptr("egress allowed: the destination's ingress decides next")},
			Rules: []knftables.Rule{rule("jump "+ChainIngress, ""), rule("accept", "")}})
	}
	if r.cfg.UsesQueue() {
		r.queueChain()
	}
	r.forward = &Chain{Chain: knftables.Chain{Name: ChainForward,
		Type: ptr(knftables.FilterType), Hook: ptr(knftables.ForwardHook), Priority: ptr(knftables.BaseChainPriority(forwardPriority)),
		Policy:  ptr(knftables.AcceptPolicy),
		Comment: ptr("pod traffic after Service DNAT, before SNAT: new connections of isolated local pods")}, Rules: fwd}
}

func (r *renderer) queueChain() {
	c := &Chain{Chain: knftables.Chain{Name: ChainQueue,
		Comment: ptr(fmt.Sprintf("new connections decided by the userspace evaluator (NFQUEUE %s, %s)", r.queueRange(), r.cfg.QueueVariant))}}
	if r.cfg.QueueVariant == QueueXTCompat {
		c.External = true
	} else {
		c.Rules = []knftables.Rule{rule(NativeQueueStatement(r.cfg), "")}
	}
	r.addChain(c)
}

func (r *renderer) queueRange() string {
	if r.cfg.Queues <= 1 {
		return fmt.Sprint(r.cfg.QueueNum)
	}
	return fmt.Sprintf("%d-%d", r.cfg.QueueNum, uint32(r.cfg.QueueNum)+uint32(r.cfg.Queues)-1)
}

// selfElements lists every isolated local pod in the self sets, so that the
// forward chain lets a pod reach itself before any policy is consulted.
func (r *renderer) selfElements() {
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local || (len(pod.IngressPolicies) == 0 && len(pod.EgressPolicies) == 0) {
			continue
		}
		for _, ip := range pod.IPs {
			s := r.rs.Sets["self"+famSuffix(ip.Is4())]
			s.Elements = append(s.Elements, knftables.Element{Key: []string{ip.String(), ip.String()}, Comment: ptr(pod.Key)})
		}
	}
}

func (r *renderer) queueDispatch() {
	r.selfElements()
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local {
			continue
		}
		for _, ip := range pod.IPs {
			if len(pod.EgressPolicies) > 0 {
				r.vmapElement("egress-pods", ip, "goto "+ChainQueue, pod.Key)
			}
			if len(pod.IngressPolicies) > 0 {
				r.vmapElement("ingress-pods", ip, "goto "+ChainQueue, pod.Key)
			}
		}
	}
}

func (r *renderer) vmapElement(prefix string, ip netip.Addr, verdict, comment string) {
	s := r.rs.Sets[prefix+famSuffix(ip.Is4())]
	s.Elements = append(s.Elements, knftables.Element{Key: []string{ip.String()}, Value: []string{verdict}, Comment: truncComment(comment)})
}

func (r *renderer) kernelDispatch() {
	r.selfElements()
	// Policy chains first, in policy order, then one chain per distinct
	// combination of isolating policies.
	used := map[PolicyID][2]bool{}
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local {
			continue
		}
		for _, id := range pod.IngressPolicies {
			u := used[id]
			u[Ingress] = true
			used[id] = u
		}
		for _, id := range pod.EgressPolicies {
			u := used[id]
			u[Egress] = true
			used[id] = u
		}
	}
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
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		if !pod.Local {
			continue
		}
		for _, d := range []Direction{Ingress, Egress} {
			ids := pod.IngressPolicies
			if d == Egress {
				ids = pod.EgressPolicies
			}
			if len(ids) == 0 {
				continue
			}
			name := r.isolationChain(d, ids, hasRules)
			for _, ip := range pod.IPs {
				r.vmapElement(d.String()+"-pods", ip, "jump "+name, pod.Key)
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
	for _, id := range ids {
		if hasRules[id][d] {
			c.Rules = append(c.Rules, rule("jump "+PolicyChainName(&r.prog.Policies[id], d), ""))
		}
	}
	c.Rules = append(c.Rules, rule("counter drop", "default deny "+d.String()+": "+strings.ReplaceAll(keys, ",", ", ")))
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
	peerDir := "saddr"
	if d == Egress {
		peerDir = "daddr"
	}
	for ri, rl := range pol.Rules(d) {
		if rl.MatchesNothing() {
			continue
		}
		base := PolicyChainName(pol, d) + "-" + itoa(ri)
		for _, v4 := range []bool{true, false} {
			// Peers: each alternative is one nft rule.
			var peers []string
			if rl.AllPeers {
				peers = []string{""}
			} else {
				for _, sid := range rl.Selectors {
					set := r.peerSet(sid, v4)
					peers = append(peers, fmt.Sprintf("%s %s @%s ", famWord(v4), peerDir, set))
				}
				if blocks := familyRanges(rl.IPBlocks, v4); len(blocks) > 0 {
					name := base + "-cidrs" + famSuffix(v4)
					s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4), Flags: []knftables.SetFlag{knftables.IntervalFlag},
						Comment: truncComment(rl.Name + " ipBlock peers")}})
					for _, b := range blocks {
						s.Elements = append(s.Elements, knftables.Element{Key: []string{b.String()}})
					}
					peers = append(peers, fmt.Sprintf("%s %s @%s ", famWord(v4), peerDir, name))
				}
			}
			// Ports: each alternative is one nft rule.
			var ports []string
			if rl.AllPorts {
				ports = []string{""}
			} else {
				if len(rl.Ports) > 0 {
					name := base + "-ports"
					s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: "inet_proto . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag},
						Comment: truncComment(rl.Name + " ports")}})
					if len(s.Elements) == 0 {
						for _, p := range rl.Ports {
							s.Elements = append(s.Elements, knftables.Element{Key: []string{p.Protocol.nftName(), portText(p)}})
						}
					}
					ports = append(ports, "meta l4proto . th dport @"+name+" ")
				}
				if len(rl.NamedPorts) > 0 {
					name := base + "-named" + famSuffix(v4)
					r.namedPortSet(name, &rl, pol, d, v4)
					ports = append(ports, fmt.Sprintf("%s daddr . meta l4proto . th dport @%s ", famWord(v4), name))
				}
			}
			for _, pe := range peers {
				for _, po := range ports {
					text := pe + po + "counter " + verdict
					if !hasRule(c.Rules, text) { // family-independent rules come once
						c.Rules = append(c.Rules, rule(text, rl.Name))
					}
				}
			}
		}
	}
	if len(c.Rules) == 0 {
		return false
	}
	r.addChain(c)
	return true
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
	if _, ok := r.rs.Sets[name]; ok {
		return name
	}
	s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4), Comment: truncComment(sel.Description)}})
	for _, pid := range sel.Members {
		pod := &r.prog.Pods[pid]
		for _, ip := range pod.IPs {
			if ip.Is4() == v4 {
				s.Elements = append(s.Elements, knftables.Element{Key: []string{ip.String()}, Comment: truncComment(pod.Key)})
			}
		}
	}
	return name
}

// namedPortSet holds (destination IP, protocol, port) for every pod a named
// port of the rule can resolve on: the local selected pods for ingress; for
// egress the pods among the rule's peers.
func (r *renderer) namedPortSet(name string, rl *Rule, pol *Policy, d Direction, v4 bool) {
	s := r.addSet(&Set{Set: &knftables.Set{Name: name, Type: addrType(v4) + " . inet_proto . inet_service",
		Comment: truncComment(rl.Name + " named ports, resolved per destination pod")}})
	add := func(pid PodID) {
		pod := &r.prog.Pods[pid]
		for _, np := range rl.NamedPorts {
			n, ok := pod.NamedPort(np.Name, np.Protocol)
			if !ok {
				continue
			}
			for _, ip := range pod.IPs {
				if ip.Is4() == v4 {
					s.Elements = append(s.Elements, knftables.Element{Key: []string{ip.String(), np.Protocol.nftName(), itoa(int(n))},
						Comment: truncComment(pod.Key + " " + np.Name)})
				}
			}
		}
	}
	if d == Ingress {
		for _, pid := range pol.Selected {
			add(pid)
		}
		return
	}
	for pid := range r.prog.Pods {
		if r.ruleCoversPod(rl, PodID(pid)) {
			add(PodID(pid))
		}
	}
}

func (r *renderer) ruleCoversPod(rl *Rule, pid PodID) bool {
	if rl.AllPeers {
		return true
	}
	for _, sid := range rl.Selectors {
		if r.prog.Selectors[sid].Contains(pid) {
			return true
		}
	}
	for _, ip := range r.prog.Pods[pid].IPs {
		if rangesContain(rl.IPBlocks, ip) {
			return true
		}
	}
	return false
}
