package compile

import (
	"encoding/binary"
	"math"
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
	// Pods holds the records (Addr 0) of the pods with an address that is
	// not IPv4, which V6 and Zoned index: what lookups of those addresses
	// return. A pod's IPv4 addresses have their records in V4's slots, so
	// an IPv4-only cluster keeps no record here.
	Pods []PodRecord
	// PodSpans locates every pod's memberships and ports in the pools, by
	// PodID; a record whose lists do not fit inline is read through it.
	PodSpans []PodSpans
	// Members is the pool of the pods' selector memberships (Pod.MemberOf
	// of every pod points into it).
	Members []SelectorID
	// PodPorts is the pool of the pods' container ports whose names some
	// rule uses, in the pods' order: the first of each name and protocol.
	PodPorts []EvalPodPort
	// Denied holds every pod's Pod.IngressDenied and EgressDenied, which
	// are substrings of it (see PodRecord.DeniedOff).
	Denied string
	// TierSets holds the distinct ClusterNetworkPolicy lists of the pods;
	// TierPolicies and TierRules are their pools.
	TierSets     []TierSet
	TierPolicies []ClusterPolicyID
	TierRules    []EvalClusterRule

	// Rules is the pool of the tables' rules; each table's run is sorted by
	// Rule.Order, so a smaller index in a run is an earlier rule.
	Rules []EvalRule
	// TableData holds each decision table (one per Program.Tables entry),
	// one after the other, so that a verdict reads a table from a few
	// adjacent lines: a header of TableHeader words (the offset of the
	// table's run in Rules, the lengths of its parts and the selector
	// summary), then the table-relative indices of the rules that match
	// any peer, then of those with address peers (each in rule order),
	// then the selector peers (sorted), then the rule of each of them, then
	// the port filter of each rule (see PortQuery.Filter) as two words,
	// low half first: a verdict skips most rules whose ports cannot match
	// without reading them. See TableHeader. PodRecord.IngressTable and
	// EgressTable are the offsets of the headers.
	TableData []uint32

	// ClusterSelectors is the pool of the cluster rules' selector peers.
	ClusterSelectors []SelectorID

	// Spills holds the lists of the matches that do not fit in EvalMatch;
	// Ports, Named and Ranges4 are their pools.
	Spills  []EvalSpill
	Ports   []PortRange
	Named   []EvalNamedPort
	Ranges4 []Range4

	// V4 is an open-addressed hash table from IPv4 pod address to the
	// pod's record, held in the slot itself (a pod with several IPv4
	// addresses has a copy in each of their slots), at most two-thirds
	// full: a lookup usually reads one cache line, and that line is all a
	// verdict reads about the pod. (At most half full doubled the table,
	// the agent's largest allocation, for cluster sizes just above a power
	// of two: 32 MiB at 150k pods, for a probe or so less per miss.)
	V4 []PodRecord
	// V4Shift turns a 32-bit hash into a slot index of V4.
	V4Shift uint8
	// V6 maps the other pod addresses (IPv6 without zone) to their pods'
	// records in Pods; Zoned maps addresses with a zone, which no packet
	// carries.
	V6    map[[16]byte]int32
	Zoned map[netip.Addr]int32
}

// Span is a run of elements in one of EvalIndex's pools.
type Span struct{ Off, Len uint32 }

func (s Span) end() uint32 { return s.Off + s.Len }

