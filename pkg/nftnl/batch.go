package nftnl

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// An element batch is encoded straight into one growing buffer, the bytes
// the socket sends: BATCH_BEGIN, the element messages, BATCH_END, each a
// netlink header, a struct nfgenmsg and attributes. A nested attribute's
// header is written as a placeholder and its length patched once its
// contents are written, so no element costs an allocation of its own; the
// whole batch then goes to the kernel in one write (Conn.Write). An
// attribute encoder that builds a closure, a slice and a copy per nesting
// level of every element makes garbage in proportion to the set sizes on
// every full sync, which a starting agent pays as fresh heap pages.
//
// Byte order: netlink and attribute headers are the host's; the nftables
// values in them (flags, verdict codes, timeouts, struct nfgenmsg's
// resource id) are big endian. Every attribute starts at a multiple of 4
// bytes; its length does not count its padding, a nested one's counts its
// contents' padding.

const (
	nlmsgHeaderLen = 16
	nlaHeaderLen   = 4
	// nfgenmsgLen is struct nfgenmsg: family, version, resource id.
	nfgenmsgLen = 4
)

// Batch is one nfnetlink batch of element messages being encoded.
type Batch struct {
	table string
	buf   []byte
	// msgs is the number of element messages (the acknowledgements the
	// batch waits for).
	msgs int
	// The element message being written: its set, operation, and the
	// offsets of its header and of its element list attribute (-1: none
	// open).
	set                 string
	op                  uint16
	msgStart, listStart int
	done                bool
	// setIDs numbers the sets the batch adds (NFTA_SET_ID), as nft does.
	setIDs uint32
	// scratch holds the kernel elements of the element being added.
	scratch [2]Element
}

// newBatch starts a batch for the table; sizeHint is the expected
// size in bytes (the buffer grows past it if needed).
func newBatch(table string, sizeHint int) *Batch {
	b := &Batch{table: table, buf: make([]byte, 0, sizeHint), listStart: -1}
	b.batchMessage(unix.NFNL_MSG_BATCH_BEGIN)
	return b
}

// elementSizeHint is about what an element with a short comment takes:
// enough that a batch's buffer rarely grows.
const elementSizeHint = 64

// batchMessage writes BATCH_BEGIN or BATCH_END.
func (b *Batch) batchMessage(typ uint16) {
	b.buf = appendNlmsghdr(b.buf, nlmsgHeaderLen+nfgenmsgLen, typ, unix.NLM_F_REQUEST)
	b.buf = append(b.buf, unix.AF_UNSPEC, unix.NFNETLINK_V0)
	b.buf = binary.BigEndian.AppendUint16(b.buf, unix.NFNL_SUBSYS_NFTABLES)
}

func appendNlmsghdr(b []byte, length int, typ, flags uint16) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(length))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	// Sequence number (written when sent) and port id (0: the kernel
	// answers the sending socket either way).
	return append(b, 0, 0, 0, 0, 0, 0, 0, 0)
}

// add appends one element to the set's deletions (NFT_MSG_DELSETELEM) or
// additions (NFT_MSG_NEWSETELEM): to the open message when it is the same
// set and operation and the element list stays below elementListBytes,
// else to a new message.
func (b *Batch) add(set string, op uint16, e *Element) {
	n := e.encodedLen()
	if b.listStart < 0 || b.op != op || b.set != set || len(b.buf)-b.listStart-nlaHeaderLen+n > elementListBytes {
		b.endMessage()
		b.startMessage(set, op)
	}
	b.appendElement(e)
}

