package compile

import (
	"math/bits"
	"net/netip"
	"sort"
	"strings"
)

// EvalIndex is the program laid out for the userspace evaluator. It holds
// nothing the rest of the program does not: it is a second, denser layout
// of the same pods, decision tables and ClusterNetworkPolicy rules, built by
// Build from them, so that a verdict reads a few cache lines instead of
// following pointers through the general-purpose structures.
//
// Variable-length lists live in shared pools and are referenced by Span;
// every slice here is indexed by the IDs of the program (PodID, table index,
// ClusterPolicyID).
type EvalIndex struct {
	// Pods holds one record per pod, by PodID.
	Pods []PodRecord
	// Members is the pool of the pods' selector memberships (Pod.MemberOf
	// of every pod points into it).
	Members []SelectorID
	// PodPorts is the pool of the pods' container ports whose names some
	// rule uses, in the pods' order.
	PodPorts []EvalPodPort
	// TierSets holds the distinct ClusterNetworkPolicy lists of the pods;
	// TierPolicies and TierRules are their pools.
	TierSets     []TierSet
	TierPolicies []ClusterPolicyID
	TierRules    []EvalClusterRule

	// Tables holds one entry per Program.Tables entry.
	Tables []EvalTable
	// Rules is the pool of the tables' rules; each table's run is sorted by
	// Rule.Order, so a smaller index in a run is an earlier rule.
	Rules []EvalRule
	// TableData holds each table's ways in, one table after the other, so
	// that a verdict reads them from a line or two: the table-relative
	// indices of the rules that match any peer, then of those with address
	// peers (each in rule order), then (selector, rule) pairs sorted by
	// selector, then rule.
	TableData []int32

	// ClusterSelectors is the pool of the cluster rules' selector peers.
	ClusterSelectors []SelectorID

	// Spills holds the lists of the matches that do not fit in EvalMatch;
	// Ports, Named and Ranges4 are their pools.
	Spills  []EvalSpill
	Ports   []PortRange
	Named   []EvalNamedPort
	Ranges4 []Range4

	// V4 is an open-addressed hash table from IPv4 pod address to pod:
	// 8 bytes a slot, at most half full, so a lookup reads one cache line.
	V4 []AddrSlot
	// V4Shift turns a 32-bit hash into a slot index of V4.
	V4Shift uint8
	// V6 maps the other pod addresses (IPv6 without zone) to their pods;
	// Zoned maps addresses with a zone, which no packet carries.
	V6    map[[16]byte]PodID
	Zoned map[netip.Addr]PodID
}

// Span is a run of elements in one of EvalIndex's pools.
type Span struct{ Off, Len uint32 }

func (s Span) end() uint32 { return s.Off + s.Len }

// PodRecord is what a verdict reads about a pod, in 64 bytes: one cache
// line once there are more than 512 pods (the records are then one
// page-aligned allocation).
type PodRecord struct {
	// IngressTable and EgressTable index Program.Tables and EvalIndex.Tables
	// (-1: not isolated by a NetworkPolicy in that direction).
	IngressTable, EgressTable int32
	// Members is the pod's MemberOf in EvalIndex.Members.
	Members Span
	// Ports are the pod's named container ports in EvalIndex.PodPorts.
	Ports Span
	// Tiers indexes EvalIndex.TierSets (-1: no ClusterNetworkPolicy has the
	// pod as a subject).
	Tiers int32
	// Local is Pod.Local.
	Local bool
	// IngressDenied and EgressDenied are Pod.IngressDenied and
	// Pod.EgressDenied.
	IngressDenied, EgressDenied string
}

// Table returns the pod's decision table index in one direction.
func (r *PodRecord) Table(d Direction) int32 {
	if d == Egress {
		return r.EgressTable
	}
	return r.IngressTable
}

// EvalPodPort is a named container port; Name is an interned name index.
type EvalPodPort struct {
	Name     int32
	Port     uint16
	Protocol Protocol
}

