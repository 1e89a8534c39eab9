package nftnl

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Chains, rules and set declarations over netlink: the rest of what an
// incremental sync writes (element messages are batch.go's), so that a
// policy edit is one netlink batch, as pod churn is, instead of an nft
// process, which parses and builds its cache on every transaction whatever
// the change's size.
//
// The messages are those nft 1.0.6 sends for the printing of the
// compiler's typed rules and declarations: the same attributes, the same
// expressions, the same userdata, so that `nft list` prints what was
// written exactly as the ruleset reads and a later read-back finds no
// difference. TestNetlinkObjectsMatchNFT writes every golden ruleset both
// ways and compares the kernel's listings, expressions included;
// TestEveryRenderedRuleEncodes checks that every rule the renderer emits
// is encoded unless it has an expression of a kind only nft writes. Those
// (base chains, compile.ExprNft, meters, sampling, a timeout set) are
// ErrUnsupported: the whole sync then goes through nft.

// Attributes and values missing from x/sys/unix (more in readback.go).
const (
	nftaChainUserdata = 12 // NFTA_CHAIN_USERDATA
	nftaSetFieldLen   = 1  // NFTA_SET_FIELD_LEN
	// nftReg32 is NFT_REG32_00: the 4-byte registers a concatenation's
	// later fields are loaded into.
	nftReg32           = 8
	udataRuleComment   = 0 // NFTNL_UDATA_RULE_COMMENT
	udataChainComment  = 0 // NFTNL_UDATA_CHAIN_COMMENT
	byteorderBigEndian = 2 // nft's BYTEORDER_BIG_ENDIAN
)

