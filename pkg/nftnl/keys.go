package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The fields of set keys and map data, between the typed elements the
// renderer makes (compile.Element) and the bytes the kernel holds:
// putField encodes a field, DecodeKey reads a key back. A field is in
// network byte order: an address is 4 or 16 bytes, inet_proto 1 byte,
// inet_service 2 bytes. Where a set has the interval flag, a field may be
// a range (an address range or prefix, a port range), which putField
// writes as its first and last values.

// fieldKind is a data type that may appear in a set's key or a map's data.
type fieldKind uint8

const (
	kindIPv4 fieldKind = iota
	kindIPv6
	kindProto
	kindService
)

func (k fieldKind) size() int {
	switch k {
	case kindIPv4:
		return 4
	case kindIPv6:
		return 16
	case kindProto:
		return 1
	}
	return 2
}

// valueLen is the length of a key or data of these fields: in a
// concatenation every field is padded to 4 bytes.
func valueLen(fields []fieldKind) int {
	if len(fields) == 1 {
		return fields[0].size()
	}
	n := 0
	for _, k := range fields {
		n += align4(k.size())
	}
	return n
}

// shapeOf is the element shape of a key's fields, if it is one.
func shapeOf(key []fieldKind) (compile.Shape, bool) {
	isAddr := func(k fieldKind) bool { return k == kindIPv4 || k == kindIPv6 }
	switch {
	case len(key) == 1 && isAddr(key[0]):
		return compile.ShapeAddr, true
	case len(key) == 1 && key[0] == kindService:
		return compile.ShapePorts, true
	case len(key) == 2 && isAddr(key[0]) && key[1] == key[0]:
		return compile.ShapeAddrAddr, true
	case len(key) == 2 && key[0] == kindProto && key[1] == kindService:
		return compile.ShapeProtoPorts, true
	case len(key) == 3 && isAddr(key[0]) && key[1] == kindProto && key[2] == kindService:
		return compile.ShapeAddrProtoPort, true
	}
	return 0, false
}

// putField writes the first and last value of an element's key field i,
// of kind k, in network byte order, to first and last (each k.size()
// bytes). The element's shape is the layout's.
func putField(k fieldKind, e *compile.Element, i int, first, last []byte) error {
	switch k {
	case kindIPv4, kindIPv6:
		a, b := e.Addr, e.LastAddr()
		if a.Is4() != (k == kindIPv4) || b.Is4() != (k == kindIPv4) {
			return fmt.Errorf("address %q is not of the set's family", e.Text())
		}
		if a.Zone() != "" || a.Is4In6() || b.Is4In6() || b.Less(a) {
			return fmt.Errorf("address %q: zones, IPv4-mapped forms and descending ranges are not set elements", e.Text())
		}
		putAddr(first, a)
		putAddr(last, b)
	case kindProto:
		first[0], last[0] = byte(e.Ports.Protocol), byte(e.Ports.Protocol)
	case kindService:
		if e.Ports.Last < e.Ports.First {
			return fmt.Errorf("port range %q is descending", e.Text())
		}
		binary.BigEndian.PutUint16(first, e.Ports.First)
		binary.BigEndian.PutUint16(last, e.Ports.Last)
	default:
		return fmt.Errorf("unknown field kind %d", k)
	}
	return nil
}

// putAddr writes an address in network byte order (4 or 16 bytes).
func putAddr(b []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}

// DecodeKey returns the element of a key of a set without the interval
// flag (its key alone), read from the kernel.
func (l *Layout) DecodeKey(key []byte) (compile.Element, error) {
	e := compile.Element{Shape: l.shape}
	if !l.typed || l.interval {
		return e, fmt.Errorf("%w: keys of this set's type", ErrUnsupported)
	}
	concat := len(l.key) > 1
	for i, k := range l.key {
		n := k.size()
		if len(key) < n {
			return e, fmt.Errorf("key %x is shorter than the set's type", key)
		}
		switch k {
		case kindIPv4:
			a := netip.AddrFrom4([4]byte(key[:n]))
			if i > 0 && a != e.Addr {
				return e, fmt.Errorf("key %x: the address fields differ", key)
			}
			e.Addr = a
		case kindIPv6:
			a := netip.AddrFrom16([16]byte(key[:n]))
			if a.Is4In6() || i > 0 && a != e.Addr {
				return e, fmt.Errorf("key %x: an IPv4-mapped address, or address fields that differ", key)
			}
			e.Addr = a
		case kindProto:
			e.Ports.Protocol = compile.Protocol(key[0])
		case kindService:
			p := binary.BigEndian.Uint16(key)
			e.Ports.First, e.Ports.Last = p, p
		}
		if concat {
			pad := align4(n)
			if len(key) < pad {
				return e, fmt.Errorf("key %x is shorter than the set's type", key)
			}
			if strings.Trim(string(key[n:pad]), "\x00") != "" {
				return e, fmt.Errorf("key %x: padding is not zero", key)
			}
			n = pad
		}
		key = key[n:]
	}
	if len(key) != 0 {
		return e, fmt.Errorf("key has %d bytes more than the set's type", len(key))
	}
	return e, nil
}