// EvalNamedPort is a rule's named port; Name is an interned name index.
type EvalNamedPort struct {
	Name     int32
	Protocol Protocol
}

// Range4 is an inclusive range of IPv4 addresses as integers.
type Range4 struct{ From, To uint32 }

// AddrSlot is a slot of EvalIndex.V4. Pod is the PodID plus one; 0 marks an
// empty slot.
type AddrSlot struct {
	Addr uint32
	Pod  int32
}

// TierSet is a pod's ClusterNetworkPolicies per tier and direction, in the
// order of TierList: the policies in precedence order (runs of
// EvalIndex.TierPolicies), and their usable rules one after the other, in
// the order a tier walks them (runs of EvalIndex.TierRules).
type TierSet struct {
	Policies [4]Span
	Rules    [4]Span
}

// TierList is the position of a tier and direction in TierSet's arrays:
// Admin ingress, Admin egress, Baseline ingress, Baseline egress.
func TierList(t Tier, d Direction) int {
	if t == TierBaseline {
		return 2 + int(d)
	}
	return int(d)
}

// EvalMatch is a Match laid out for the evaluator, in 56 bytes: up to two
// port ranges, two named ports and two IPv4 ranges are held inline (most
// rules), so that checking a rule reads the rule's cache line only. A match
// with longer lists holds them all in EvalIndex.Spills[Spill] instead. The
// IPv6 part of the address peers is read from the rule itself.
type EvalMatch struct {
	Ports                    [evalInline]PortRange
	NPorts, NNamed, NRanges4 uint8
	// HasRanges6 is set when IPBlocks holds IPv6 ranges.
	HasRanges6 bool
	AllPeers   bool
	AllPorts   bool
	Named      [evalInline]EvalNamedPort
	// Ranges4 are the IPv4 ranges of IPBlocks.
	Ranges4 [evalInline]Range4
	// Spill indexes EvalIndex.Spills; -1 when the lists are inline.
	Spill int32
}

// evalInline is how many entries of each list EvalMatch holds inline.
const evalInline = 2

// EvalSpill is the lists of a match too long to be held inline, as runs of
// EvalIndex.Ports, Named and Ranges4.
type EvalSpill struct {
	Ports, Named, Ranges4 Span
}

// EvalRule is a NetworkPolicy rule of a decision table: 64 bytes, one
// cache line.
type EvalRule struct {
	Rule *Rule
	EvalMatch
}

// EvalTable is a decision table: its rules are a run of EvalIndex.Rules,
// its ways in a run of EvalIndex.TableData.
type EvalTable struct {
	Rules uint32 // offset of the table's run in EvalIndex.Rules
	Data  uint32 // offset of the table's run in EvalIndex.TableData
	// NAnyPeer, NBlocks and NBySelector count the entries of each part.
	NAnyPeer, NBlocks, NBySelector uint32
}

// AnyPeer returns the table-relative indices of the rules that match every
// peer, in rule order.
func (x *EvalIndex) AnyPeer(t *EvalTable) []int32 {
	return x.TableData[t.Data : t.Data+t.NAnyPeer]
}

// Blocks returns the table-relative indices of the rules with address peers,
// in rule order.
func (x *EvalIndex) Blocks(t *EvalTable) []int32 {
	o := t.Data + t.NAnyPeer
	return x.TableData[o : o+t.NBlocks]
}

// BySelector returns the table's (selector, table-relative rule) pairs,
// flattened: selector at even positions, sorted by selector, then rule.
func (x *EvalIndex) BySelector(t *EvalTable) []int32 {
	o := t.Data + t.NAnyPeer + t.NBlocks
	return x.TableData[o : o+2*t.NBySelector]
}

