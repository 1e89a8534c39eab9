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
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
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
	if valueLen(l.key) > maxValueLen || valueLen(l.data) > maxValueLen {
		return elementLayout{}, fmt.Errorf("%w: type %q longer than %d bytes", errUnsupported, typ, maxValueLen)
	}
	return l, nil
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

// verdict codes (include/uapi/linux/netfilter/nf_tables.h, netfilter.h).
var verdictCodes = map[string]int32{
	"drop": 0, "accept": 1, "continue": -1, "jump": -3, "goto": -4, "return": -5,
}

// maxValueLen is NFT_DATA_VALUE_MAXLEN: the longest key or map data the
// kernel takes.
const maxValueLen = 64

// nlElement is one kernel element, held in fixed arrays so that encoding
// an element allocates nothing: chain and comment point into the element's
// text.
type nlElement struct {
	keyBuf, keyEndBuf, dataBuf [maxValueLen]byte
	keyLen, keyEndLen, dataLen uint8
	flags                      uint32 // NFT_SET_ELEM_INTERVAL_END
	hasVerdict                 bool
	verdict                    int32
	chain                      string
	// hasComment: the comment (possibly empty) is userdata.
	hasComment bool
	comment    string
	// open: the "open interval" flag is userdata.
	open bool
	// timeoutMS is NFTA_SET_ELEM_TIMEOUT in milliseconds (0: none).
	timeoutMS uint64
}

func (e *nlElement) key() []byte { return e.keyBuf[:e.keyLen] }

// keyEnd is nil when the element has none.
func (e *nlElement) keyEnd() []byte {
	if e.keyEndLen == 0 {
		return nil
	}
	return e.keyEndBuf[:e.keyEndLen]
}

// data is nil when the element has none.
func (e *nlElement) data() []byte {
	if e.dataLen == 0 {
		return nil
	}
	return e.dataBuf[:e.dataLen]
}

// appendUdata appends the element's userdata TLVs, as libnftnl writes
// them: the comment with its terminating NUL, then the flags.
func (e *nlElement) appendUdata(b []byte) []byte {
	if e.hasComment {
		b = append(b, udataSetElemComment, byte(len(e.comment)+1))
		b = append(b, e.comment...)
		b = append(b, 0)
	}
	if e.open {
		b = append(b, udataSetElemFlags, 4)
		b = binary.NativeEndian.AppendUint32(b, setElemFIntervalOpen)
	}
	return b
}

// udataLen is len(e.appendUdata(nil)).
func (e *nlElement) udataLen() int {
	n := 0
	if e.hasComment {
		n += 2 + len(e.comment) + 1
	}
	if e.open {
		n += 2 + 4
	}
	return n
}

// encode converts one element of the text form into the kernel elements
// that represent it (one, or two for a range of an interval set with one
// key field), stored in out; it returns how many. forDelete leaves out
// what a deletion does not carry (data, comments).
func (l *elementLayout) encode(e *knftables.Element, forDelete bool, out *[2]nlElement) (int, error) {
	if len(e.Key) != len(l.key) {
		return 0, fmt.Errorf("element %q has %d key fields, the set's type has %d", strings.Join(e.Key, " . "), len(e.Key), len(l.key))
	}
	el := &out[0]
	*el = nlElement{}
	concat := len(l.key) > 1
	// The last values go to keyEndBuf, which only a concatenated interval
	// set keeps.
	off := 0
	for i, k := range l.key {
		n := k.size()
		first, last := el.keyBuf[off:off+n], el.keyEndBuf[off:off+n]
		if err := parseField(k, e.Key[i], first, last); err != nil {
			return 0, err
		}
		if !l.interval && !bytes.Equal(first, last) {
			return 0, fmt.Errorf("range %q in a set without the interval flag", e.Key[i])
		}
		off += n
		if concat {
			off = align4(off)
		}
	}
	el.keyLen = uint8(off)
	if !forDelete {
		if l.verdict {
			if len(e.Value) != 1 {
				return 0, fmt.Errorf("verdict map element %q needs one verdict, has %q", strings.Join(e.Key, " . "), e.Value)
			}
			code, chain, err := parseVerdict(e.Value[0])
			if err != nil {
				return 0, err
			}
			el.hasVerdict, el.verdict, el.chain = true, code, chain
		} else if l.data != nil {
			if len(e.Value) != len(l.data) {
				return 0, fmt.Errorf("map element %q has %d data fields, the map's type has %d", strings.Join(e.Key, " . "), len(e.Value), len(l.data))
			}
			var scratch [16]byte
			off := 0
			for i, k := range l.data {
				n := k.size()
				v := el.dataBuf[off : off+n]
				if err := parseField(k, e.Value[i], v, scratch[:n]); err != nil {
					return 0, err
				}
				if !bytes.Equal(v, scratch[:n]) {
					return 0, fmt.Errorf("map data %q is a range", e.Value[i])
				}
				off += n
				if len(l.data) > 1 {
					off = align4(off)
				}
			}
			el.dataLen = uint8(off)
		} else if len(e.Value) != 0 {
			return 0, fmt.Errorf("set element %q has a value", strings.Join(e.Key, " . "))
		}
		if e.Comment != nil {
			if len(*e.Comment) > knftables.CommentLengthMax {
				return 0, fmt.Errorf("element comment longer than %d bytes", knftables.CommentLengthMax)
			}
			el.hasComment, el.comment = true, *e.Comment
		}
	}
	switch {
	case !l.interval:
		return 1, nil
	case concat:
		el.keyEndLen = el.keyLen
		return 1, nil
	}
	after := &out[1]
	*after = nlElement{keyLen: el.keyLen, flags: unix.NFT_SET_ELEM_INTERVAL_END}
	copy(after.keyBuf[:], el.keyEndBuf[:el.keyLen])
	clear(el.keyEndBuf[:el.keyLen])
	if !increment(after.key()) {
		// Nothing after the last value: an open interval.
		el.open = !forDelete
		return 1, nil
	}
	return 2, nil
}

func align4(n int) int { return (n + 3) &^ 3 }

// increment adds one to b, a big-endian number, in place; false when b
// was all ones.
func increment(b []byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		b[i]++
		if b[i] != 0 {
			return true
		}
	}
	return false
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

// appendUdata appends one userdata TLV (libnftnl's: type, length, value).
func appendUdata(b []byte, typ byte, v []byte) []byte {
	b = append(b, typ, byte(len(v)))
	return append(b, v...)
}
