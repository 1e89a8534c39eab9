package nftnl

// Typed elements (compile.Element) to netlink element bytes, as nft 1.0.6
// writes them for the elements' text (checked
// against nft itself by TestNetlinkElementsMatchNFT):
//
//   - A key field is in network byte order (keys.go). In a concatenation
//     every field is padded with zeroes to a multiple of 4 bytes (the
//     kernel's 32-bit registers); a key of one field is not padded.
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
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Element flags and userdata types of the kernel and libnftnl.
const (
	udataSetElemComment  = 0 // NFTNL_UDATA_SET_ELEM_COMMENT
	udataSetElemFlags    = 1 // NFTNL_UDATA_SET_ELEM_FLAGS
	setElemFIntervalOpen = 1 // NFTNL_SET_ELEM_F_INTERVAL_OPEN
)

// Layout is what a set's or map's declaration says about the bytes
// of its elements.
type Layout struct {
	key      []fieldKind
	data     []fieldKind // data of a non-verdict map
	verdict  bool        // a verdict map
	interval bool
	// shape is the elements' shape, when the key is one of them (typed).
	shape compile.Shape
	typed bool
}

// ErrUnsupported marks a set the netlink path cannot write (a typeof
// declaration, a data type it does not know): its changes go through nft.
var ErrUnsupported = errors.New("not supported by the netlink element writer")

// LayoutOf reads a set's or map's typed declaration: its key fields
// (compile.Set.Key), its flags, and for a map a verdict as data.
func LayoutOf(s *compile.Set) (Layout, error) {
	var typeOf string
	var flags []knftables.SetFlag
	isMap := s.Map != nil
	if isMap {
		typeOf, flags = s.Map.TypeOf, s.Map.Flags
	} else if s.Set != nil {
		typeOf, flags = s.Set.TypeOf, s.Set.Flags
	} else {
		return Layout{}, errors.New("neither a set nor a map")
	}
	if typeOf != "" {
		return Layout{}, fmt.Errorf("%w: typeof declaration %q", ErrUnsupported, typeOf)
	}
	if len(s.Key) == 0 {
		return Layout{}, fmt.Errorf("%w: set %s has no typed key", ErrUnsupported, s.Name())
	}
	l := Layout{verdict: isMap}
	for _, f := range flags {
		switch f {
		case knftables.IntervalFlag:
			l.interval = true
		case knftables.ConstantFlag:
		default:
			// Timeouts and dynamic sets have element attributes this
			// writer does not produce.
			return Layout{}, fmt.Errorf("%w: set flag %q", ErrUnsupported, f)
		}
	}
	l.key = make([]fieldKind, len(s.Key))
	for i, k := range s.Key {
		fk, ok := keyFieldKinds[k]
		if !ok {
			return Layout{}, fmt.Errorf("%w: key field %s", ErrUnsupported, k)
		}
		l.key[i] = fk
	}
	if valueLen(l.key) > maxValueLen {
		return Layout{}, fmt.Errorf("%w: key %v longer than %d bytes", ErrUnsupported, s.Key, maxValueLen)
	}
	l.shape, l.typed = shapeOf(l.key)
	return l, nil
}

// keyFieldKinds are the field kinds of the compiler's key fields.
var keyFieldKinds = map[compile.KeyKind]fieldKind{
	compile.KeyIPv4: kindIPv4, compile.KeyIPv6: kindIPv6, compile.KeyProto: kindProto, compile.KeyService: kindService,
}

// verdict codes (include/uapi/linux/netfilter/nf_tables.h, netfilter.h).
var verdictCodes = map[compile.VerdictKind]int32{
	compile.VerdictDrop: 0, compile.VerdictAccept: 1, compile.VerdictJump: -3, compile.VerdictGoto: -4, compile.VerdictReturn: -5,
}

// maxValueLen is NFT_DATA_VALUE_MAXLEN: the longest key or map data the
// kernel takes.
const maxValueLen = 64