func (b *Batch) startMessage(set string, op uint16) {
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if op == unix.NFT_MSG_NEWSETELEM {
		flags |= unix.NLM_F_CREATE
	}
	b.msgStart = len(b.buf)
	b.buf = appendNlmsghdr(b.buf, 0, unix.NFNL_SUBSYS_NFTABLES<<8|op, flags)
	b.buf = append(b.buf, unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0)
	b.appendString(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.appendString(unix.NFTA_SET_ELEM_LIST_SET, set)
	b.listStart = b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	b.set, b.op = set, op
	b.msgs++
}

// endMessage closes the open element message, if any: the element list's
// and the message's lengths.
func (b *Batch) endMessage() {
	if b.listStart < 0 {
		return
	}
	b.endNest(b.listStart)
	binary.NativeEndian.PutUint32(b.buf[b.msgStart:], uint32(len(b.buf)-b.msgStart))
	b.listStart = -1
}

// finish closes the batch and returns its bytes; nil when it has no
// element message.
func (b *Batch) finish() []byte {
	if b.msgs == 0 {
		return nil
	}
	if !b.done {
		b.endMessage()
		b.batchMessage(unix.NFNL_MSG_BATCH_END)
		b.done = true
	}
	return b.buf
}

// encodedLen is the size of the element's NFTA_LIST_ELEM attribute
// (appendElement writes exactly this much).
func (e *Element) encodedLen() int {
	n := nlaHeaderLen + 2*nlaHeaderLen + align4(int(e.keyLen))
	if e.keyEndLen > 0 {
		n += 2*nlaHeaderLen + align4(int(e.keyEndLen))
	}
	if e.flags != 0 {
		n += nlaHeaderLen + 4
	}
	if e.timeoutMS != 0 {
		n += nlaHeaderLen + 8
	}
	switch {
	case e.hasVerdict:
		n += 3*nlaHeaderLen + 4
		if e.chain != "" {
			n += nlaHeaderLen + align4(len(e.chain)+1)
		}
	case e.dataLen > 0:
		n += 2*nlaHeaderLen + align4(int(e.dataLen))
	}
	if u := e.udataLen(); u > 0 {
		n += nlaHeaderLen + align4(u)
	}
	return n
}

// appendElement writes one NFTA_LIST_ELEM, in the order nft writes its
// attributes.
func (b *Batch) appendElement(e *Element) {
	el := b.nest(unix.NFTA_LIST_ELEM)
	k := b.nest(unix.NFTA_SET_ELEM_KEY)
	b.appendBytes(unix.NFTA_DATA_VALUE, e.key())
	b.endNest(k)
	if e.keyEndLen > 0 {
		k := b.nest(nftaSetElemKeyEnd)
		b.appendBytes(unix.NFTA_DATA_VALUE, e.keyEnd())
		b.endNest(k)
	}
	if e.flags != 0 {
		b.attrHeader(unix.NFTA_SET_ELEM_FLAGS, 4)
		b.buf = binary.BigEndian.AppendUint32(b.buf, e.flags)
	}
	if e.timeoutMS != 0 {
		b.attrHeader(unix.NFTA_SET_ELEM_TIMEOUT, 8)
		b.buf = binary.BigEndian.AppendUint64(b.buf, e.timeoutMS)
	}
	switch {
	case e.hasVerdict:
		d := b.nest(unix.NFTA_SET_ELEM_DATA)
		v := b.nest(unix.NFTA_DATA_VERDICT)
		b.attrHeader(unix.NFTA_VERDICT_CODE, 4)
		b.buf = binary.BigEndian.AppendUint32(b.buf, uint32(e.verdict))
		if e.chain != "" {
			b.appendString(unix.NFTA_VERDICT_CHAIN, e.chain)
		}
		b.endNest(v)
		b.endNest(d)
	case e.dataLen > 0:
		d := b.nest(unix.NFTA_SET_ELEM_DATA)
		b.appendBytes(unix.NFTA_DATA_VALUE, e.data())
		b.endNest(d)
	}
	if u := e.udataLen(); u > 0 {
		b.attrHeader(unix.NFTA_SET_ELEM_USERDATA, u)
		b.buf = e.appendUdata(b.buf)
		b.pad()
	}
	b.endNest(el)
}

func (b *Batch) attrHeader(typ uint16, payload int) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(nlaHeaderLen+payload))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
}

func (b *Batch) pad() {
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *Batch) appendBytes(typ uint16, v []byte) {
	b.attrHeader(typ, len(v))
	b.buf = append(b.buf, v...)
	b.pad()
}

// appendString writes a NUL-terminated string attribute.
func (b *Batch) appendString(typ uint16, s string) {
	b.attrHeader(typ, len(s)+1)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	b.pad()
}

// nest opens a nested attribute and returns its offset for endNest.
func (b *Batch) nest(typ uint16) int {
	at := len(b.buf)
	b.attrHeader(unix.NLA_F_NESTED|typ, 0)
	return at
}

func (b *Batch) endNest(at int) {
	binary.NativeEndian.PutUint16(b.buf[at:], uint16(len(b.buf)-at))
}

// AddElement encodes an element of the set (l is its layout) and adds it
// (NFT_MSG_NEWSETELEM).
func (b *Batch) AddElement(set string, l *Layout, e *compile.Element) error {
	return b.element(set, unix.NFT_MSG_NEWSETELEM, l, e)
}

// DeleteElement encodes an element of the set and adds its deletion
// (NFT_MSG_DELSETELEM): the key alone.
func (b *Batch) DeleteElement(set string, l *Layout, e *compile.Element) error {
	return b.element(set, unix.NFT_MSG_DELSETELEM, l, e)
}

func (b *Batch) element(set string, op uint16, l *Layout, e *compile.Element) error {
	n, err := l.encode(e, op == unix.NFT_MSG_DELSETELEM, &b.scratch)
	if err != nil {
		return err
	}
	for i := range n {
		b.add(set, op, &b.scratch[i])
	}
	return nil
}

// batchMessages calls fn with the offset of every message of an encoded
// batch, in order.
func batchMessages(buf []byte, fn func(off int)) {
	for off := 0; off+nlmsgHeaderLen <= len(buf); {
		fn(off)
		off += align4(int(binary.NativeEndian.Uint32(buf[off:])))
	}
}
