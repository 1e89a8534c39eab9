package sets

// Element text to netlink element bytes, as nft 1.0.6 writes them (checked
// against nft itself by TestNetlinkElementsMatchNFT):
//
//   - A key field is in network byte order: an address is 4 or 16 bytes,
//     inet_proto 1 byte, inet_service 2 bytes. In a concatenation every
//     field is padded with zeroes to a multiple of 4 bytes (the kernel's
//     32-bit registers); a key of one field is not padded.
//   - An interval set with one key field (the kernel's rbtree) stores a range
//     as two elements: its first value, and the value after its last one
//     flagged NFT_SET_ELEM_INTERVAL_END. A range that ends at the largest
//     value has no end element: its start carries the "open interval" flag
//     in its userdata instead, which is how nft lists it back as a range.
//   - An interval set with a concatenated key (pipapo) stores a range as one
//     element with the first values in the key and the last ones in the key
//     end attribute; a single value has key end = key.
//   - A comment is a userdata TLV (NFTNL_UDATA_SET_ELEM_COMMENT) holding the
//     text and its terminating NUL.
//   - A verdict map's data is a verdict: its code and, for jump and goto,
//     the chain.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

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

// Element flags and userdata types of the kernel and libnftnl.
const (
	udataSetElemComment  = 0 // NFTNL_UDATA_SET_ELEM_COMMENT
	udataSetElemFlags    = 1 // NFTNL_UDATA_SET_ELEM_FLAGS
	setElemFIntervalOpen = 1 // NFTNL_SET_ELEM_F_INTERVAL_OPEN
)

// elementLayout is what a set's or map's declaration says about the bytes
// of its elements.
type elementLayout struct {
	key      []fieldKind
	data     []fieldKind // data of a non-verdict map
	verdict  bool        // a verdict map
	interval bool
}

// errUnsupported marks a set the netlink path cannot write (a typeof
// declaration, a data type it does not know): its changes go through nft.
var errUnsupported = errors.New("not supported by the netlink element writer")

// layoutOf reads a set's or map's declaration.
func layoutOf(s *compile.Set) (elementLayout, error) {
	var typ, typeOf string
	var flags []knftables.SetFlag
	isMap := s.Map != nil
	if isMap {
		typ, typeOf, flags = s.Map.Type, s.Map.TypeOf, s.Map.Flags
	} else if s.Set != nil {
		typ, typeOf, flags = s.Set.Type, s.Set.TypeOf, s.Set.Flags
	} else {
		return elementLayout{}, errors.New("neither a set nor a map")
	}
	if typeOf != "" || typ == "" {
		return elementLayout{}, fmt.Errorf("%w: typeof declaration %q", errUnsupported, typeOf)
	}
	var l elementLayout
	for _, f := range flags {
		switch f {
		case knftables.IntervalFlag:
			l.interval = true
		case knftables.ConstantFlag:
		default:
			// Timeouts and dynamic sets have element attributes this
			// writer does not produce.
			return elementLayout{}, fmt.Errorf("%w: set flag %q", errUnsupported, f)
		}
	}
	keyType := typ
	if isMap {
		k, v, ok := strings.Cut(typ, " : ")
		if !ok {
			return elementLayout{}, fmt.Errorf("map type %q has no data type", typ)
		}
		keyType = k
		if strings.TrimSpace(v) == "verdict" {
			l.verdict = true
		} else if l.data, ok = parseKinds(v); !ok {
			return elementLayout{}, fmt.Errorf("%w: map data type %q", errUnsupported, v)
		}
	}
	var ok bool
	if l.key, ok = parseKinds(keyType); !ok {
		return elementLayout{}, fmt.Errorf("%w: key type %q", errUnsupported, keyType)
	}
	return l, nil
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

// verdict codes (include/uapi/linux/netfilter/nf_tables.h, netfilter.h).
var verdictCodes = map[string]int32{
	"drop": 0, "accept": 1, "continue": -1, "jump": -3, "goto": -4, "return": -5,
}

// nlElement is one kernel element.
type nlElement struct {
	key, keyEnd []byte
	flags       uint32 // NFT_SET_ELEM_INTERVAL_END
	verdict     int32
	chain       string
	data        []byte
	hasVerdict  bool
	udata       []byte
	// timeoutMS is NFTA_SET_ELEM_TIMEOUT in milliseconds (0: none).
	timeoutMS uint64
}

// encodedLen estimates the element's size in a netlink message, to split
// element lists below the 64 KiB limit of one attribute.
func (e *nlElement) encodedLen() int {
	return 4 + 8 + len(e.key) + 8 + len(e.keyEnd) + 8 + 16 + len(e.chain) + 8 + len(e.data) + 4 + len(e.udata) + 8 + 12
}

// encode converts one element of the text form into the kernel elements
// that represent it. forDelete leaves out what a deletion does not carry
// (data, comments).
func (l *elementLayout) encode(e *knftables.Element, forDelete bool) ([]nlElement, error) {
	if len(e.Key) != len(l.key) {
		return nil, fmt.Errorf("element %q has %d key fields, the set's type has %d", strings.Join(e.Key, " . "), len(e.Key), len(l.key))
	}
	concat := len(l.key) > 1
	var start, end []byte
	for i, k := range l.key {
		first, last, err := parseField(k, e.Key[i])
		if err != nil {
			return nil, err
		}
		if !slices.Equal(first, last) {
			if !l.interval {
				return nil, fmt.Errorf("range %q in a set without the interval flag", e.Key[i])
			}
		}
		start = appendField(start, first, concat)
		end = appendField(end, last, concat)
	}
	el := nlElement{key: start}
	if !forDelete {
		if l.verdict {
			if len(e.Value) != 1 {
				return nil, fmt.Errorf("verdict map element %q needs one verdict, has %q", strings.Join(e.Key, " . "), e.Value)
			}
			code, chain, err := parseVerdict(e.Value[0])
			if err != nil {
				return nil, err
			}
			el.hasVerdict, el.verdict, el.chain = true, code, chain
		} else if l.data != nil {
			if len(e.Value) != len(l.data) {
				return nil, fmt.Errorf("map element %q has %d data fields, the map's type has %d", strings.Join(e.Key, " . "), len(e.Value), len(l.data))
			}
			for i, k := range l.data {
				v, last, err := parseField(k, e.Value[i])
				if err != nil {
					return nil, err
				}
				if !slices.Equal(v, last) {
					return nil, fmt.Errorf("map data %q is a range", e.Value[i])
				}
				el.data = appendField(el.data, v, len(l.data) > 1)
			}
		} else if len(e.Value) != 0 {
			return nil, fmt.Errorf("set element %q has a value", strings.Join(e.Key, " . "))
		}
		if e.Comment != nil {
			if len(*e.Comment) > knftables.CommentLengthMax {
				return nil, fmt.Errorf("element comment longer than %d bytes", knftables.CommentLengthMax)
			}
			el.udata = appendUdata(nil, udataSetElemComment, append([]byte(*e.Comment), 0))
		}
	}
	switch {
	case !l.interval:
		return []nlElement{el}, nil
	case concat:
		el.keyEnd = end
		return []nlElement{el}, nil
	}
	after, ok := increment(end)
	if !ok {
		// Nothing after the last value: an open interval.
		if !forDelete {
			var f [4]byte
			binary.NativeEndian.PutUint32(f[:], setElemFIntervalOpen)
			el.udata = appendUdata(el.udata, udataSetElemFlags, f[:])
		}
		return []nlElement{el}, nil
	}
	return []nlElement{el, {key: after, flags: unix.NFT_SET_ELEM_INTERVAL_END}}, nil
}

func appendUdata(b []byte, typ byte, v []byte) []byte {
	b = append(b, typ, byte(len(v)))
	return append(b, v...)
}

func appendField(b, f []byte, pad bool) []byte {
	b = append(b, f...)
	if pad {
		for n := len(f); n%4 != 0; n++ {
			b = append(b, 0)
		}
	}
	return b
}

// increment returns b+1 as a big-endian number; false when b is all ones.
func increment(b []byte) ([]byte, bool) {
	out := slices.Clone(b)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			return out, true
		}
	}
	return nil, false
}