// beginObject ends any open element message and starts an object message
// (NFT_MSG_NEWCHAIN, ...) of the batch's table family, counted for its
// acknowledgement; endObject patches its length.
func (b *Batch) beginObject(op uint16, flags uint16) {
	b.endMessage()
	b.msgStart = len(b.buf)
	b.buf = appendNlmsghdr(b.buf, 0, unix.NFNL_SUBSYS_NFTABLES<<8|op, unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	b.buf = append(b.buf, unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0)
	b.msgs++
}

func (b *Batch) endObject() {
	binary.NativeEndian.PutUint32(b.buf[b.msgStart:], uint32(len(b.buf)-b.msgStart))
}

func (b *Batch) appendU32(typ uint16, v uint32) {
	b.attrHeader(typ, 4)
	b.buf = binary.BigEndian.AppendUint32(b.buf, v)
}

func (b *Batch) appendU64(typ uint16, v uint64) {
	b.attrHeader(typ, 8)
	b.buf = binary.BigEndian.AppendUint64(b.buf, v)
}

// appendComment writes userdata holding only a comment TLV.
func (b *Batch) appendComment(attr uint16, typ byte, comment *string) {
	if comment == nil {
		return
	}
	u := appendUdata(nil, typ, append([]byte(*comment), 0))
	b.appendBytes(attr, u)
}

// checkComment refuses a comment userdata cannot hold (nft refuses more
// than 128 bytes; a TLV's length is one byte).
func checkComment(c *string) error {
	if c != nil && len(*c) > 128 {
		return fmt.Errorf("%w: comment of %d bytes", ErrUnsupported, len(*c))
	}
	return nil
}

// AddChain writes NFT_MSG_NEWCHAIN for a regular chain (base chains are
// nft's: their hooks are written by full syncs).
func (b *Batch) AddChain(c *knftables.Chain) error {
	if c.Type != nil || c.Hook != nil || c.Priority != nil || c.Device != nil || c.Policy != nil || c.Handle != nil {
		return fmt.Errorf("%w: base chain %s", ErrUnsupported, c.Name)
	}
	if err := checkComment(c.Comment); err != nil {
		return err
	}
	b.beginObject(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE)
	b.appendString(unix.NFTA_CHAIN_TABLE, b.table)
	b.appendString(unix.NFTA_CHAIN_NAME, c.Name)
	b.appendComment(nftaChainUserdata, udataChainComment, c.Comment)
	b.endObject()
	return nil
}

// DelChain writes NFT_MSG_DELCHAIN (the chain must be empty and unused by
// the end of the batch).
func (b *Batch) DelChain(name string) {
	b.beginObject(unix.NFT_MSG_DELCHAIN, 0)
	b.appendString(unix.NFTA_CHAIN_TABLE, b.table)
	b.appendString(unix.NFTA_CHAIN_NAME, name)
	b.endObject()
}

// FlushChain deletes every rule of the chain (NFT_MSG_DELRULE without a
// handle).
func (b *Batch) FlushChain(name string) {
	b.beginObject(unix.NFT_MSG_DELRULE, 0)
	b.appendString(unix.NFTA_RULE_TABLE, b.table)
	b.appendString(unix.NFTA_RULE_CHAIN, name)
	b.endObject()
}

// DelSet writes NFT_MSG_DELSET (for a map too).
func (b *Batch) DelSet(name string) {
	b.beginObject(unix.NFT_MSG_DELSET, 0)
	b.appendString(unix.NFTA_SET_TABLE, b.table)
	b.appendString(unix.NFTA_SET_NAME, name)
	b.endObject()
}

// AddSet writes NFT_MSG_NEWSET for a set or verdict map of the types the
// compiler declares (addresses, protocols, ports and their
// concatenations, with or without intervals, commented); its elements
// follow as element messages (AddElement).
func (b *Batch) AddSet(s *compile.Set) error {
	l, err := LayoutOf(s)
	if err != nil {
		return err
	}
	var name string
	var comment *string
	if s.Map != nil {
		m := s.Map
		if m.Timeout != nil || m.GCInterval != nil || m.Size != nil || m.Policy != nil || m.Handle != nil || len(m.Flags) > 0 || !l.verdict {
			return fmt.Errorf("%w: map %s's declaration", ErrUnsupported, m.Name)
		}
		name, comment = m.Name, m.Comment
	} else {
		st := s.Set
		if st.Timeout != nil || st.GCInterval != nil || st.Size != nil || st.Policy != nil || st.AutoMerge != nil || st.Handle != nil {
			return fmt.Errorf("%w: set %s's declaration", ErrUnsupported, st.Name)
		}
		name, comment = st.Name, st.Comment
	}
	if err := checkComment(comment); err != nil {
		return err
	}
	concat := len(l.key) > 1
	if !concat && l.key[0] != kindIPv4 && l.key[0] != kindIPv6 {
		// A lone protocol or port: nft writes another byte order.
		return fmt.Errorf("%w: set %s keyed by one protocol or port", ErrUnsupported, name)
	}
	var flags uint32
	keyType, keyLen := typeOfFields(l.key)
	switch {
	case l.verdict:
		flags = unix.NFT_SET_MAP
	case l.interval && concat:
		flags = unix.NFT_SET_INTERVAL | nftSetConcat
	case l.interval:
		flags = unix.NFT_SET_INTERVAL
	}
	var u []byte
	if concat {
		u = appendUdataU32(u, udataSetKeyByteorder, 0)
		u = appendUdata(u, udataSetKeyTypeof, concatTypeofUdata)
	} else {
		u = appendUdataU32(u, udataSetKeyByteorder, byteorderBigEndian)
	}
	if l.verdict {
		u = appendUdataU32(u, udataSetDataByteorder, 0)
		u = appendUdataU32(u, udataSetDataInterval, 0)
	}
	if comment != nil {
		u = appendUdata(u, udataSetComment, append([]byte(*comment), 0))
	}

	b.beginObject(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE)
	b.appendString(unix.NFTA_SET_TABLE, b.table)
	b.appendString(unix.NFTA_SET_NAME, name)
	b.appendU32(unix.NFTA_SET_FLAGS, flags)
	b.appendU32(unix.NFTA_SET_KEY_TYPE, keyType)
	b.appendU32(unix.NFTA_SET_KEY_LEN, keyLen)
	if l.verdict {
		b.appendU32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		b.appendU32(unix.NFTA_SET_DATA_LEN, 0)
	}
	b.setIDs++
	b.appendU32(unix.NFTA_SET_ID, b.setIDs)
	if l.interval && concat {
		desc := b.nest(unix.NFTA_SET_DESC)
		fields := b.nest(nftaSetDescConcat)
		for _, k := range l.key {
			f := b.nest(unix.NFTA_LIST_ELEM)
			b.appendU32(nftaSetFieldLen, uint32(k.size()))
			b.endNest(f)
		}
		b.endNest(fields)
		b.endNest(desc)
	}
	b.appendBytes(unix.NFTA_SET_USERDATA, u)
	b.endObject()
	return nil
}

// appendUdataU32 appends a userdata TLV of a host-order 32-bit value.
func appendUdataU32(b []byte, typ byte, v uint32) []byte {
	return appendUdata(b, typ, binary.NativeEndian.AppendUint32(nil, v))
}

// AddRule writes NFT_MSG_NEWRULE appending the typed rule to the chain.
// sets resolves the sets the rule names (their declarations decide the
// expressions).
func (b *Batch) AddRule(chain string, r *compile.TableRule, sets func(string) *compile.Set) error {
	if err := checkComment(r.Comment); err != nil {
		return err
	}
	exprs, err := ruleExprs(r, sets)
	if err != nil {
		return fmt.Errorf("rule %q of %s: %w", r.Text(), chain, err)
	}
	b.beginObject(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND)
	b.appendString(unix.NFTA_RULE_TABLE, b.table)
	b.appendString(unix.NFTA_RULE_CHAIN, chain)
	list := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for i := range exprs {
		b.appendExpr(&exprs[i])
	}
	b.endNest(list)
	b.appendComment(unix.NFTA_RULE_USERDATA, udataRuleComment, r.Comment)
	b.endObject()
	return nil
}

// nlExpr is one nftables expression of a rule.
type nlExpr struct {
	name string // meta, cmp, payload, byteorder, lookup, counter, immediate, limit, log
	// reg is the destination (meta, payload, byteorder) or source (cmp,
	// lookup) register.
	reg uint32
	// meta: key; payload: base, offset, len.
	key, base, offset, length uint32
	cmpData                   byte // cmp: a one-byte value (nfproto)
	set                       string
	inv, vmap                 bool
	verdict                   int32
	chain                     string
	rate, burst               uint32 // limit: packets per second
	over                      bool   // limit: matches beyond the rate
	prefix                    *string
	group                     int32 // log: -1 none
}

func (b *Batch) appendExpr(e *nlExpr) {
	el := b.nest(unix.NFTA_LIST_ELEM)
	b.appendString(unix.NFTA_EXPR_NAME, e.name)
	d := b.nest(unix.NFTA_EXPR_DATA)
	switch e.name {
	case "meta":
		b.appendU32(unix.NFTA_META_KEY, e.key)
		b.appendU32(unix.NFTA_META_DREG, e.reg)
	case "cmp":
		b.appendU32(unix.NFTA_CMP_SREG, e.reg)
		b.appendU32(unix.NFTA_CMP_OP, unix.NFT_CMP_EQ)
		v := b.nest(unix.NFTA_CMP_DATA)
		b.appendBytes(unix.NFTA_DATA_VALUE, []byte{e.cmpData})
		b.endNest(v)
	case "payload":
		b.appendU32(unix.NFTA_PAYLOAD_DREG, e.reg)
		b.appendU32(unix.NFTA_PAYLOAD_BASE, e.base)
		b.appendU32(unix.NFTA_PAYLOAD_OFFSET, e.offset)
		b.appendU32(unix.NFTA_PAYLOAD_LEN, e.length)
	case "byteorder":
		// nft converts a protocol number to network order for an
		// interval set's range comparisons: 1 byte, in a 2-byte unit.
		b.appendU32(unix.NFTA_BYTEORDER_SREG, e.reg)
		b.appendU32(unix.NFTA_BYTEORDER_DREG, e.reg)
		b.appendU32(unix.NFTA_BYTEORDER_OP, unix.NFT_BYTEORDER_HTON)
		b.appendU32(unix.NFTA_BYTEORDER_LEN, 1)
		b.appendU32(unix.NFTA_BYTEORDER_SIZE, 2)
	case "lookup":
		b.appendU32(unix.NFTA_LOOKUP_SREG, e.reg)
		b.appendString(unix.NFTA_LOOKUP_SET, e.set)
		if e.vmap {
			b.appendU32(unix.NFTA_LOOKUP_DREG, unix.NFT_REG_VERDICT)
		}
		if e.inv {
			b.appendU32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
		}
	case "counter":
	case "immediate":
		b.appendU32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		data := b.nest(unix.NFTA_IMMEDIATE_DATA)
		v := b.nest(unix.NFTA_DATA_VERDICT)
		b.appendU32(unix.NFTA_VERDICT_CODE, uint32(e.verdict))
		if e.chain != "" {
			b.appendString(unix.NFTA_VERDICT_CHAIN, e.chain)
		}
		b.endNest(v)
		b.endNest(data)
	case "limit":
		b.appendU64(unix.NFTA_LIMIT_RATE, uint64(e.rate))
		b.appendU64(unix.NFTA_LIMIT_UNIT, 1) // seconds
		b.appendU32(unix.NFTA_LIMIT_BURST, e.burst)
		b.appendU32(unix.NFTA_LIMIT_TYPE, unix.NFT_LIMIT_PKTS)
		var flags uint32
		if e.over {
			flags = unix.NFT_LIMIT_F_INV
		}
		b.appendU32(unix.NFTA_LIMIT_FLAGS, flags)
	case "log":
		if e.prefix != nil {
			b.appendString(unix.NFTA_LOG_PREFIX, *e.prefix)
		}
		if e.group >= 0 {
			b.attrHeader(unix.NFTA_LOG_GROUP, 2)
			b.buf = binary.BigEndian.AppendUint16(b.buf, uint16(e.group))
			b.pad()
		}
	}
	b.endNest(d)
	b.endNest(el)
}