// EvalClusterRule is a usable ClusterNetworkPolicy rule.
type EvalClusterRule struct {
	Rule *ClusterRule
	// Reason is Rule.Reason.
	Reason    string
	Selectors Span // in EvalIndex.ClusterSelectors
	EvalMatch
	// HasNodes is set when the rule has `nodes` peers (read from Rule).
	HasNodes bool
	Action   Action
}

// PodByAddr returns the pod that owns the address.
func (x *EvalIndex) PodByAddr(ip netip.Addr) (PodID, bool) {
	if ip.Is4() {
		if len(x.V4) == 0 {
			return 0, false
		}
		a4 := ip.As4()
		a := uint32(a4[0])<<24 | uint32(a4[1])<<16 | uint32(a4[2])<<8 | uint32(a4[3])
		mask := uint32(len(x.V4) - 1)
		for i := hash4(a, x.V4Shift); ; i = (i + 1) & mask {
			s := &x.V4[i]
			if s.Pod == 0 {
				return 0, false
			}
			if s.Addr == a {
				return PodID(s.Pod - 1), true
			}
		}
	}
	if ip.Zone() != "" {
		id, ok := x.Zoned[ip]
		return id, ok
	}
	id, ok := x.V6[ip.As16()]
	return id, ok
}

// hash4 spreads consecutive addresses over the table (Fibonacci hashing).
func hash4(a uint32, shift uint8) uint32 { return (a * 0x9E3779B1) >> shift }

// MemberOf returns a pod's selector memberships, sorted.
func (x *EvalIndex) MemberOf(r *PodRecord) []SelectorID {
	return x.Members[r.Members.Off:r.Members.end()]
}

// InSelector reports whether the pod belongs to the selector peer set.
func (x *EvalIndex) InSelector(r *PodRecord, id SelectorID) bool {
	m := x.MemberOf(r)
	if len(m) <= 16 {
		for _, s := range m {
			if s == id {
				return true
			}
		}
		return false
	}
	i := sort.Search(len(m), func(i int) bool { return m[i] >= id })
	return i < len(m) && m[i] == id
}

// ClusterPolicies returns the pod's ClusterNetworkPolicies of one tier and
// direction, in precedence order.
func (x *EvalIndex) ClusterPolicies(r *PodRecord, t Tier, d Direction) []ClusterPolicyID {
	if r.Tiers < 0 {
		return nil
	}
	s := x.TierSets[r.Tiers].Policies[TierList(t, d)]
	return x.TierPolicies[s.Off:s.end()]
}

// TierRulesOf returns the usable rules of the pod's ClusterNetworkPolicies of
// one tier and direction: policies in precedence order, each policy's rules
// in written order. The first that matches decides.
func (x *EvalIndex) TierRulesOf(r *PodRecord, t Tier, d Direction) []EvalClusterRule {
	if r.Tiers < 0 {
		return nil
	}
	s := x.TierSets[r.Tiers].Rules[TierList(t, d)]
	return x.TierRules[s.Off:s.end()]
}

// ContainsAddr reports whether the rule's address peers contain ip; the
// IPv6 ranges are read from the rule's Match.
func (x *EvalIndex) ContainsAddr(m *EvalMatch, rule *Match, ip netip.Addr) bool {
	if ip.Is4() {
		rs := m.Ranges4[:m.NRanges4]
		if m.Spill >= 0 {
			s := x.Spills[m.Spill].Ranges4
			rs = x.Ranges4[s.Off:s.end()]
		}
		if len(rs) == 0 {
			return false
		}
		a4 := ip.As4()
		a := uint32(a4[0])<<24 | uint32(a4[1])<<16 | uint32(a4[2])<<8 | uint32(a4[3])
		for _, r := range rs {
			if a <= r.To {
				return r.From <= a
			}
		}
		return false
	}
	return m.HasRanges6 && rangesContain(rule.IPBlocks, ip)
}

