package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Limits of the ClusterNetworkPolicy API (the CRD's schema).
const (
	MaxClusterRules        = 25
	MaxClusterPeersOrPorts = 25
	MaxClusterRuleName     = 100
	MinClusterPriority     = 0
	MaxClusterPriority     = 1000
)

// buildNodes records every node's labels and addresses. The node the
// program is built for adds its addresses to the program's own node IPs.
func (b *builder) buildNodes(nodes []*corev1.Node) {
	b.prog.NodeAddrs = map[string][]netip.Addr{}
	b.nodeLabels = map[string]labels.Set{}
	for _, n := range nodes {
		if _, dup := b.nodeLabels[n.Name]; dup {
			continue
		}
		b.nodeLabels[n.Name] = labels.Set(n.Labels)
		addrs := nodeAddrs(n)
		b.prog.NodeAddrs[n.Name] = addrs
		if n.Name == b.prog.Node && b.prog.Node != "" {
			for _, a := range addrs {
				if !b.prog.IsNodeIP(a) {
					b.prog.NodeIPs = append(b.prog.NodeIPs, a)
				}
			}
		}
	}
	b.nodeNames = make([]string, 0, len(b.nodeLabels))
	for n := range b.nodeLabels {
		b.nodeNames = append(b.nodeNames, n)
	}
	sort.Strings(b.nodeNames)
}

// nodeAddrs returns the IP addresses in a node's status, sorted, each once.
func nodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		out = appendAddr(out, a.Address) // Hostname and InternalDNS entries do not parse
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

func clusterPolicyLabel(name string, t Tier, prio int32) string {
	return fmt.Sprintf("ClusterNetworkPolicy %s (%s, priority %d)", name, t, prio)
}

// compileClusterPolicies compiles every ClusterNetworkPolicy, sorted by name,
// and lists on each local pod the policies that apply to it, per tier and
// direction, in precedence order.
func (b *builder) compileClusterPolicies(cnps []*npav1beta1.ClusterNetworkPolicy) {
	sorted := append([]*npav1beta1.ClusterNetworkPolicy(nil), cnps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for i, cnp := range sorted {
		if i > 0 && sorted[i-1].Name == cnp.Name {
			continue // duplicate object; the first wins
		}
		b.prog.ClusterPolicies = append(b.prog.ClusterPolicies, b.compileCluster(cnp, true))
	}
	p := b.prog
	for i := range p.ClusterPolicies {
		cp := &p.ClusterPolicies[i]
		p.Problems = append(p.Problems, cp.Problems...)
		for _, pid := range cp.Subjects {
			p.Pods[pid].addClusterPolicy(cp, ClusterPolicyID(i))
		}
	}
	for i := range p.Pods {
		p.orderClusterPolicies(&p.Pods[i])
	}
}

// addClusterPolicy records that the pod is a subject of a
// ClusterNetworkPolicy, in each direction it has rules for.
func (pod *Pod) addClusterPolicy(cp *ClusterPolicy, id ClusterPolicyID) {
	if len(cp.Ingress) > 0 {
		if cp.Tier == TierAdmin {
			pod.AdminIngress = append(pod.AdminIngress, id)
		} else {
			pod.BaselineIngress = append(pod.BaselineIngress, id)
		}
	}
	if len(cp.Egress) > 0 {
		if cp.Tier == TierAdmin {
			pod.AdminEgress = append(pod.AdminEgress, id)
		} else {
			pod.BaselineEgress = append(pod.BaselineEgress, id)
		}
	}
}

// orderClusterPolicies puts a pod's ClusterNetworkPolicies in precedence
// order: priority, then name. The API leaves ties to the implementation;
// by name is deterministic and easy to explain. (A build's IDs are in name
// order; a Tracker's are not once it added a policy.)
func (p *Program) orderClusterPolicies(pod *Pod) {
	byPrio := func(ids []ClusterPolicyID) {
		sort.SliceStable(ids, func(i, j int) bool {
			a, b := &p.ClusterPolicies[ids[i]], &p.ClusterPolicies[ids[j]]
			if a.Priority != b.Priority {
				return a.Priority < b.Priority
			}
			return a.Name < b.Name
		})
	}
	byPrio(pod.AdminIngress)
	byPrio(pod.AdminEgress)
	byPrio(pod.BaselineIngress)
	byPrio(pod.BaselineEgress)
}

// ValidateClusterPolicy reports what the API server (the CRD's schema and
// validation rules) would reject in a ClusterNetworkPolicy, and what
// nftpolicy does not support yet. It resolves nothing.
func ValidateClusterPolicy(cnp *npav1beta1.ClusterNetworkPolicy) []Problem {
	b := newBuilder(Input{})
	b.buildNodes(nil)
	return b.compileCluster(cnp, false).Problems
}

// compileCluster validates one ClusterNetworkPolicy and compiles its rules;
// with resolve, it also resolves subjects and peers.
//
// What cannot be used as written is reported and enforced so that access
// never widens: an Accept rule (or the part of it) that cannot be used
// matches nothing; a Deny or Pass rule that cannot be used denies all
// traffic of its subjects in its direction, as the API prescribes for a peer
// with no field set ("fail closed"). A subject that cannot be parsed applies
// the policy to every pod with its Accept rules off and its Pass rules
// denying; an unknown tier places the policy in the Admin tier the same way.
func (b *builder) compileCluster(cnp *npav1beta1.ClusterNetworkPolicy, resolve bool) ClusterPolicy {
	pr := &problems{policy: cnp.Name, cluster: true}
	spec := field.NewPath("spec")
	cp := ClusterPolicy{Name: cnp.Name, Priority: cnp.Spec.Priority}
	strict := false // Accept rules off, Pass rules deny
	switch cnp.Spec.Tier {
	case npav1beta1.AdminTier:
		cp.Tier = TierAdmin
	case npav1beta1.BaselineTier:
		cp.Tier = TierBaseline
	default:
		pr.add(spec.Child("tier"), "unsupported value %q: must be Admin or Baseline; enforced in the Admin tier with its Accept rules off and its Pass rules denying", cnp.Spec.Tier)
		cp.Tier, strict = TierAdmin, true
	}
	if cp.Priority < MinClusterPriority || cp.Priority > MaxClusterPriority {
		pr.add(spec.Child("priority"), "%d out of range %d-%d; clamped", cp.Priority, MinClusterPriority, MaxClusterPriority)
		cp.Priority = min(max(cp.Priority, MinClusterPriority), MaxClusterPriority)
	}
	cp.Label = clusterPolicyLabel(cp.Name, cp.Tier, cp.Priority)

	subj, ok := b.clusterSubject(pr, spec.Child("subject"), &cnp.Spec.Subject)
	if !ok {
		strict = true
	}
	if resolve {
		b.subjects = append(b.subjects, subj)
		for i := range b.prog.Pods {
			pod := &b.prog.Pods[i]
			if pod.Local && subj.matches(b, pod) {
				cp.Subjects = append(cp.Subjects, PodID(i))
			}
		}
	}
	id := ClusterPolicyID(len(b.prog.ClusterPolicies))
	const enforced = "its Accept rules match nothing and its Deny and Pass rules deny all traffic of its subjects (fail closed)"
	cost := ClusterPolicyCost(cnp)
	if cost > MaxPolicyCost {
		pr.rejectCost(cost, enforced)
		cp.Rejected, cp.RejectedFor = true, RejectedCost
	} else if resolve && b.metered && !b.chargeClusterBudget(cnp, &cp, cost) {
		pr.add(spec, "too costly to build: what it makes (entries, pods and nodes its selectors are matched against, peer set elements) passed its budget of %d; %s",
			b.budgets.ClusterPolicy, enforced)
		cp.Rejected, cp.RejectedFor = true, RejectedBudget
	}
	if cp.Rejected {
		for i, r := range cnp.Spec.Ingress {
			cp.Ingress = append(cp.Ingress, rejectedClusterRule(&cp, id, Ingress, i, r.Name, r.Action))
		}
		for i, r := range cnp.Spec.Egress {
			cp.Egress = append(cp.Egress, rejectedClusterRule(&cp, id, Egress, i, r.Name, r.Action))
		}
		cp.Problems = pr.list
		return cp
	}
	if len(cnp.Spec.Ingress) > MaxClusterRules {
		pr.add(spec.Child("ingress"), "%d rules, more than %d; all are enforced", len(cnp.Spec.Ingress), MaxClusterRules)
	}
	if len(cnp.Spec.Egress) > MaxClusterRules {
		pr.add(spec.Child("egress"), "%d rules, more than %d; all are enforced", len(cnp.Spec.Egress), MaxClusterRules)
	}
	for i, r := range cnp.Spec.Ingress {
		peers := make([]npav1beta1.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		cr := b.compileClusterRule(pr, &cp, id, Ingress, i, spec.Child("ingress").Index(i), r.Name, r.Action, peers, r.Protocols, resolve)
		cp.Ingress = append(cp.Ingress, cr)
	}
	for i, r := range cnp.Spec.Egress {
		cr := b.compileClusterRule(pr, &cp, id, Egress, i, spec.Child("egress").Index(i), r.Name, r.Action, r.To, r.Protocols, resolve)
		cp.Egress = append(cp.Egress, cr)
	}
	if strict {
		for _, rules := range [][]ClusterRule{cp.Ingress, cp.Egress} {
			for j := range rules {
				switch rules[j].Action {
				case ActionAccept:
					rules[j].Disabled = true
				case ActionPass:
					rules[j].Action = ActionDeny
					rules[j].Reason = clusterReason(&cp, &rules[j])
				}
			}
		}
	}
	cp.Problems = pr.list
	return cp
}

// clusterSubject is a parsed subject: a namespace selector and, for pods
// subjects, a pod selector.
type clusterSubject struct {
	ns, pods labels.Selector
	all      bool
}

func (s clusterSubject) matches(b *builder, pod *Pod) bool {
	return s.matchesLabels(b.namespaceLabels(pod.Namespace), pod.Labels)
}

func (s clusterSubject) matchesLabels(ns labels.Set, pod map[string]string) bool {
	if s.all {
		return true
	}
	if !s.ns.Matches(ns) {
		return false
	}
	return s.pods == nil || s.pods.Matches(labels.Set(pod))
}

func (b *builder) clusterSubject(pr *problems, path *field.Path, s *npav1beta1.ClusterNetworkPolicySubject) (clusterSubject, bool) {
	fail := func(format string, args ...any) (clusterSubject, bool) {
		pr.add(path, format+"; the policy applies to every pod with its Accept rules off and its Pass rules denying", args...)
		return clusterSubject{all: true}, false
	}
	switch {
	case s.Namespaces != nil && s.Pods != nil:
		return fail("exactly one of namespaces and pods must be set")
	case s.Namespaces != nil:
		ns, ok := pr.parseSelector(path.Child("namespaces"), s.Namespaces)
		if !ok {
			return fail("invalid namespace selector")
		}
		return clusterSubject{ns: ns}, true
	case s.Pods != nil:
		ns, ok1 := pr.parseSelector(path.Child("pods", "namespaceSelector"), &s.Pods.NamespaceSelector)
		pods, ok2 := pr.parseSelector(path.Child("pods", "podSelector"), &s.Pods.PodSelector)
		if !ok1 || !ok2 {
			return fail("invalid selector")
		}
		return clusterSubject{ns: ns, pods: pods}, true
	}
	return fail("exactly one of namespaces and pods must be set")
}

func clusterReason(cp *ClusterPolicy, r *ClusterRule) string {
	verb := "allowed"
	switch r.Action {
	case ActionDeny:
		verb = "denied"
	case ActionPass:
		verb = "passed"
	}
	return verb + " by " + cp.Label + " " + r.Direction.String() + " rule " + r.Name
}

func (b *builder) compileClusterRule(pr *problems, cp *ClusterPolicy, pol ClusterPolicyID, dir Direction, idx int, path *field.Path,
	name string, action npav1beta1.ClusterNetworkPolicyRuleAction, peers []npav1beta1.ClusterNetworkPolicyEgressPeer,
	protos []npav1beta1.ClusterNetworkPolicyProtocol, resolve bool) ClusterRule {
	r := ClusterRule{Policy: pol, Direction: dir, Index: idx, Name: name}
	if name == "" {
		r.Name = "#" + itoa(idx)
	}
	if len(name) > MaxClusterRuleName {
		pr.add(path.Child("name"), "longer than %d characters", MaxClusterRuleName)
	}
	var known bool
	r.Action, known = clusterRuleAction(action)
	broken := !known // the rule cannot be used as written
	if broken {
		pr.add(path.Child("action"), "unsupported value %q: must be Accept, Deny or Pass; the rule denies all traffic", action)
	}
	// failPart records a part that cannot be used: for Accept it matches
	// nothing, for Deny and Pass the whole rule fails closed.
	failPart := func(p *field.Path, format string, args ...any) {
		if r.Action == ActionAccept {
			pr.add(p, format+"; this part matches nothing", args...)
			return
		}
		pr.add(p, format+"; the rule denies all traffic (fail closed)", args...)
		broken = true
	}
	peerField := "from"
	if dir == Egress {
		peerField = "to"
	}
	if len(peers) == 0 {
		failPart(path.Child(peerField), "must list at least one peer")
	}
	if len(peers) > MaxClusterPeersOrPorts {
		pr.add(path.Child(peerField), "%d peers, more than %d; all are enforced", len(peers), MaxClusterPeersOrPorts)
	}
	hasAddrPeer := false
	var blocks []IPRange
	for i := range peers {
		b.clusterPeer(pr, &r, path.Child(peerField).Index(i), &peers[i], resolve, failPart, &blocks, &hasAddrPeer, cp)
	}
	r.IPBlocks = normalizeRanges(blocks)
	r.Domains = sortDomains(r.Domains)

	r.AllPorts = len(protos) == 0
	var seenNamed map[NamedPortRef]bool
	if len(protos) > MaxClusterPeersOrPorts {
		pr.add(path.Child("protocols"), "%d entries, more than %d; all are enforced", len(protos), MaxClusterPeersOrPorts)
	}
	for i := range protos {
		pp := path.Child("protocols").Index(i)
		pe := &protos[i]
		set := 0
		for _, x := range []bool{pe.TCP != nil, pe.UDP != nil, pe.SCTP != nil, pe.DestinationNamedPort != ""} {
			if x {
				set++
			}
		}
		if set != 1 {
			failPart(pp, "exactly one of tcp, udp, sctp and destinationNamedPort must be set")
			continue
		}
		if pe.DestinationNamedPort != "" {
			if msgs := validation.IsValidPortName(pe.DestinationNamedPort); len(msgs) > 0 {
				failPart(pp.Child("destinationNamedPort"), "invalid port name %q: %s", pe.DestinationNamedPort, strings.Join(msgs, "; "))
				continue
			}
			if hasAddrPeer {
				pr.add(pp.Child("destinationNamedPort"), "cannot be used with networks, nodes or domainNames peers, which have no named ports; it matches only pods")
			}
			r.NamedPorts = appendNew(r.NamedPorts, &seenNamed, NamedPortRef{Name: pe.DestinationNamedPort})
			continue
		}
		proto, dp, child := ProtoTCP, (*npav1beta1.Port)(nil), "tcp"
		switch {
		case pe.TCP != nil:
			dp = pe.TCP.DestinationPort
		case pe.UDP != nil:
			proto, dp, child = ProtoUDP, pe.UDP.DestinationPort, "udp"
		default:
			proto, dp, child = ProtoSCTP, pe.SCTP.DestinationPort, "sctp"
		}
		if rng, ok := clusterPort(pp.Child(child, "destinationPort"), dp, failPart); ok {
			rng.Protocol = proto
			r.Ports = append(r.Ports, rng)
		}
	}
	r.Ports = normalizePorts(r.Ports)

	if broken {
		r.Match = Match{AllPeers: true, AllPorts: true}
		r.Action = ActionDeny
	}
	r.Reason = clusterReason(cp, &r)
	return r
}

// clusterRuleAction is a rule's action; an unknown one denies (false).
func clusterRuleAction(a npav1beta1.ClusterNetworkPolicyRuleAction) (Action, bool) {
	switch a {
	case npav1beta1.ClusterNetworkPolicyRuleActionAccept:
		return ActionAccept, true
	case npav1beta1.ClusterNetworkPolicyRuleActionDeny:
		return ActionDeny, true
	case npav1beta1.ClusterNetworkPolicyRuleActionPass:
		return ActionPass, true
	}
	return ActionDeny, false
}

// clusterPort validates a destinationPort. Without one the entry matches
// every port of the protocol (the CRD requires one; older or newer schemas
// may not).
func clusterPort(path *field.Path, dp *npav1beta1.Port, failPart func(*field.Path, string, ...any)) (PortRange, bool) {
	if dp == nil {
		return PortRange{First: 0, Last: 65535}, true
	}
	valid := func(p int32) bool { return p >= 1 && p <= 65535 }
	switch {
	case dp.Number != 0 && dp.Range != nil:
		failPart(path, "exactly one of number and range must be set")
	case dp.Range != nil:
		s, e := dp.Range.Start, dp.Range.End
		if !valid(s) || !valid(e) {
			failPart(path.Child("range"), "ports must be between 1 and 65535")
		} else if s >= e {
			failPart(path.Child("range"), "start %d must be less than end %d", s, e)
		} else {
			return PortRange{First: uint16(s), Last: uint16(e)}, true
		}
	case valid(dp.Number):
		return PortRange{First: uint16(dp.Number), Last: uint16(dp.Number)}, true
	default:
		failPart(path.Child("number"), "%d is not a port between 1 and 65535", dp.Number)
	}
	return PortRange{}, false
}

// clusterPeer compiles one peer into the rule's match.
func (b *builder) clusterPeer(pr *problems, r *ClusterRule, path *field.Path, peer *npav1beta1.ClusterNetworkPolicyEgressPeer, resolve bool,
	failPart func(*field.Path, string, ...any), blocks *[]IPRange, hasAddrPeer *bool, cp *ClusterPolicy) {
	set := 0
	for _, x := range []bool{peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, peer.Networks != nil, peer.DomainNames != nil} {
		if x {
			set++
		}
	}
	if set != 1 {
		// The API: a peer with no field set (a field this version does not
		// know) fails closed.
		failPart(path, "exactly one peer field must be set (%d are)", set)
		return
	}
	addSel := func(id SelectorID) {
		if !slices.Contains(r.Selectors, id) {
			r.Selectors = append(r.Selectors, id)
		}
		if resolve {
			s := &b.prog.Selectors[id]
			s.Users = append(s.Users, cp.Name+" "+r.Direction.String()+" "+r.Name)
		}
	}
	switch {
	case peer.Namespaces != nil:
		ns, ok := pr.parseSelector(path.Child("namespaces"), peer.Namespaces)
		if !ok {
			failPart(path.Child("namespaces"), "invalid selector")
			return
		}
		if resolve {
			addSel(b.internSelector("", ns, labels.Everything()))
		}
	case peer.Pods != nil:
		ns, ok1 := pr.parseSelector(path.Child("pods", "namespaceSelector"), &peer.Pods.NamespaceSelector)
		pods, ok2 := pr.parseSelector(path.Child("pods", "podSelector"), &peer.Pods.PodSelector)
		if !ok1 || !ok2 {
			failPart(path.Child("pods"), "invalid selector")
			return
		}
		if resolve {
			addSel(b.internSelector("", ns, pods))
		}
	case peer.Nodes != nil:
		*hasAddrPeer = true
		sel, ok := pr.parseSelector(path.Child("nodes"), peer.Nodes)
		if !ok {
			failPart(path.Child("nodes"), "invalid selector")
			return
		}
		if resolve {
			id := b.nodeSet(sel)
			if !slices.Contains(r.Nodes, id) {
				r.Nodes = append(r.Nodes, id)
			}
		}
	case peer.Networks != nil:
		*hasAddrPeer = true
		if len(peer.Networks) == 0 {
			failPart(path.Child("networks"), "must list at least one CIDR")
			return
		}
		for i, c := range peer.Networks {
			p, err := parseCIDR(string(c))
			if err != nil {
				failPart(path.Child("networks").Index(i), "%v", err)
				continue
			}
			if raw, err := netip.ParsePrefix(string(c)); err == nil && raw != raw.Masked() {
				// The CRD rejects it; what is stored anyway means the masked block.
				pr.add(path.Child("networks").Index(i), "%s must not have bits set beyond the prefix length; enforced as %s", c, p)
			}
			*blocks = append(*blocks, blockRanges(p, nil)...)
		}
	default:
		*hasAddrPeer = true
		clusterDomainPeer(r, path.Child("domainNames"), peer.DomainNames, failPart)
	}
}

// nodeSet interns a nodes peer: the addresses of the nodes whose labels match.
func (b *builder) nodeSet(sel labels.Selector) NodeSetID {
	key := "nodes=" + sel.String()
	if id, ok := b.nodeSets[key]; ok {
		return id
	}
	desc := "all nodes"
	if !sel.Empty() {
		desc = "nodes with " + sel.String()
	}
	ns := NodeSet{Key: key, Description: desc}
	for _, n := range b.nodeNames {
		if sel.Matches(b.nodeLabels[n]) {
			ns.Nodes = append(ns.Nodes, n)
			ns.Addrs = append(ns.Addrs, b.prog.NodeAddrs[n]...)
		}
	}
	sort.Slice(ns.Addrs, func(i, j int) bool { return ns.Addrs[i].Less(ns.Addrs[j]) })
	ns.Addrs = dedupAddrs(ns.Addrs)
	id := NodeSetID(len(b.prog.NodeSets))
	b.prog.NodeSets = append(b.prog.NodeSets, ns)
	b.nodeSets[key] = id
	return id
}

func dedupAddrs(s []netip.Addr) []netip.Addr {
	out := s[:0]
	for i, a := range s {
		if i == 0 || a != s[i-1] {
			out = append(out, a)
		}
	}
	return out
}
