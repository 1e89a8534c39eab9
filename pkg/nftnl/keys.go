package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// The fields of set keys and map data, between the text the renderer
// writes (knftables elements) and the bytes the kernel holds: parseField
// is the one decoder of a field's text, formatField its inverse for single
// values. A field is in network byte order: an address is 4 or 16 bytes,
// inet_proto 1 byte, inet_service 2 bytes. Where a set has the interval
// flag, a field's text may be a range ("a-b", or an address prefix), which
// parseField returns as its first and last values.

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

var fieldKinds = map[string]fieldKind{
	"ipv4_addr":    kindIPv4,
	"ipv6_addr":    kindIPv6,
	"inet_proto":   kindProto,
	"inet_service": kindService,
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

func parseKinds(s string) ([]fieldKind, bool) {
	var out []fieldKind
	for _, f := range strings.Split(s, " . ") {
		k, ok := fieldKinds[strings.TrimSpace(f)]
		if !ok {
			return nil, false
		}
		out = append(out, k)
	}
	return out, true
}

// parseField writes the first and last value of a field's text, in network
// byte order, to first and last (each k.size() bytes): a value, an address
// prefix, or a range "a-b".
func parseField(k fieldKind, s string, first, last []byte) error {
	switch k {
	case kindIPv4, kindIPv6:
		a, b, err := parseAddrRange(s)
		if err != nil {
			return err
		}
		if a.Is4() != (k == kindIPv4) || b.Is4() != (k == kindIPv4) {
			return fmt.Errorf("address %q is not of the set's family", s)
		}
		putAddr(first, a)
		putAddr(last, b)
		return nil
	case kindProto:
		if p, ok := compile.ProtocolByName(s); ok {
			first[0], last[0] = byte(p), byte(p)
			return nil
		}
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return fmt.Errorf("protocol %q: not a number 0-255 or a known name", s)
		}
		first[0], last[0] = byte(n), byte(n)
		return nil
	case kindService:
		lo, hi, isRange := strings.Cut(s, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return fmt.Errorf("port %q: not a number 0-65535", s)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a {
				return fmt.Errorf("port range %q: not an ascending range of numbers 0-65535", s)
			}
		}
		binary.BigEndian.PutUint16(first, uint16(a))
		binary.BigEndian.PutUint16(last, uint16(b))
		return nil
	}
	return fmt.Errorf("unknown field kind %d", k)
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

func parseAddrRange(s string) (netip.Addr, netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, netip.Addr{}, err
		}
		if p != p.Masked() {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("prefix %q has host bits set", s)
		}
		return p.Addr(), lastAddr(p), nil
	}
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		a, err := netip.ParseAddr(lo)
		if err != nil {
			return netip.Addr{}, netip.Addr{}, err
		}
		b, err := netip.ParseAddr(hi)
		if err != nil {
			return netip.Addr{}, netip.Addr{}, err
		}
		if a.Is4() != b.Is4() || b.Less(a) {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("address range %q is not ascending within one family", s)
		}
		return a, b, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	if a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("address %q: zones and IPv4-mapped forms are not set elements", s)
	}
	return a, a, nil
}

// lastAddr is the last address of a prefix, computed in an array (no
// allocation).
func lastAddr(p netip.Prefix) netip.Addr {
	if p.Addr().Is4() {
		a := p.Addr().As4()
		for i := p.Bits(); i < 32; i++ {
			a[i/8] |= 0x80 >> (i % 8)
		}
		return netip.AddrFrom4(a)
	}
	a := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom16(a)
}

// DecodeKey returns the text form of a key of a set without the interval
// flag, in the forms nft reads back: addresses, and protocols and ports as
// numbers.
func (l *Layout) DecodeKey(key []byte) ([]string, error) {
	out := make([]string, 0, len(l.key))
	concat := len(l.key) > 1
	for _, k := range l.key {
		n := k.size()
		if len(key) < n {
			return nil, fmt.Errorf("key %x is shorter than the set's type", key)
		}
		out = append(out, formatField(k, key[:n]))
		if concat {
			n = align4(n)
		}
		if len(key) < n {
			return nil, fmt.Errorf("key %x is shorter than the set's type", key)
		}
		key = key[n:]
	}
	if len(key) != 0 {
		return nil, fmt.Errorf("key has %d bytes more than the set's type", len(key))
	}
	return out, nil
}

// formatField is the text of a single value of a field (k.size() bytes),
// in the form nft lists: addresses, and protocols and ports as numbers.
func formatField(k fieldKind, b []byte) string {
	switch k {
	case kindIPv4:
		return netip.AddrFrom4([4]byte(b)).String()
	case kindIPv6:
		return netip.AddrFrom16([16]byte(b)).String()
	case kindProto:
		return strconv.Itoa(int(b[0]))
	}
	return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
}