// PortMatches checks the destination protocol and port; named ports resolve
// on the destination pod (nil when the destination is not a pod).
func (x *EvalIndex) PortMatches(m *EvalMatch, dst *PodRecord, proto Protocol, port uint16) bool {
	if m.AllPorts {
		return true
	}
	ports, named := m.Ports[:m.NPorts], m.Named[:m.NNamed]
	if m.Spill >= 0 {
		s := &x.Spills[m.Spill]
		ports, named = x.Ports[s.Ports.Off:s.Ports.end()], x.Named[s.Named.Off:s.Named.end()]
	}
	for _, pr := range ports {
		if pr.Protocol == proto && pr.First <= port && port <= pr.Last {
			return true
		}
	}
	if dst == nil || len(named) == 0 || dst.Ports.Len == 0 {
		return false
	}
	pods := x.PodPorts[dst.Ports.Off:dst.Ports.end()]
	for _, np := range named {
		if np.Protocol != 0 && np.Protocol != proto {
			continue
		}
		// The first container port with the name and protocol counts, as
		// in Pod.NamedPort.
		for _, pp := range pods {
			if pp.Name == np.Name && pp.Protocol == proto {
				if pp.Port == port {
					return true
				}
				break
			}
		}
	}
	return false
}

// indexer builds an EvalIndex.
type indexer struct {
	p     *Program
	x     *EvalIndex
	names map[string]int32
	// crules holds the usable rules of every ClusterNetworkPolicy;
	// cdirs[2*id+direction] is one policy's run in one direction.
	crules []EvalClusterRule
	cdirs  []Span
}

// buildEvalIndex lays the built program out for the evaluator. The pods'
// MemberOf and ClusterNetworkPolicy lists are moved into the shared pools
// (same contents, one allocation for all pods instead of one per pod).
func (p *Program) buildEvalIndex() {
	ix := &indexer{p: p, x: &p.Eval, names: map[string]int32{}}
	ix.internRuleNames()
	ix.tables()
	ix.clusterRules()
	ix.pods()
}

func (ix *indexer) intern(name string) int32 {
	if id, ok := ix.names[name]; ok {
		return id
	}
	id := int32(len(ix.names))
	ix.names[name] = id
	return id
}

// internRuleNames numbers the port names rules use; pod ports with other
// names can never match and are left out of the index.
func (ix *indexer) internRuleNames() {
	add := func(m *Match) {
		for _, np := range m.NamedPorts {
			ix.intern(np.Name)
		}
	}
	for _, d := range []Direction{Ingress, Egress} {
		for i := range ix.p.Policies {
			for j, rules := 0, ix.p.Policies[i].Rules(d); j < len(rules); j++ {
				add(&rules[j].Match)
			}
		}
		for i := range ix.p.ClusterPolicies {
			for j, rules := 0, ix.p.ClusterPolicies[i].Rules(d); j < len(rules); j++ {
				add(&rules[j].Match)
			}
		}
	}
}

func (ix *indexer) match(m *Match) EvalMatch {
	x := ix.x
	em := EvalMatch{AllPeers: m.AllPeers, AllPorts: m.AllPorts, Spill: -1}
	named := make([]EvalNamedPort, 0, len(m.NamedPorts))
	for _, np := range m.NamedPorts {
		named = append(named, EvalNamedPort{Name: ix.intern(np.Name), Protocol: np.Protocol})
	}
	var ranges []Range4
	for _, r := range m.IPBlocks {
		if !r.From.Is4() {
			em.HasRanges6 = true
			continue
		}
		ranges = append(ranges, Range4{From: addr4(r.From), To: addr4(r.To)})
	}
	if len(m.Ports) <= evalInline && len(named) <= evalInline && len(ranges) <= evalInline {
		em.NPorts = uint8(copy(em.Ports[:], m.Ports))
		em.NNamed = uint8(copy(em.Named[:], named))
		em.NRanges4 = uint8(copy(em.Ranges4[:], ranges))
		return em
	}
	sp := EvalSpill{
		Ports:   Span{Off: uint32(len(x.Ports)), Len: uint32(len(m.Ports))},
		Named:   Span{Off: uint32(len(x.Named)), Len: uint32(len(named))},
		Ranges4: Span{Off: uint32(len(x.Ranges4)), Len: uint32(len(ranges))},
	}
	x.Ports = append(x.Ports, m.Ports...)
	x.Named = append(x.Named, named...)
	x.Ranges4 = append(x.Ranges4, ranges...)
	em.Spill = int32(len(x.Spills))
	x.Spills = append(x.Spills, sp)
	return em
}