// PodRecord is what a verdict reads about a pod, in 64 bytes: one cache
// line once the V4 table has more than 512 slots (Go allocates more than
// 32 KiB page-aligned). The pod's selector memberships and named ports are held inline
// when they fit (podInlineMembers, podInlinePorts), which is the common
// case; otherwise they are read from the pools through PodSpans.
type PodRecord struct {
	// Addr is the IPv4 address of a V4 slot (0 in Pods).
	Addr uint32
	// ID is the pod.
	ID PodID
	// IngressTable and EgressTable are the offsets in EvalIndex.TableData
	// of the pod's decision tables (-1: not isolated by a NetworkPolicy in
	// that direction); Pod.IngressTable and EgressTable are their indices.
	IngressTable, EgressTable int32
	// Tiers indexes EvalIndex.TierSets (-1: no ClusterNetworkPolicy has the
	// pod as a subject).
	Tiers int32
	// Local is Pod.Local.
	Local bool
	// Used marks an occupied V4 slot.
	Used bool
	// NMembers and NPorts count the entries of InlineMembers and
	// InlinePorts; podSpilled (255) when the lists are in the pools.
	NMembers, NPorts uint8
	// InlineMembers is the pod's MemberOf when it fits.
	InlineMembers [podInlineMembers]SelectorID
	// InlinePorts are the pod's named container ports when they fit (and
	// every name index is below 256).
	InlinePorts [podInlinePorts]InlinePodPort
	// DeniedOff, IngressDeniedLen and EgressDeniedLen locate the pod's
	// Pod.IngressDenied and EgressDenied in EvalIndex.Denied, one after
	// the other, so that a denial's reason is read from the record instead
	// of from the Pod, a cache miss of its own; deniedSpilled: a reason too
	// long for the record, read from the Pod.
	DeniedOff                         uint32
	IngressDeniedLen, EgressDeniedLen uint16
}

// InlinePodPort is an EvalPodPort held in a PodRecord, in 4 bytes: the
// name index in bits 0-7, the protocol in 8-15, the port in 16-31, so that
// a connection's protocol and port are compared with one instruction.
type InlinePodPort uint32

func inlinePodPort(pp EvalPodPort) InlinePodPort {
	return InlinePodPort(uint32(pp.Name) | uint32(pp.Protocol)<<8 | uint32(pp.Port)<<16)
}

// Port returns the port as an EvalPodPort.
func (p InlinePodPort) Port() EvalPodPort {
	return EvalPodPort{Name: int32(p & 0xff), Protocol: Protocol(p >> 8), Port: uint16(p >> 16)}
}

// How many memberships and named ports a PodRecord holds inline, and the
// count that says the lists are in the pools.
const (
	podInlineMembers = 4
	podInlinePorts   = 4
	podSpilled       = 0xff
	deniedSpilled    = 0xffff
)

// PodSpans is where a pod's lists are in EvalIndex's pools.
type PodSpans struct {
	// Members is the pod's MemberOf in EvalIndex.Members.
	Members Span
	// Ports are the pod's named container ports in EvalIndex.PodPorts.
	Ports Span
}

// Table returns the offset of the pod's decision table in one direction
// (-1: not isolated by a NetworkPolicy).
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

// InlineNamed is a named port held inline in EvalMatch, in 4 bytes: a
// name index above 0xffff makes the match spill.
type InlineNamed struct {
	Name     uint16
	Protocol Protocol
}

// Range4 is an inclusive range of IPv4 addresses as integers.
type Range4 struct{ From, To uint32 }

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

// EvalMatch is a Match laid out for the evaluator, in 48 bytes: up to two
// port ranges, two named ports and two IPv4 ranges are held inline (most
// rules), so that checking a rule reads the rule's cache line only. A match
// with longer lists, or with IPv6 ranges, holds them all in
// EvalIndex.Spills[Spill] instead.
type EvalMatch struct {
	Ports                    [evalInline]PortRange
	NPorts, NNamed, NRanges4 uint8
	// HasRanges6 is set when IPBlocks holds IPv6 ranges.
	HasRanges6 bool
	AllPeers   bool
	AllPorts   bool
	// Named are the named ports.
	Named [evalInline]InlineNamed
	// Ranges4 are the IPv4 ranges of IPBlocks.
	Ranges4 [evalInline]Range4
	// Spill indexes EvalIndex.Spills; -1 when the lists are inline.
	Spill int32
}

// evalInline is how many entries of each list EvalMatch holds inline.
const evalInline = 2

// EvalSpill is the lists of a match too long to be held inline, as runs of
// EvalIndex.Ports, Named and Ranges4, and the match's IPBlocks (shared
// with the Match), which IPv6 addresses are checked against.
type EvalSpill struct {
	Ports, Named, Ranges4 Span
	IPBlocks              []IPRange
}