// parseField returns the first and last value of a field's text, in
// network byte order: a value, an address prefix, or a range "a-b".
func parseField(k fieldKind, s string) (first, last []byte, err error) {
	switch k {
	case kindIPv4, kindIPv6:
		a, b, err := parseAddrRange(s)
		if err != nil {
			return nil, nil, err
		}
		if a.Is4() != (k == kindIPv4) || b.Is4() != (k == kindIPv4) {
			return nil, nil, fmt.Errorf("address %q is not of the set's family", s)
		}
		return a.AsSlice(), b.AsSlice(), nil
	case kindProto:
		if p, ok := compile.ProtocolByName(s); ok {
			return []byte{byte(p)}, []byte{byte(p)}, nil
		}
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return nil, nil, fmt.Errorf("protocol %q: not a number 0-255 or a known name", s)
		}
		return []byte{byte(n)}, []byte{byte(n)}, nil
	case kindService:
		lo, hi, isRange := strings.Cut(s, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, nil, fmt.Errorf("port %q: not a number 0-65535", s)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a {
				return nil, nil, fmt.Errorf("port range %q: not an ascending range of numbers 0-65535", s)
			}
		}
		return binary.BigEndian.AppendUint16(nil, uint16(a)), binary.BigEndian.AppendUint16(nil, uint16(b)), nil
	}
	return nil, nil, fmt.Errorf("unknown field kind %d", k)
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
		a := p.Addr().AsSlice()
		for i := p.Bits(); i < len(a)*8; i++ {
			a[i/8] |= 0x80 >> (i % 8)
		}
		last, _ := netip.AddrFromSlice(a)
		return p.Addr(), last, nil
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

// parseVerdict reads "accept", "drop", "continue", "return", "jump C" or
// "goto C".
func parseVerdict(s string) (int32, string, error) {
	word, chain, hasChain := strings.Cut(strings.TrimSpace(s), " ")
	code, ok := verdictCodes[word]
	if !ok {
		return 0, "", fmt.Errorf("verdict %q: unknown", s)
	}
	needsChain := word == "jump" || word == "goto"
	chain = strings.TrimSpace(chain)
	if needsChain != (hasChain && chain != "") {
		return 0, "", fmt.Errorf("verdict %q: jump and goto need a chain, other verdicts take none", s)
	}
	if len(chain) > 255 || strings.ContainsAny(chain, " \x00") {
		return 0, "", fmt.Errorf("verdict %q: bad chain name", s)
	}
	return code, chain, nil
}