// Element is one kernel element, held in fixed arrays so that encoding
// an element allocates nothing: chain and comment point into the desired
// element's strings.
type Element struct {
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

func (e *Element) key() []byte { return e.keyBuf[:e.keyLen] }

// keyEnd is nil when the element has none.
func (e *Element) keyEnd() []byte {
	if e.keyEndLen == 0 {
		return nil
	}
	return e.keyEndBuf[:e.keyEndLen]
}

// data is nil when the element has none.
func (e *Element) data() []byte {
	if e.dataLen == 0 {
		return nil
	}
	return e.dataBuf[:e.dataLen]
}

// appendUdata appends the element's userdata TLVs, as libnftnl writes
// them: the comment with its terminating NUL, then the flags.
func (e *Element) appendUdata(b []byte) []byte {
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
func (e *Element) udataLen() int {
	n := 0
	if e.hasComment {
		n += 2 + len(e.comment) + 1
	}
	if e.open {
		n += 2 + 4
	}
	return n
}

// Encode converts one element, to be added, into the kernel elements that
// represent it (encode).
func (l *Layout) Encode(e *compile.Element, out *[2]Element) (int, error) {
	return l.encode(e, false, out)
}

// Interval reports a set with the interval flag.
func (l *Layout) Interval() bool { return l.interval }

// encode converts one element into the kernel elements that represent it
// (one, or two for a range of an interval set with one key field), stored
// in out; it returns how many. forDelete leaves out what a deletion does
// not carry (value, comment).
func (l *Layout) encode(e *compile.Element, forDelete bool, out *[2]Element) (int, error) {
	if !l.typed || e.Shape != l.shape {
		return 0, fmt.Errorf("%w: element %q does not have the fields of the set's type", ErrUnsupported, e.Text())
	}
	el := &out[0]
	*el = Element{}
	concat := len(l.key) > 1
	// The last values go to keyEndBuf, which only a concatenated interval
	// set keeps.
	off := 0
	for i, k := range l.key {
		n := k.size()
		first, last := el.keyBuf[off:off+n], el.keyEndBuf[off:off+n]
		if err := putField(k, e, i, first, last); err != nil {
			return 0, err
		}
		if !l.interval && !bytes.Equal(first, last) {
			return 0, fmt.Errorf("range %q in a set without the interval flag", e.Text())
		}
		off += n
		if concat {
			off = align4(off)
		}
	}
	el.keyLen = uint8(off)
	if !forDelete {
		if err := l.encodePayload(e, el); err != nil {
			return 0, err
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
	*after = Element{keyLen: el.keyLen, flags: unix.NFT_SET_ELEM_INTERVAL_END}
	copy(after.keyBuf[:], el.keyEndBuf[:el.keyLen])
	clear(el.keyEndBuf[:el.keyLen])
	if !increment(after.key()) {
		// Nothing after the last value: an open interval.
		el.open = !forDelete
		return 1, nil
	}
	return 2, nil
}

// encodePayload sets what an addition carries besides the key: a verdict
// map's verdict and the comment.
func (l *Layout) encodePayload(e *compile.Element, el *Element) error {
	switch {
	case l.verdict:
		code, err := verdictCode(e.Value())
		if err != nil {
			return err
		}
		el.hasVerdict, el.verdict, el.chain = true, code, e.Chain
	case l.data != nil:
		return fmt.Errorf("%w: map data", ErrUnsupported)
	case e.Verdict != compile.VerdictNone:
		return fmt.Errorf("set element %q has a value", e.Text())
	}
	if e.Comment != nil {
		if len(*e.Comment) > knftables.CommentLengthMax {
			return fmt.Errorf("element comment longer than %d bytes", knftables.CommentLengthMax)
		}
		el.hasComment, el.comment = true, *e.Comment
	}
	return nil
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

// verdictCode is a verdict's code; jump and goto need a chain, the
// others take none.
func verdictCode(v compile.RuleVerdict) (int32, error) {
	code, ok := verdictCodes[v.Kind]
	if !ok {
		return 0, fmt.Errorf("verdict kind %d: not a verdict", v.Kind)
	}
	needsChain := v.Kind == compile.VerdictJump || v.Kind == compile.VerdictGoto
	if needsChain != (v.Chain != "") || len(v.Chain) > 255 || strings.ContainsAny(v.Chain, " \x00") {
		return 0, fmt.Errorf("verdict %q: jump and goto need a chain, other verdicts take none", v)
	}
	return code, nil
}

// appendUdata appends one userdata TLV (libnftnl's: type, length, value).
func appendUdata(b []byte, typ byte, v []byte) []byte {
	b = append(b, typ, byte(len(v)))
	return append(b, v...)
}