// EvalRule is a NetworkPolicy rule of a decision table: 64 bytes, one
// cache line, holding the reason a verdict it decides gives.
type EvalRule struct {
	// Reason is Rule.AllowReason.
	Reason string
	EvalMatch
}

// TableHeader is the length of a table's header in EvalIndex.TableData:
// the offset of the table's run in Rules, the number of rules that match
// any peer, of rules with address peers and of selector peers, the
// selector summary (SelectorBit(s) is set for each selector s, so a
// membership whose bit is clear is not among them) and the number of rules.
// The parts follow, as EvalIndex.TableData says; rule indices are
// table-relative.
const TableHeader = 6

// SelectorBit is a selector's bit in the selector summary.
func SelectorBit(s SelectorID) uint32 { return uint32(1) << (uint32(s) % 32) }

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
	if r := x.RecordByAddr(ip); r != nil {
		return r.ID, true
	}
	return 0, false
}

// RecordByAddr returns the record of the pod that owns the address, nil
// when no pod does. For an IPv4 address it is the V4 slot itself.
func (x *EvalIndex) RecordByAddr(ip netip.Addr) *PodRecord {
	if ip.Is4() {
		if len(x.V4) == 0 {
			return nil
		}
		a := addr4(ip)
		mask := uint32(len(x.V4) - 1)
		for i := hash4(a, x.V4Shift); ; i = (i + 1) & mask {
			s := &x.V4[i]
			if !s.Used {
				return nil
			}
			if s.Addr == a {
				return s
			}
		}
	}
	var i int32
	var ok bool
	if ip.Zone() != "" {
		i, ok = x.Zoned[ip]
	} else {
		i, ok = x.V6[ip.As16()]
	}
	if !ok {
		return nil
	}
	return &x.Pods[i]
}

// RecordsByAddr is RecordByAddr for both ends of a connection. With two
// IPv4 addresses, both slots are loaded before either is examined, so that
// their cache misses (the random pairs of a busy node miss on both)
// overlap instead of following each other.
func (x *EvalIndex) RecordsByAddr(a, b netip.Addr) (ra, rb *PodRecord) {
	if !a.Is4() || !b.Is4() || len(x.V4) == 0 {
		return x.RecordByAddr(a), x.RecordByAddr(b)
	}
	ka, kb := addr4(a), addr4(b)
	mask := uint32(len(x.V4) - 1)
	ia, ib := hash4(ka, x.V4Shift)&mask, hash4(kb, x.V4Shift)&mask
	sa, sb := &x.V4[ia], &x.V4[ib]
	ua, ub := sa.Used, sb.Used
	return x.found4(sa, ua, ka, ia), x.found4(sb, ub, kb, ib)
}

// found4 examines slot i of V4 (s, whose Used is used), the first for
// address a.
func (x *EvalIndex) found4(s *PodRecord, used bool, a, i uint32) *PodRecord {
	switch {
	case !used:
		return nil
	case s.Addr == a:
		return s
	}
	return x.probe4(a, (i+1)&uint32(len(x.V4)-1))
}

// probe4 looks for an IPv4 address from slot i on.
func (x *EvalIndex) probe4(a, i uint32) *PodRecord {
	mask := uint32(len(x.V4) - 1)
	for ; ; i = (i + 1) & mask {
		s := &x.V4[i]
		if !s.Used {
			return nil
		}
		if s.Addr == a {
			return s
		}
	}
}

// hash4 spreads consecutive addresses over the table (Fibonacci hashing).
func hash4(a uint32, shift uint8) uint32 { return (a * 0x9E3779B1) >> shift }

// MemberOf returns a pod's selector memberships, sorted.
func (x *EvalIndex) MemberOf(r *PodRecord) []SelectorID {
	if r.NMembers != podSpilled {
		return r.InlineMembers[:r.NMembers]
	}
	s := x.PodSpans[r.ID].Members
	return x.Members[s.Off:s.end()]
}

