package nftnl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Reading back what the kernel has, for a full sync over an existing table
// (resync.go): the declarations of the table's sets and maps, and the
// elements of those the sync may keep, over netlink. nft is not used: it
// would list every rule and element and print them as text, the very
// parsing a re-sync means to avoid.

// Attributes and flags missing from x/sys/unix (linux/netfilter/nf_tables.h).
const (
	nftaSetDescConcat       = 2    // NFTA_SET_DESC_CONCAT
	nftaSetHandle           = 0x10 // NFTA_SET_HANDLE
	nftaSetExpr             = 0x11 // NFTA_SET_EXPR
	nftaSetExpressions      = 0x12 // NFTA_SET_EXPRESSIONS
	nftaSetElemExpressions  = 0xb  // NFTA_SET_ELEM_EXPRESSIONS
	nftSetConcat            = 0x80 // NFT_SET_CONCAT
	nftSetElemCatchall      = 0x2  // NFT_SET_ELEM_CATCHALL
	udataSetMergeElements   = 2    // NFTNL_UDATA_SET_MERGE_ELEMENTS
	udataSetComment         = 7    // NFTNL_UDATA_SET_COMMENT
	udataSetKeyByteorder    = 0    // NFTNL_UDATA_SET_KEYBYTEORDER
	udataSetDataByteorder   = 1    // NFTNL_UDATA_SET_DATABYTEORDER
	udataSetKeyTypeof       = 3    // NFTNL_UDATA_SET_KEY_TYPEOF
	udataSetDataInterval    = 6    // NFTNL_UDATA_SET_DATA_INTERVAL
	nftDatatypeBits         = 6    // TYPE_BITS of nft's concatenated type ids
	nftDatatypeVerdict      = 1    // TYPE_VERDICT
	nftDatatypeIPv4Addr     = 7    // TYPE_IPADDR
	nftDatatypeIPv6Addr     = 8    // TYPE_IP6ADDR
	nftDatatypeInetProtocol = 12   // TYPE_INET_PROTOCOL
	nftDatatypeInetService  = 13   // TYPE_INET_SERVICE
)

// SetDecl is the declaration of a named set or map as the kernel holds
// it: what decides whether the desired set of that name may be kept and
// only its elements compared.
type SetDecl struct {
	name              string
	flags             uint32
	keyType, keyLen   uint32
	dataType, dataLen uint32
	hasData           bool
	// policy is NFTA_SET_POLICY; the kernel reports it only when it is not
	// the default (performance).
	policy, hasPolicy bool
	size              uint32
	timeoutMS         uint64
	gcIntervalMS      uint32
	udata             []byte
	// other is anything this reader does not compare (set expressions such
	// as per-element counters, object maps): such a set is never kept.
	other bool
	// handle is the kernel's handle of the set: a set deleted and added
	// again under the same name gets another one.
	handle uint64
}

// SameObject reports whether o describes the same kernel set as k, still
// declared the same: same handle, same declaration. Elements read under
// k are the set's elements under o unless they were changed in between.
func (k *SetDecl) SameObject(o *SetDecl) bool {
	return k.handle != 0 && k.name == o.name && k.handle == o.handle && k.flags == o.flags &&
		k.keyType == o.keyType && k.keyLen == o.keyLen && k.dataType == o.dataType && k.dataLen == o.dataLen &&
		k.hasData == o.hasData && k.policy == o.policy && k.hasPolicy == o.hasPolicy && k.size == o.size &&
		k.timeoutMS == o.timeoutMS && k.gcIntervalMS == o.gcIntervalMS && bytes.Equal(k.udata, o.udata) && k.other == o.other
}

// Comparable reports whether a sync may compare the set's elements with
// desired ones: false for a set with what this reader does not compare.
func (k *SetDecl) Comparable() bool { return !k.other }

// Expires reports whether the set's elements time out (a set a learner
// fills, whose elements a sync never compares).
func (k *SetDecl) Expires() bool { return k.flags&unix.NFT_SET_TIMEOUT != 0 }