func addr4(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// tables lays out every decision table: its distinct rules in rule order,
// then the three ways in, by table-relative index.
func (ix *indexer) tables() {
	x := ix.x
	x.Tables = make([]EvalTable, len(ix.p.Tables))
	for ti := range ix.p.Tables {
		t := &ix.p.Tables[ti]
		var rules []*Rule
		seen := map[*Rule]bool{}
		add := func(r *Rule) {
			if !seen[r] {
				seen[r] = true
				rules = append(rules, r)
			}
		}
		for _, r := range t.AnyPeer {
			add(r)
		}
		for _, sr := range t.BySelector {
			add(sr.Rule)
		}
		for _, r := range t.Blocks {
			add(r)
		}
		sort.Slice(rules, func(i, j int) bool { return rules[i].Order < rules[j].Order })
		local := make(map[*Rule]int32, len(rules))
		et := EvalTable{Rules: uint32(len(x.Rules)), Data: uint32(len(x.TableData)),
			NAnyPeer: uint32(len(t.AnyPeer)), NBlocks: uint32(len(t.Blocks)), NBySelector: uint32(len(t.BySelector))}
		for i, r := range rules {
			local[r] = int32(i)
			x.Rules = append(x.Rules, EvalRule{Rule: r, EvalMatch: ix.match(&r.Match)})
		}
		for _, r := range append(t.AnyPeer[:len(t.AnyPeer):len(t.AnyPeer)], t.Blocks...) {
			x.TableData = append(x.TableData, local[r])
		}
		for _, sr := range t.BySelector {
			x.TableData = append(x.TableData, int32(sr.Selector), local[sr.Rule])
		}
		x.Tables[ti] = et
	}
}

// clusterRules lays out the usable rules of every ClusterNetworkPolicy.
func (ix *indexer) clusterRules() {
	x := ix.x
	ix.cdirs = make([]Span, 2*len(ix.p.ClusterPolicies))
	for i := range ix.p.ClusterPolicies {
		cp := &ix.p.ClusterPolicies[i]
		for _, d := range []Direction{Ingress, Egress} {
			s := Span{Off: uint32(len(ix.crules))}
			rules := cp.Rules(d)
			for j := range rules {
				r := &rules[j]
				if r.Disabled {
					continue
				}
				sels := Span{Off: uint32(len(x.ClusterSelectors)), Len: uint32(len(r.Selectors))}
				x.ClusterSelectors = append(x.ClusterSelectors, r.Selectors...)
				ix.crules = append(ix.crules, EvalClusterRule{
					Rule: r, Reason: r.Reason, Selectors: sels, EvalMatch: ix.match(&r.Match),
					HasNodes: len(r.Nodes) > 0, Action: r.Action,
				})
			}
			s.Len = uint32(len(ix.crules)) - s.Off
			ix.cdirs[2*i+int(d)] = s
		}
	}
}

// pods writes the pod records, the pools they point into and the address
// tables.
func (ix *indexer) pods() {
	p, x := ix.p, ix.x
	x.Pods = make([]PodRecord, len(p.Pods))
	nMembers, nV4 := 0, 0
	for i := range p.Pods {
		nMembers += len(p.Pods[i].MemberOf)
		for _, a := range p.Pods[i].IPs {
			if a.Is4() {
				nV4++
			}
		}
	}
	x.Members = make([]SelectorID, 0, nMembers)
	size := 8
	for size < 2*nV4 {
		size *= 2
	}
	x.V4 = make([]AddrSlot, size)
	x.V4Shift = uint8(32 - bits.TrailingZeros(uint(size)))
	tierSets := map[string]int32{}
	for i := range p.Pods {
		pod := &p.Pods[i]
		r := PodRecord{IngressTable: pod.IngressTable, EgressTable: pod.EgressTable, Local: pod.Local,
			IngressDenied: pod.IngressDenied, EgressDenied: pod.EgressDenied}
		r.Members = Span{Off: uint32(len(x.Members)), Len: uint32(len(pod.MemberOf))}
		x.Members = append(x.Members, pod.MemberOf...)
		pod.MemberOf = x.Members[r.Members.Off:r.Members.end():r.Members.end()]
		if len(pod.MemberOf) == 0 {
			pod.MemberOf = nil
		}
		r.Ports.Off = uint32(len(x.PodPorts))
		for _, cp := range pod.Ports {
			if id, ok := ix.names[cp.Name]; ok {
				x.PodPorts = append(x.PodPorts, EvalPodPort{Name: id, Port: cp.Port, Protocol: cp.Protocol})
			}
		}
		r.Ports.Len = uint32(len(x.PodPorts)) - r.Ports.Off
		r.Tiers = ix.tierSet(tierSets, pod)
		x.Pods[i] = r
		for _, a := range pod.IPs {
			ix.addAddr(a, PodID(i))
		}
	}
}

// tierSet returns the index of the pod's ClusterNetworkPolicy lists, shared
// by every pod with the same lists.
func (ix *indexer) tierSet(seen map[string]int32, pod *Pod) int32 {
	lists := [4]*[]ClusterPolicyID{&pod.AdminIngress, &pod.AdminEgress, &pod.BaselineIngress, &pod.BaselineEgress}
	var key strings.Builder
	for i, l := range lists {
		if i > 0 {
			key.WriteByte('|')
		}
		for j, id := range *l {
			if j > 0 {
				key.WriteByte(',')
			}
			key.WriteString(itoa(int(id)))
		}
	}
	if key.Len() == 3 {
		return -1 // no list
	}
	x := ix.x
	id, ok := seen[key.String()]
	if !ok {
		var ts TierSet
		for i, l := range lists {
			ts.Policies[i] = Span{Off: uint32(len(x.TierPolicies)), Len: uint32(len(*l))}
			x.TierPolicies = append(x.TierPolicies, *l...)
			d := Direction(i % 2)
			ts.Rules[i].Off = uint32(len(x.TierRules))
			for _, cid := range *l {
				s := ix.cdirs[2*int(cid)+int(d)]
				x.TierRules = append(x.TierRules, ix.crules[s.Off:s.end()]...)
			}
			ts.Rules[i].Len = uint32(len(x.TierRules)) - ts.Rules[i].Off
		}
		id = int32(len(x.TierSets))
		x.TierSets = append(x.TierSets, ts)
		seen[key.String()] = id
	}
	return id
}

func (ix *indexer) addAddr(a netip.Addr, id PodID) {
	x := ix.x
	switch {
	case a.Is4():
		v := addr4(a)
		mask := uint32(len(x.V4) - 1)
		for i := hash4(v, x.V4Shift); ; i = (i + 1) & mask {
			s := &x.V4[i]
			if s.Pod == 0 || s.Addr == v {
				*s = AddrSlot{Addr: v, Pod: int32(id) + 1}
				return
			}
		}
	case a.Zone() != "":
		if x.Zoned == nil {
			x.Zoned = map[netip.Addr]PodID{}
		}
		x.Zoned[a] = id
	default:
		if x.V6 == nil {
			x.V6 = map[[16]byte]PodID{}
		}
		x.V6[a.As16()] = id
	}
}
