package compile

import (
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// Element is one element of a set or map, typed: its key fields are
// addresses, protocols and ports, which the netlink writer encodes as
// they are; Text and Knft spell it as nft reads it (transactions,
// goldens). Its shape says which key fields it has.
//
// Nobody writes into an element once the renderer emits it: the tracker
// inserts, deletes and replaces whole elements, and pkg/sets only reads.
// Comment is shared by a pod's elements, Last by nobody.
type Element struct {
	// Addr is the key's address field (both of ShapeAddrAddr's).
	Addr netip.Addr
	// Last is the last address of ShapeAddr's range (an interval set's
	// prefix or range); nil: Addr alone.
	Last *netip.Addr
	// Chain is the chain a verdict map element's jump or goto names.
	Chain   string
	Comment *string
	// Ports is the protocol and port (range) of the shapes that have them.
	Ports PortRange
	Shape Shape
	// Verdict is a verdict map element's verdict (VerdictNone in a set);
	// with Chain, Value.
	Verdict VerdictKind
}

// Value is a verdict map element's verdict (Kind VerdictNone in a set).
func (e *Element) Value() RuleVerdict { return RuleVerdict{Kind: e.Verdict, Chain: e.Chain} }

// Shape is the sequence of an element's key fields.
type Shape uint8

const (
	// ShapeAddr: an address, or in an interval set an address range.
	ShapeAddr Shape = iota
	// ShapeAddrAddr: an address twice (a pod's self element).
	ShapeAddrAddr
	// ShapeAddrProtoPort: an address, a protocol and a single port (a
	// named port's resolution).
	ShapeAddrProtoPort
	// ShapeProtoPorts: a protocol and a port or port range.
	ShapeProtoPorts
	// ShapePorts: a port or port range.
	ShapePorts
)

// Fields is the number of key fields.
func (s Shape) Fields() int {
	switch s {
	case ShapeAddr, ShapePorts:
		return 1
	case ShapeAddrAddr, ShapeProtoPorts:
		return 2
	}
	return 3
}

// AddrElement is the element of one address.
func AddrElement(a netip.Addr, comment *string) Element {
	return Element{Addr: a, Comment: comment}
}

// RangeElement is the element of an address range (an interval set's).
func RangeElement(r IPRange) Element {
	e := Element{Addr: r.From}
	if r.To != r.From {
		to := r.To
		e.Last = &to
	}
	return e
}

// PrefixElement is the element of an address prefix (an interval set's).
func PrefixElement(p netip.Prefix) Element {
	p = p.Masked()
	return RangeElement(IPRange{From: p.Addr(), To: lastAddr(p)})
}

// LastAddr is the last address of the key's address field (Addr unless
// the element is a range).
func (e *Element) LastAddr() netip.Addr {
	if e.Last != nil {
		return *e.Last
	}
	return e.Addr
}

// AppendKey appends the key as nft writes it: its fields joined by " . ".
func (e *Element) AppendKey(b []byte) []byte {
	for i := range e.Shape.Fields() {
		if i > 0 {
			b = append(b, " . "...)
		}
		b = e.appendField(b, i)
	}
	return b
}

// appendField appends the text of key field i.
func (e *Element) appendField(b []byte, i int) []byte {
	switch {
	case e.Shape == ShapeAddr && e.Last != nil:
		return append(b, IPRange{From: e.Addr, To: *e.Last}.String()...)
	case e.Shape <= ShapeAddrProtoPort && (i == 0 || e.Shape == ShapeAddrAddr):
		return appendAddrText(b, e.Addr)
	case e.Shape == ShapeAddrProtoPort && i == 1, e.Shape == ShapeProtoPorts && i == 0:
		return append(b, e.Ports.Protocol.Name()...)
	}
	b = strconv.AppendUint(b, uint64(e.Ports.First), 10)
	if e.Ports.Last != e.Ports.First {
		b = append(b, '-')
		b = strconv.AppendUint(b, uint64(e.Ports.Last), 10)
	}
	return b
}

// KeyFields is the key's fields as nft writes them.
func (e *Element) KeyFields() []string {
	out := make([]string, e.Shape.Fields())
	var buf [96]byte
	for i := range out {
		out[i] = string(e.appendField(buf[:0], i))
	}
	return out
}

// Knft is the element as knftables writes it, addressed to no set.
func (e *Element) Knft() knftables.Element {
	k := knftables.Element{Key: e.KeyFields(), Comment: e.Comment}
	if e.Verdict != VerdictNone {
		k.Value = []string{e.Value().String()}
	}
	return k
}

// Text is the key and value as nft writes them ("key : value").
func (e *Element) Text() string {
	var buf [128]byte
	b := e.AppendKey(buf[:0])
	if e.Verdict != VerdictNone {
		b = append(b, " : "...)
		b = append(b, e.Value().String()...)
	}
	return string(b)
}

// SameKey reports whether two elements have the same key.
func (e *Element) SameKey(o *Element) bool {
	return e.Shape == o.Shape && e.Addr == o.Addr && e.Ports == o.Ports && e.LastAddr() == o.LastAddr()
}

// Equal reports whether two elements have the same key, value and
// comment.
func (e *Element) Equal(o *Element) bool {
	if !e.SameKey(o) || e.Value() != o.Value() || (e.Comment == nil) != (o.Comment == nil) {
		return false
	}
	return e.Comment == nil || *e.Comment == *o.Comment
}

// ElementID identifies an element with its value and comment: an element
// whose value or comment changes is another element.
func ElementID(e *Element) string {
	var buf [160]byte
	b := e.AppendKey(buf[:0])
	b = append(b, " : "...)
	b = append(b, e.Value().String()...)
	if e.Comment != nil {
		b = append(b, " # "...)
		b = append(b, *e.Comment...)
	}
	return string(b)
}

// compareElements orders elements by key as nft's text would sort
// field by field: addresses numerically, ports by number, protocols by
// name; a tie between different texts (a range and a single value with
// the same start) is broken by the text.
func compareElements(a, b *Element) int {
	if a.Shape != b.Shape {
		return int(a.Shape) - int(b.Shape)
	}
	if a.Shape <= ShapeAddrProtoPort {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
	}
	if a.Shape == ShapeAddrProtoPort || a.Shape == ShapeProtoPorts {
		if c := compareProtocols(a.Ports.Protocol, b.Ports.Protocol); c != 0 {
			return c
		}
	}
	if a.Shape >= ShapeAddrProtoPort {
		if c := int(a.Ports.First) - int(b.Ports.First); c != 0 {
			return c
		}
	}
	if a.SameKey(b) {
		return 0
	}
	// Same start, different ends: ordered by text, as before.
	var ba, bb [96]byte
	return strings.Compare(string(a.AppendKey(ba[:0])), string(b.AppendKey(bb[:0])))
}

// compareProtocols orders protocols as their names sort in nft's text:
// those Name spells as a number first, by number, then the others by name.
func compareProtocols(a, b Protocol) int {
	if a == b {
		return 0
	}
	na, nb := a.Name(), b.Name()
	numA, numB := na[0] >= '0' && na[0] <= '9', nb[0] >= '0' && nb[0] <= '9'
	switch {
	case numA && numB:
		return int(a) - int(b)
	case numA != numB:
		if numA {
			return -1
		}
		return 1
	}
	return strings.Compare(na, nb)
}