// parseKernelSet reads one NFT_MSG_NEWSET reply's attributes; table is
// the table it names.
func parseKernelSet(ad *netlink.AttributeDecoder) (table string, k SetDecl) {
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_TABLE:
			table = ad.String()
		case unix.NFTA_SET_NAME:
			k.name = ad.String()
		case unix.NFTA_SET_FLAGS:
			k.flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			k.keyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			k.keyLen = ad.Uint32()
		case unix.NFTA_SET_DATA_TYPE:
			k.dataType, k.hasData = ad.Uint32(), true
		case unix.NFTA_SET_DATA_LEN:
			k.dataLen = ad.Uint32()
		case unix.NFTA_SET_POLICY:
			k.hasPolicy, k.policy = true, ad.Uint32() == unix.NFT_SET_POL_MEMORY
		case unix.NFTA_SET_DESC:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					if d.Type() == unix.NFTA_SET_DESC_SIZE {
						k.size = d.Uint32()
					}
					// NFTA_SET_DESC_CONCAT: the field lengths, which the key
					// type already says.
				}
				return nil
			})
		case unix.NFTA_SET_TIMEOUT:
			k.timeoutMS = ad.Uint64()
		case unix.NFTA_SET_GC_INTERVAL:
			k.gcIntervalMS = ad.Uint32()
		case unix.NFTA_SET_USERDATA:
			k.udata = ad.Bytes()
		case nftaSetHandle:
			k.handle = ad.Uint64()
		case unix.NFTA_SET_OBJ_TYPE, nftaSetExpr, nftaSetExpressions:
			k.other = true
		}
	}
	return table, k
}

// nftDatatypes are the nft data type ids and key lengths of the field
// kinds keys.go knows.
var nftDatatypes = map[fieldKind]uint32{
	kindIPv4:    nftDatatypeIPv4Addr,
	kindIPv6:    nftDatatypeIPv6Addr,
	kindProto:   nftDatatypeInetProtocol,
	kindService: nftDatatypeInetService,
}

// typeOfFields is the type id and length nft declares for a key or data of
// these fields: a concatenation's id packs the fields' ids 6 bits each, and
// its length pads every field to 4 bytes.
func typeOfFields(fields []fieldKind) (id, length uint32) {
	for _, f := range fields {
		id = id<<nftDatatypeBits | nftDatatypes[f]
		n := uint32(f.size())
		if len(fields) > 1 {
			n = (n + 3) &^ 3
		}
		length += n
	}
	return id, length
}

// Matches reports whether the kernel's declaration k is the
// one nft writes for the desired set or map d. Anything it cannot tell
// (a typeof declaration, a data type it does not know, an attribute it
// does not compare) is a difference: the set is then replaced, which is
// always correct.
func (k *SetDecl) Matches(d *compile.Set) bool {
	if k.other || (d.Map != nil) != (k.flags&unix.NFT_SET_MAP != 0) {
		return false
	}
	var typeOf string
	var flags []knftables.SetFlag
	var timeout, gc *time.Duration
	var size *uint64
	var policy *knftables.SetPolicy
	var comment *string
	var autoMerge *bool
	switch {
	case d.Map != nil:
		m := d.Map
		typeOf, flags, timeout, gc, size, policy, comment = m.TypeOf, m.Flags, m.Timeout, m.GCInterval, m.Size, m.Policy, m.Comment
	case d.Set != nil:
		s := d.Set
		typeOf, flags, timeout, gc, size, policy, comment, autoMerge = s.TypeOf, s.Flags, s.Timeout, s.GCInterval, s.Size, s.Policy, s.Comment, s.AutoMerge
	default:
		return false
	}
	if typeOf != "" {
		return false
	}
	// Key and data types: the typed key; a map's data is a verdict.
	key := make([]fieldKind, len(d.Key))
	for i, kk := range d.Key {
		f, ok := keyFieldKinds[kk]
		if !ok {
			return false
		}
		key[i] = f
	}
	if id, n := typeOfFields(key); len(key) == 0 || k.keyType != id || k.keyLen != n {
		return false
	}
	if d.Map == nil && k.hasData || d.Map != nil && (!k.hasData || k.dataType != unix.NFT_DATA_VERDICT) {
		return false
	}
	// Flags: NFT_SET_CONCAT follows from the key type and the interval
	// flag.
	want := uint32(0)
	if d.Map != nil {
		want |= unix.NFT_SET_MAP
	}
	for _, f := range flags {
		switch f {
		case knftables.ConstantFlag:
			want |= unix.NFT_SET_CONSTANT
		case knftables.IntervalFlag:
			want |= unix.NFT_SET_INTERVAL
		case knftables.TimeoutFlag:
			want |= unix.NFT_SET_TIMEOUT
		case knftables.DynamicFlag:
			want |= unix.NFT_SET_EVAL
		default:
			return false
		}
	}
	if k.flags&^nftSetConcat != want {
		return false
	}
	if ms := durationMS(timeout); k.timeoutMS != ms {
		return false
	}
	if ms := durationMS(gc); uint64(k.gcIntervalMS) != ms {
		return false
	}
	if size != nil && uint64(k.size) != *size || size == nil && k.size != 0 {
		return false
	}
	if (policy != nil && *policy == knftables.MemoryPolicy) != (k.hasPolicy && k.policy) {
		return false
	}
	return sameSetUserdata(k.udata, comment, autoMerge, len(key) > 1)
}

func durationMS(d *time.Duration) uint64 {
	if d == nil {
		return 0
	}
	return uint64(*d / time.Millisecond)
}

