package compile

import (
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// Chain is a desired chain and its rules, in order.
type Chain struct {
	Chain knftables.Chain
	// Rules are typed (TableRule); knftables gets their printing.
	Rules []TableRule
	// External chains have their rules installed outside knftables (the
	// xt-compat queue rule); syncs create them but never flush them.
	External bool
	// place is where Render creates the chain, so that the tracker puts a
	// new one where a full render has it.
	place chainPlace
	// shares lists the shared sets (peer and node sets) its rules name,
	// once per peer alternative: such a set exists while a rule names it.
	shares []string
}

// chainPlace orders chains as Render creates them: by group, then by key
// within the group; a deny log chain right before the chain whose drops
// it logs (same group and key).
type chainPlace struct {
	group chainGroup
	key   string
	deny  bool
}

// chainGroup is a group of chains Render creates together, in this order.
type chainGroup uint8

const (
	// groupStatic: the chains that do not depend on the policies (queue,
	// shares, tier dispatch), created first.
	groupStatic chainGroup = iota
	// groupPolicy: NetworkPolicy rule chains, by policy key then ingress
	// before egress (policyChainKey).
	groupPolicy
	// groupClusterPolicy: ClusterNetworkPolicy rule chains, by name then
	// direction.
	groupClusterPolicy
	// groupCombo: the combination chains of both APIs, by name.
	groupCombo
	// groupTail: the DNS capture and the base chains, created last.
	groupTail
)

// before reports whether Render creates a chain at place a before one at b.
func (a chainPlace) before(b chainPlace) bool {
	if a.group != b.group {
		return a.group < b.group
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.deny && !b.deny
}

// policyChainKey orders a policy's rule chain as Render creates them: by
// policy key or name (NUL after it, so that "x/a" sorts before "x/a-b"),
// then ingress before egress.
func policyChainKey(policy string, d Direction) string {
	if d == Ingress {
		return policy + "\x000"
	}
	return policy + "\x001"
}

// Set is a desired set or map and its elements, sorted.
type Set struct {
	// Exactly one of Set and Map is set; a Map's data is a verdict.
	Set *knftables.Set
	Map *knftables.Map
	// Key is the key's fields, typed: the declaration's type is their
	// printing (Render sets it), which pkg/nftnl does not read.
	Key      []KeyKind
	Elements []Element
	// Dynamic sets have elements written by someone else (DNS learning's
	// fqdn sets, with timeouts): Elements stays empty and syncs keep the
	// kernel's elements as long as the declaration does not change.
	Dynamic bool
	// owner is the rule chain a rule's set belongs to (it goes with it).
	owner string
	// shared sets (peer and node sets) can be named by rules of several
	// policies: one exists while a rendered rule names it.
	shared bool
}

// Name returns the set's or map's name.
func (s *Set) Name() string {
	if s.Map != nil {
		return s.Map.Name
	}
	return s.Set.Name
}

// Ruleset is the desired content of the nftpolicy table.
type Ruleset struct {
	Table  knftables.Table
	Chains map[string]*Chain
	Sets   map[string]*Set
	// ChainOrder lists chain names in the order they are created: base
	// chains last, so that a transaction never jumps to a missing chain.
	ChainOrder []string
	// DenyIDs maps the log prefix of each logged drop to the policy and
	// rule it belongs to (empty without RenderConfig.DenyLogGroup).
	DenyIDs map[string]DenyInfo
}

// ElementCount is the number of elements in all sets and maps.
func (r *Ruleset) ElementCount() int {
	n := 0
	for _, s := range r.Sets {
		n += len(s.Elements)
	}
	return n
}

// SortedSetNames returns the set and map names, sorted.
func (r *Ruleset) SortedSetNames() []string {
	out := make([]string, 0, len(r.Sets))
	for n := range r.Sets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// AddTo writes the whole ruleset into a transaction that starts from an
// empty or absent table: for golden tests and for the first sync.
func (rs *Ruleset) AddTo(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{Comment: rs.Table.Comment})
	// Chains before map elements: verdict elements jump to chains.
	for _, n := range rs.ChainOrder {
		ch := rs.Chains[n].Chain
		tx.Add(&ch)
	}
	for _, n := range rs.SortedSetNames() {
		rs.Sets[n].AddTo(tx)
	}
	for _, n := range rs.ChainOrder {
		c := rs.Chains[n]
		for i := range c.Rules {
			kr := c.Rules[i].Knft()
			kr.Chain = n
			tx.Add(&kr)
		}
	}
}

// AddTo adds the set or map and all its elements.
func (s *Set) AddTo(tx *knftables.Transaction) {
	if s.Map != nil {
		m := *s.Map
		tx.Add(&m)
	} else {
		set := *s.Set
		tx.Add(&set)
	}
	for i := range s.Elements {
		tx.Add(s.Element(i))
	}
}

// Element returns element i as knftables writes it, addressed to this set
// or map.
func (s *Set) Element(i int) *knftables.Element {
	return s.Knft(&s.Elements[i])
}

// Knft returns an element as knftables writes it, addressed to this set or
// map.
func (s *Set) Knft(el *Element) *knftables.Element {
	e := el.Knft()
	s.AddressTo(&e)
	return &e
}

// AddressTo names this set or map in a knftables element.
func (s *Set) AddressTo(e *knftables.Element) {
	if s.Map != nil {
		e.Map = s.Map.Name
	} else {
		e.Set = s.Set.Name
	}
}

// DumpTo adds the whole ruleset to a transaction in the order and form of
// knftables.Fake's Dump of a table that AddTo filled: the table, chains
// by name, sets then maps by name, then each chain's rules, each set's
// and each map's elements (one per key, the last one added winning, as in
// the fake). The transaction's String is then that dump, without loading
// the ruleset into a fake, whose element lookups cost a scan of the set
// per element (`nftpolicy compile` of a large set).
func (rs *Ruleset) DumpTo(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{Comment: rs.Table.Comment})
	chains := make([]string, 0, len(rs.Chains))
	for n := range rs.Chains {
		chains = append(chains, n)
	}
	sort.Strings(chains)
	var sets, maps []*Set
	for _, n := range rs.SortedSetNames() {
		if s := rs.Sets[n]; s.Map != nil {
			maps = append(maps, s)
		} else {
			sets = append(sets, s)
		}
	}
	for _, n := range chains {
		ch := rs.Chains[n].Chain
		tx.Add(&ch)
	}
	for _, s := range sets {
		set := *s.Set
		tx.Add(&set)
	}
	for _, s := range maps {
		m := *s.Map
		tx.Add(&m)
	}
	for _, n := range chains {
		c := rs.Chains[n]
		for i := range c.Rules {
			kr := c.Rules[i].Knft()
			kr.Chain = n
			tx.Add(&kr)
		}
	}
	for _, s := range append(sets, maps...) {
		s.dumpElementsTo(tx)
	}
}

// dumpElementsTo adds the set's elements, one per key: a later element
// with a key already added takes the earlier one's place.
func (s *Set) dumpElementsTo(tx *knftables.Transaction) {
	els := make([]*knftables.Element, 0, len(s.Elements))
	at := make(map[string]int, len(s.Elements))
	for i := range s.Elements {
		e := s.Element(i)
		k := strings.Join(e.Key, "\x00")
		if j, ok := at[k]; ok {
			els[j] = e
			continue
		}
		at[k] = len(els)
		els = append(els, e)
	}
	for _, e := range els {
		tx.Add(e)
	}
}

// KeyKind is a field of a set's or map's key as declared.
type KeyKind uint8

// The key fields the renderer declares.
const (
	KeyIPv4 KeyKind = iota + 1
	KeyIPv6
	KeyProto
	KeyService
)

var keyKindText = [...]string{KeyIPv4: "ipv4_addr", KeyIPv6: "ipv6_addr", KeyProto: "inet_proto", KeyService: "inet_service"}

func (k KeyKind) String() string {
	if int(k) < len(keyKindText) && keyKindText[k] != "" {
		return keyKindText[k]
	}
	return "key(" + strconv.Itoa(int(k)) + ")"
}

func addrKind(v4 bool) KeyKind {
	if v4 {
		return KeyIPv4
	}
	return KeyIPv6
}

// keyText prints a key's fields as nft declares them.
func keyText(key []KeyKind) string {
	parts := make([]string, len(key))
	for i, k := range key {
		parts[i] = k.String()
	}
	return strings.Join(parts, " . ")
}