// PortsOf returns a pod's named container ports that some rule can name;
// the ones the record holds inline are copied to buf.
func (x *EvalIndex) PortsOf(r *PodRecord, buf *[podInlinePorts]EvalPodPort) []EvalPodPort {
	if r.NPorts != podSpilled {
		n := min(int(r.NPorts), podInlinePorts)
		for i, pp := range r.InlinePorts[:n] {
			buf[i] = pp.Port()
		}
		return buf[:n]
	}
	s := x.PodSpans[r.ID].Ports
	return x.PodPorts[s.Off:s.end()]
}

// DeniedReason returns the reason a pod's traffic in direction d that no
// rule of its decision table allows is denied (Pod.IngressDenied or
// EgressDenied), from the record: the Pod is not read.
func (p *Program) DeniedReason(r *PodRecord, d Direction) string {
	off, n := r.DeniedOff, r.IngressDeniedLen
	if d == Egress {
		if n != deniedSpilled {
			off += uint32(n)
		}
		n = r.EgressDeniedLen
	}
	if n == deniedSpilled {
		if d == Egress {
			return p.Pods[r.ID].EgressDenied
		}
		return p.Pods[r.ID].IngressDenied
	}
	return p.Eval.Denied[off : off+uint32(n)]
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

// ContainsAddr reports whether the rule's address peers contain ip.
func (x *EvalIndex) ContainsAddr(m *EvalMatch, ip netip.Addr) bool {
	if ip.Is4() {
		return x.ContainsAddr4(m, addr4(ip))
	}
	// A match with IPv6 ranges always spills.
	return m.HasRanges6 && rangesContain(x.Spills[m.Spill].IPBlocks, ip)
}

// ContainsAddr4 is ContainsAddr for an IPv4 address as an integer (see
// Addr4), which a verdict converts once for all the rules it tries.
func (x *EvalIndex) ContainsAddr4(m *EvalMatch, a uint32) bool {
	rs := m.Ranges4[:min(m.NRanges4, evalInline)]
	if m.Spill >= 0 {
		s := x.Spills[m.Spill].Ranges4
		rs = x.Ranges4[s.Off:s.end()]
	}
	// The ranges are sorted and disjoint: the first that ends at or after
	// a is the only one that can hold it. A short list is scanned; a long
	// one (an ipBlock with many exceptions) is searched.
	if len(rs) > 16 {
		i := sort.Search(len(rs), func(i int) bool { return a <= rs[i].To })
		return i < len(rs) && rs[i].From <= a
	}
	for _, r := range rs {
		if a <= r.To {
			return r.From <= a
		}
	}
	return false
}

// Addr4 is an IPv4 address as the integer Range4 bounds are.
func Addr4(a netip.Addr) uint32 { return addr4(a) }

// PortQuery is a connection's destination protocol and port as every rule's
// ports are checked against it, with the destination pod's port names
// resolved once per verdict (ResolveNames) instead of once per named port
// of every rule tried.
type PortQuery struct {
	// Dst is the destination pod (nil when the destination is not a pod).
	Dst *PodRecord
	// Names has bit n set when the destination pod's container port named
	// n (interned name index below 64) for Proto is Port.
	Names uint64
	// Filter is the query's port filter (see the filters of TableData):
	// the port's bits, the names' bits and the bit every query has.
	Filter uint64
	Port   uint16
	Proto  Protocol
}

// namesInMask is how many interned port names PortQuery.Names holds; a
// rule naming a port with a larger index looks it up on the pod instead.
const namesInMask = 64

// A port filter is a 64-bit summary of the ports a match admits, which a
// verdict ANDs with its PortQuery.Filter: zero means the match cannot admit
// the connection's port; non-zero that it may (PortMatches decides). Bits
// 0-15 are port names (interned index below 16); bits 16-46 numeric ports
// (port modulo 31, every port of a range of up to 31 ports); bits 47-62
// blocks of 4096 ports (every block a longer range overlaps: a range such
// as 8000-8100 rules out 443 and 50051, which would otherwise pass every
// verdict on to the rule's line); bit 63 is set in every query and in the
// filter of a match too wide to summarize (all ports, a name with a larger
// index). A query sets its port's bit of each kind.
const (
	filterNames      = 16
	filterPortMod    = 31
	filterBlocks     = filterNames + filterPortMod
	filterBlockShift = 12
	filterAlways     = uint64(1) << 63
)

// filterPortBit is a query's bits for its port: the port's residue and
// block.
func filterPortBit(port uint16) uint64 { return filterModBit(port) | filterBlockBit(port) }

func filterModBit(port uint16) uint64 {
	return uint64(1) << (filterNames + uint32(port)%filterPortMod)
}

func filterBlockBit(port uint16) uint64 {
	return uint64(1) << (filterBlocks + uint32(port)>>filterBlockShift)
}

// portFilter summarizes the ports a match admits.
func (ix *indexer) portFilter(m *Match) uint64 {
	if m.AllPorts {
		return ^uint64(0)
	}
	var f uint64
	for _, pr := range m.Ports {
		if int(pr.Last)-int(pr.First) >= filterPortMod {
			for b := pr.First >> filterBlockShift; b <= pr.Last>>filterBlockShift; b++ {
				f |= filterBlockBit(b << filterBlockShift)
			}
			continue
		}
		for port := int(pr.First); port <= int(pr.Last); port++ {
			f |= filterModBit(uint16(port))
		}
	}
	for _, np := range m.NamedPorts {
		id := ix.intern(np.Name)
		if id >= filterNames {
			return filterAlways
		}
		f |= uint64(1) << uint32(id)
	}
	return f
}

// ResolveNames sets q.Names from the destination pod's named ports, and
// q.Filter. A pod
// holds only the first container port of each name and protocol (the one
// that counts, as in Pod.NamedPort), so every match sets its bit.
func (x *EvalIndex) ResolveNames(q *PortQuery) {
	q.Names = 0
	switch r := q.Dst; {
	case r == nil:
	case r.NPorts != podSpilled:
		// The record's own ports, read in place (inline names are below
		// 256, some above namesInMask).
		key := InlinePodPort(uint32(q.Proto)<<8 | uint32(q.Port)<<16)
		for i, pp := range r.InlinePorts {
			if pp&^0xff == key && uint8(i) < r.NPorts && pp&0xff < namesInMask {
				q.Names |= uint64(1) << (pp & 0xff)
			}
		}
	default:
		s := x.PodSpans[r.ID].Ports
		for _, pp := range x.PodPorts[s.Off:s.end()] {
			if pp.Port == q.Port && pp.Protocol == q.Proto && uint32(pp.Name) < namesInMask {
				q.Names |= uint64(1) << uint32(pp.Name)
			}
		}
	}
	q.Filter = q.Names&(1<<filterNames-1) | filterPortBit(q.Port) | filterAlways
}

// PortMatches checks the destination protocol and port; named ports resolve
// on the destination pod.
func (x *EvalIndex) PortMatches(m *EvalMatch, q *PortQuery) bool {
	if m.AllPorts {
		return true
	}
	if m.Spill >= 0 {
		return x.spilledPortMatches(m, q)
	}
	for i := uint8(0); i < m.NPorts && i < evalInline; i++ {
		if pr := &m.Ports[i]; pr.Protocol == q.Proto && pr.First <= q.Port && q.Port <= pr.Last {
			return true
		}
	}
	for i := uint8(0); i < m.NNamed && i < evalInline; i++ {
		if np := m.Named[i]; x.namedMatches(int32(np.Name), np.Protocol, q) {
			return true
		}
	}
	return false
}

// spilledPortMatches is PortMatches for a match whose lists are in the
// pools.
func (x *EvalIndex) spilledPortMatches(m *EvalMatch, q *PortQuery) bool {
	s := &x.Spills[m.Spill]
	for _, pr := range x.Ports[s.Ports.Off:s.Ports.end()] {
		if pr.Protocol == q.Proto && pr.First <= q.Port && q.Port <= pr.Last {
			return true
		}
	}
	for _, np := range x.Named[s.Named.Off:s.Named.end()] {
		if x.namedMatches(np.Name, np.Protocol, q) {
			return true
		}
	}
	return false
}

// namedMatches reports whether a rule's named port is the connection's: the
// destination pod's container port named name, for the connection's
// protocol, is the port. A rule's protocol 0 (a ClusterNetworkPolicy
// destinationNamedPort) accepts any protocol.
func (x *EvalIndex) namedMatches(name int32, ruleProto Protocol, q *PortQuery) bool {
	if ruleProto != 0 && ruleProto != q.Proto {
		return false
	}
	if uint32(name) < namesInMask {
		return q.Names&(uint64(1)<<uint32(name)) != 0
	}
	if q.Dst == nil {
		return false
	}
	var buf [podInlinePorts]EvalPodPort
	for _, pp := range x.PortsOf(q.Dst, &buf) {
		if pp.Name == name && pp.Protocol == q.Proto {
			return pp.Port == q.Port
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
	// tableOffsets is each table's offset in TableData, by table index.
	tableOffsets []int32
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
	inline := len(m.Ports) <= evalInline && len(m.NamedPorts) <= evalInline
	for _, np := range m.NamedPorts {
		id := ix.intern(np.Name)
		named = append(named, EvalNamedPort{Name: id, Protocol: np.Protocol})
		if id > 0xffff {
			inline = false
		}
	}
	var ranges []Range4
	for _, r := range m.IPBlocks {
		if !r.From.Is4() {
			em.HasRanges6 = true
			continue
		}
		ranges = append(ranges, Range4{From: addr4(r.From), To: addr4(r.To)})
	}
	if inline && len(ranges) <= evalInline && !em.HasRanges6 {
		em.NPorts = uint8(copy(em.Ports[:], m.Ports))
		for i, np := range named {
			em.Named[i] = InlineNamed{Name: uint16(np.Name), Protocol: np.Protocol}
		}
		em.NNamed = uint8(len(named))
		em.NRanges4 = uint8(copy(em.Ranges4[:], ranges))
		return em
	}
	sp := EvalSpill{
		Ports:   Span{Off: uint32(len(x.Ports)), Len: uint32(len(m.Ports))},
		Named:   Span{Off: uint32(len(x.Named)), Len: uint32(len(named))},
		Ranges4: Span{Off: uint32(len(x.Ranges4)), Len: uint32(len(ranges))},
	}
	if em.HasRanges6 {
		sp.IPBlocks = m.IPBlocks
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
	return binary.BigEndian.Uint32(b[:])
}

// tables lays out every decision table: its distinct rules in rule order,
// then its header and the three ways in, by table-relative index.
func (ix *indexer) tables() {
	x := ix.x
	ix.tableOffsets = make([]int32, len(ix.p.Tables))
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
		local := make(map[*Rule]uint32, len(rules))
		ix.tableOffsets[ti] = int32(len(x.TableData))
		var selBits uint32
		for _, sr := range t.BySelector {
			selBits |= SelectorBit(sr.Selector)
		}
		x.TableData = append(x.TableData, uint32(len(x.Rules)), uint32(len(t.AnyPeer)), uint32(len(t.Blocks)), uint32(len(t.BySelector)),
			selBits, uint32(len(rules)))
		for i, r := range rules {
			local[r] = uint32(i)
			x.Rules = append(x.Rules, EvalRule{Reason: r.AllowReason, EvalMatch: ix.match(&r.Match)})
		}
		for _, r := range append(t.AnyPeer[:len(t.AnyPeer):len(t.AnyPeer)], t.Blocks...) {
			x.TableData = append(x.TableData, local[r])
		}
		for _, sr := range t.BySelector {
			x.TableData = append(x.TableData, uint32(sr.Selector))
		}
		for _, sr := range t.BySelector {
			x.TableData = append(x.TableData, local[sr.Rule])
		}
		for _, r := range rules {
			f := ix.portFilter(&r.Match)
			x.TableData = append(x.TableData, uint32(f), uint32(f>>32))
		}
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

// podCounts counts what the pod records and pools hold, to size them
// once: memberships, named ports (at most: a name's later duplicates are
// left out), IPv4 addresses, pods with an address of another kind, and
// local pods.
func (ix *indexer) podCounts() (nMembers, nPorts, nV4, nOther, nLocal int) {
	for i := range ix.p.Pods {
		pod := &ix.p.Pods[i]
		if pod.Local {
			nLocal++
		}
		nMembers += len(pod.MemberOf)
		for _, cp := range pod.Ports {
			if _, ok := ix.names[cp.Name]; ok {
				nPorts++
			}
		}
		other := false
		for _, a := range pod.IPs {
			if a.Is4() {
				nV4++
			} else {
				other = true
			}
		}
		if other {
			nOther++
		}
	}
	return nMembers, nPorts, nV4, nOther, nLocal
}

// pods writes the pod records, the pools they point into and the address
// tables.
func (ix *indexer) pods() {
	p, x := ix.p, ix.x
	x.PodSpans = make([]PodSpans, len(p.Pods))
	nMembers, nPorts, nV4, nOther, nLocal := ix.podCounts()
	x.Pods = make([]PodRecord, 0, nOther)
	x.Members = make([]SelectorID, 0, nMembers)
	x.PodPorts = make([]EvalPodPort, 0, nPorts)
	size := 8
	for 2*size < 3*nV4 {
		size *= 2
	}
	x.V4 = make([]PodRecord, size)
	x.V4Shift = uint8(32 - bits.TrailingZeros(uint(size)))
	// Written once in order before the probes below: a slot's first touch
	// by a probe is a read, which maps the shared zero page, and the write
	// that follows faults again and flushes the other CPUs' TLBs. Megabytes
	// of slots, fresh from the OS, would pay that page by page.
	for i := range x.V4 {
		x.V4[i].Used = false
	}
	tierSets := map[string]int32{}
	var denied strings.Builder
	nDenied := 0
	for i := range p.Pods {
		nDenied += len(p.Pods[i].IngressDenied) + len(p.Pods[i].EgressDenied)
	}
	denied.Grow(nDenied)
	// The local pods' records, whose reasons are read back below: only
	// local pods are subjects.
	type localRecord struct {
		id PodID
		r  PodRecord
	}
	locals := make([]localRecord, 0, nLocal)
	for i := range p.Pods {
		pod := &p.Pods[i]
		r := PodRecord{ID: PodID(i), IngressTable: -1, EgressTable: -1, Local: pod.Local}
		if pod.IngressTable >= 0 {
			r.IngressTable = ix.tableOffsets[pod.IngressTable]
		}
		if pod.EgressTable >= 0 {
			r.EgressTable = ix.tableOffsets[pod.EgressTable]
		}
		var sp PodSpans
		sp.Members = Span{Off: uint32(len(x.Members)), Len: uint32(len(pod.MemberOf))}
		x.Members = append(x.Members, pod.MemberOf...)
		pod.MemberOf = x.Members[sp.Members.Off:sp.Members.end():sp.Members.end()]
		if len(pod.MemberOf) == 0 {
			pod.MemberOf = nil
		}
		sp.Ports.Off = uint32(len(x.PodPorts))
		for _, cp := range pod.Ports {
			id, ok := ix.names[cp.Name]
			if ok && !hasPodPort(x.PodPorts[sp.Ports.Off:], id, cp.Protocol) {
				// Only the first container port of a name and protocol
				// counts (Pod.NamedPort); the later ones are left out.
				x.PodPorts = append(x.PodPorts, EvalPodPort{Name: id, Port: cp.Port, Protocol: cp.Protocol})
			}
		}
		sp.Ports.Len = uint32(len(x.PodPorts)) - sp.Ports.Off
		x.PodSpans[i] = sp
		r.NMembers, r.NPorts = podSpilled, podSpilled
		if len(pod.MemberOf) <= podInlineMembers {
			r.NMembers = uint8(copy(r.InlineMembers[:], pod.MemberOf))
		}
		if ports := x.PodPorts[sp.Ports.Off:sp.Ports.end()]; len(ports) <= podInlinePorts && namesBelow(ports, 256) {
			for j, pp := range ports {
				r.InlinePorts[j] = inlinePodPort(pp)
			}
			r.NPorts = uint8(len(ports))
		}
		r.DeniedOff, r.IngressDeniedLen, r.EgressDeniedLen = addDenied(&denied, pod.IngressDenied, pod.EgressDenied)
		r.Tiers = ix.tierSet(tierSets, pod)
		if pod.Local {
			locals = append(locals, localRecord{PodID(i), r})
		}
		for _, a := range pod.IPs {
			ix.addAddr(a, &r)
		}
	}
	// The pods' reasons become substrings of Denied: the program holds
	// them once. Pods that are not local have none (notSubject, shared).
	x.Denied = denied.String()
	for i := range locals {
		pod, r := &p.Pods[locals[i].id], &locals[i].r
		if r.IngressDeniedLen != deniedSpilled {
			pod.IngressDenied = p.DeniedReason(r, Ingress)
		}
		if r.EgressDeniedLen != deniedSpilled {
			pod.EgressDenied = p.DeniedReason(r, Egress)
		}
	}
}

// addDenied appends a pod's denial reasons to b and returns where they
// are, as PodRecord holds it: a reason longer than a record's length field
// holds, or past the offset's range, is left in the Pod (deniedSpilled).
func addDenied(b *strings.Builder, in, eg string) (off uint32, inLen, egLen uint16) {
	if uint64(b.Len())+uint64(len(in))+uint64(len(eg)) > math.MaxUint32 {
		return 0, deniedSpilled, deniedSpilled
	}
	off, inLen, egLen = uint32(b.Len()), deniedSpilled, deniedSpilled
	if len(in) < deniedSpilled {
		b.WriteString(in)
		inLen = uint16(len(in))
	}
	if len(eg) < deniedSpilled {
		b.WriteString(eg)
		egLen = uint16(len(eg))
	}
	return off, inLen, egLen
}

// namesBelow reports whether every port's name index is below n.
func namesBelow(ports []EvalPodPort, n int32) bool {
	for _, pp := range ports {
		if pp.Name >= n {
			return false
		}
	}
	return true
}

// hasPodPort reports whether ports has a port of that name and protocol.
func hasPodPort(ports []EvalPodPort, name int32, proto Protocol) bool {
	for _, pp := range ports {
		if pp.Name == name && pp.Protocol == proto {
			return true
		}
	}
	return false
}

// tierSet returns the index of the pod's ClusterNetworkPolicy lists, shared
// by every pod with the same lists.
func (ix *indexer) tierSet(seen map[string]int32, pod *Pod) int32 {
	lists := [4]*[]ClusterPolicyID{&pod.AdminIngress, &pod.AdminEgress, &pod.BaselineIngress, &pod.BaselineEgress}
	if len(*lists[0])+len(*lists[1])+len(*lists[2])+len(*lists[3]) == 0 {
		return -1 // no list: most pods, which no key needs to be made for
	}
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

// addAddr makes the address lead to the pod's record r.
func (ix *indexer) addAddr(a netip.Addr, r *PodRecord) {
	x := ix.x
	switch {
	case a.Is4():
		v := addr4(a)
		mask := uint32(len(x.V4) - 1)
		for i := hash4(v, x.V4Shift); ; i = (i + 1) & mask {
			s := &x.V4[i]
			if !s.Used || s.Addr == v {
				*s = *r
				s.Addr, s.Used = v, true
				return
			}
		}
	default:
		// The pod's record in Pods, appended at its first such address.
		i := int32(len(x.Pods)) - 1
		if i < 0 || x.Pods[i].ID != r.ID {
			x.Pods = append(x.Pods, *r)
			i++
		}
		if a.Zone() != "" {
			if x.Zoned == nil {
				x.Zoned = map[netip.Addr]int32{}
			}
			x.Zoned[a] = i
			return
		}
		if x.V6 == nil {
			x.V6 = map[[16]byte]int32{}
		}
		x.V6[a.As16()] = i
	}
}