// concatTypeofUdata is the key "typeof" record nft 1.0.6 writes for a key
// declared with `type a . b`: a concatenation expression (type 13) with no
// field expressions. A key declared with typeof has its fields' expressions
// there instead.
var concatTypeofUdata = func() []byte {
	b := appendUdata(nil, 0, binary.NativeEndian.AppendUint32(nil, 13))
	return appendUdata(b, 1, nil)
}()

// sameSetUserdata compares a set's userdata TLVs (libnftnl's: type, length,
// value) with the desired comment and auto-merge flag. The byte orders nft
// records follow from the types; nft records that the data of a map is not
// an interval, and an empty "typeof" of a concatenated key declared by
// type; any other record (typeof expressions, set expressions) is a
// difference.
func sameSetUserdata(udata []byte, comment *string, autoMerge *bool, concat bool) bool {
	var gotComment *string
	merge := false
	for len(udata) > 0 {
		if len(udata) < 2 || len(udata) < 2+int(udata[1]) {
			return false
		}
		typ, v := udata[0], udata[2:2+int(udata[1])]
		udata = udata[2+int(udata[1]):]
		switch typ {
		case udataSetKeyByteorder, udataSetDataByteorder:
		case udataSetDataInterval:
			if !allZero(v) {
				return false
			}
		case udataSetKeyTypeof:
			if !concat || !bytes.Equal(v, concatTypeofUdata) {
				return false
			}
		case udataSetComment:
			c := string(bytes.TrimSuffix(v, []byte{0}))
			gotComment = &c
		case udataSetMergeElements:
			merge = !allZero(v)
		default:
			return false
		}
	}
	sameComment := gotComment == nil && comment == nil || gotComment != nil && comment != nil && *gotComment == *comment
	return sameComment && merge == (autoMerge != nil && *autoMerge)
}

// KernelElement is one element of a set as the kernel dumps it.
type KernelElement struct {
	key, keyEnd []byte
	flags       uint32
	hasVerdict  bool
	verdict     int32
	chain       string
	data        []byte
	udata       []byte
	// other: an attribute the desired elements never have (a timeout, an
	// expression, an object reference) or a catch-all element.
	other bool
}

// SetElements dumps the elements of the table's set or map name. The
// replies are walked by hand (nla), not with netlink.AttributeDecoder,
// whose closures per attribute cost more than the kernel's dump; the
// element's byte slices point into the reply and are valid during fn
// only.
func (w *Conn) SetElements(ctx context.Context, name string, fn func(*KernelElement)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		if err := w.dial(); err != nil {
			return err
		}
	}
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, w.table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	err = w.dumpMessages(ctx, unix.NFT_MSG_GETSETELEM, attrs, func(b []byte) error {
		for a := (nla{b: b}); a.next(); {
			if a.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			for list := a.nested(); list.next(); {
				if list.typ != unix.NFTA_LIST_ELEM {
					continue
				}
				var e KernelElement
				if err := parseKernelElement(list.nested(), &e); err != nil {
					return err
				}
				fn(&e)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("elements of %s: %w", name, err)
	}
	return nil
}

// errMalformed: an attribute that does not fit its message.
var errMalformed = errors.New("malformed netlink attribute")

// nla walks netlink attributes: next moves to the following one (false at
// the end or on a malformed one, which err then reports); typ and val are
// the current one's, typ without the nested and byte-order flags.
type nla struct {
	b   []byte
	typ uint16
	val []byte
	bad bool
}

func (a *nla) next() bool {
	if len(a.b) < 4 {
		a.bad = a.bad || len(a.b) != 0
		return false
	}
	l := int(binary.NativeEndian.Uint16(a.b))
	if l < 4 || l > len(a.b) {
		a.bad = true
		return false
	}
	a.typ = binary.NativeEndian.Uint16(a.b[2:]) & 0x3fff
	a.val = a.b[4:l]
	a.b = a.b[min((l+3)&^3, len(a.b)):]
	return true
}

func (a *nla) nested() *nla { return &nla{b: a.val} }

func (a *nla) u32() uint32 {
	if len(a.val) != 4 {
		a.bad = true
		return 0
	}
	return binary.BigEndian.Uint32(a.val)
}

func (a *nla) err() error {
	if a.bad {
		return errMalformed
	}
	return nil
}

// parseKernelElement reads one NFTA_LIST_ELEM.
func parseKernelElement(ne *nla, e *KernelElement) error {
	value := func(a *nla) ([]byte, error) {
		var v []byte
		d := a.nested()
		for d.next() {
			if d.typ == unix.NFTA_DATA_VALUE {
				v = d.val
			}
		}
		return v, d.err()
	}
	var err error
	for ne.next() && err == nil {
		switch ne.typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.key, err = value(ne)
		case nftaSetElemKeyEnd:
			e.keyEnd, err = value(ne)
		case unix.NFTA_SET_ELEM_FLAGS:
			e.flags = ne.u32()
			if e.flags&nftSetElemCatchall != 0 {
				e.other = true
			}
		case unix.NFTA_SET_ELEM_USERDATA:
			e.udata = ne.val
		case unix.NFTA_SET_ELEM_DATA:
			d := ne.nested()
			for d.next() {
				switch d.typ {
				case unix.NFTA_DATA_VALUE:
					e.data = d.val
				case unix.NFTA_DATA_VERDICT:
					e.hasVerdict = true
					v := d.nested()
					for v.next() {
						switch v.typ {
						case unix.NFTA_VERDICT_CODE:
							e.verdict = int32(v.u32())
						case unix.NFTA_VERDICT_CHAIN:
							e.chain = string(bytes.TrimRight(v.val, "\x00"))
						}
					}
					err = v.err()
				}
			}
			if err == nil {
				err = d.err()
			}
		case unix.NFTA_SET_ELEM_TIMEOUT, unix.NFTA_SET_ELEM_EXPIRATION, unix.NFTA_SET_ELEM_EXPR,
			unix.NFTA_SET_ELEM_OBJREF, nftaSetElemExpressions:
			e.other = true
		}
	}
	if err == nil {
		err = ne.err()
	}
	if e.key == nil && !e.other {
		// Only a catch-all element has no key.
		e.other = true
	}
	return err
}

// dumpMessages runs one nf_tables dump request of the inet family with
// these attributes and hands each reply's attributes to fn. The caller
// holds w.mu and a connection.
//
// On any error the connection is closed (the next request dials again): a
// dump cut short may leave replies queued, never to be read as the next
// request's.
func (w *Conn) dumpMessages(ctx context.Context, msgType uint16, attrs []byte, fn func([]byte) error) (err error) {
	defer func() {
		if err != nil {
			_ = w.closeLocked()
		}
	}()
	deadline := time.Now().Add(w.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := w.conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	replies, err := w.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgenmsg(unix.NFPROTO_INET, 0), attrs...),
	})
	if err != nil {
		return fmt.Errorf("listing table %s over netlink: %w", w.table, err)
	}
	for _, r := range replies {
		if r.Header.Flags&netlink.DumpInterrupted != 0 {
			// The table changed during the dump: what was read may be
			// neither the old nor the new state.
			return fmt.Errorf("listing table %s over netlink: dump interrupted by a change", w.table)
		}
		if len(r.Data) < 4 {
			continue
		}
		if err := fn(r.Data[4:]); err != nil {
			return fmt.Errorf("listing table %s over netlink: %w", w.table, err)
		}
	}
	return nil
}

// An element's identity is what names it in a set: its key, key end and
// flags (an interval's end element has the start's neighbour as key). Keys
// of a set all have its key length, so the concatenation is unambiguous.
// Its payload is the rest: its data or verdict and its userdata (the
// comment, the open-interval flag). A re-sync compares both, the desired
// elements' (Element, from Layout.Encode) with the kernel's
// (KernelElement, from Conn.SetElements).

func appendIdentity(b, key, keyEnd []byte, flags uint32) []byte {
	b = append(b, key...)
	b = append(b, '|')
	b = append(b, keyEnd...)
	return append(b, byte(flags))
}

// appendPayload appends the payload but its userdata, which comes last.
func appendPayload(b []byte, hasVerdict bool, verdict int32, chain string, data []byte) []byte {
	if hasVerdict {
		b = binary.BigEndian.AppendUint32(b, uint32(verdict))
		b = append(b, chain...)
	}
	b = append(b, 0)
	b = append(b, data...)
	return append(b, 0)
}

// AppendIdentity appends the element's identity to b.
func (e *Element) AppendIdentity(b []byte) []byte {
	return appendIdentity(b, e.key(), e.keyEnd(), e.flags)
}

// AppendPayload appends the element's payload to b.
func (e *Element) AppendPayload(b []byte) []byte {
	return e.appendUdata(appendPayload(b, e.hasVerdict, e.verdict, e.chain, e.data()))
}

// AppendIdentity appends the element's identity to b; its first
// len(e.Key()) bytes are the key.
func (e *KernelElement) AppendIdentity(b []byte) []byte {
	return appendIdentity(b, e.key, e.keyEnd, e.flags)
}

// AppendPayload appends the element's payload to b.
func (e *KernelElement) AppendPayload(b []byte) []byte {
	return append(appendPayload(b, e.hasVerdict, e.verdict, e.chain, e.data), e.udata...)
}

// Key is the element's key, valid while the element is.
func (e *KernelElement) Key() []byte { return e.key }

// Foreign reports an element the desired ones never have: a catch-all
// element, one with a timeout, an expression or an object reference.
func (e *KernelElement) Foreign() bool { return e.other }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
