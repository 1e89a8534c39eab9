package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The nfnetlink_queue protocol (include/uapi/linux/netfilter/nfnetlink_queue.h),
// spoken directly: the reader builds and parses its messages in fixed
// buffers, so that a packet costs no allocation. Netlink headers are in host
// byte order; nfnetlink attributes carry big-endian values.
const (
	nfnlSubsysQueue = 3 // NFNL_SUBSYS_QUEUE

	nfqnlMsgPacket       = 0 // NFQNL_MSG_PACKET: kernel -> us
	nfqnlMsgVerdict      = 1 // NFQNL_MSG_VERDICT
	nfqnlMsgConfig       = 2 // NFQNL_MSG_CONFIG
	nfqnlMsgVerdictBatch = 3 // NFQNL_MSG_VERDICT_BATCH: every queued id <= the given one

	nfqaPacketHdr  = 1  // NFQA_PACKET_HDR: be32 id, be16 hw_protocol, u8 hook
	nfqaVerdictHdr = 2  // NFQA_VERDICT_HDR: be32 verdict, be32 id
	nfqaMark       = 3  // NFQA_MARK: be32
	nfqaPayload    = 10 // NFQA_PAYLOAD

	nfqaCfgCmd         = 1 // NFQA_CFG_CMD: u8 command, u8 pad, be16 pf
	nfqaCfgParams      = 2 // NFQA_CFG_PARAMS: be32 copy_range, u8 copy_mode (5 bytes)
	nfqaCfgQueueMaxlen = 3 // NFQA_CFG_QUEUE_MAXLEN: be32
	nfqaCfgMask        = 4 // NFQA_CFG_MASK: be32
	nfqaCfgFlags       = 5 // NFQA_CFG_FLAGS: be32

	nfqnlCfgCmdBind = 1 // NFQNL_CFG_CMD_BIND
	nfqnlCopyPacket = 2 // NFQNL_COPY_PACKET

	nfqaCfgFFailOpen = 0x01 // NFQA_CFG_F_FAIL_OPEN
	nfqaCfgFGSO      = 0x04 // NFQA_CFG_F_GSO

	// Netfilter verdicts (include/uapi/linux/netfilter.h).
	nfDrop   = 0
	nfAccept = 1
	nfRepeat = 4

	nlmsgHdrLen  = 16
	nfgenHdrLen  = 4
	nlaHdrLen    = 4
	nlmsgError   = 2 // NLMSG_ERROR
	nlmsgDone    = 3 // NLMSG_DONE
	nlmFRequest  = 0x1
	nlmFAck      = 0x4
	nlaTypeMask  = 0x3fff
	verdictMsgSz = nlmsgHdrLen + nfgenHdrLen + nlaHdrLen + 8 + nlaHdrLen + 4 // header, verdict hdr, mark
)

// queueMsg is one NFQNL_MSG_PACKET, parsed in place: Payload aliases the
// read buffer.
type queueMsg struct {
	ID      uint32
	HasID   bool
	Mark    uint32
	Payload []byte
}

func align4(n int) int { return (n + 3) &^ 3 }

// nextNetlinkMsg splits the first netlink message off b. It returns the
// message type, its body (after the 16-byte header) and the rest of b.
func nextNetlinkMsg(b []byte) (typ uint16, seq uint32, body, rest []byte, err error) {
	if len(b) < nlmsgHdrLen {
		return 0, 0, nil, nil, fmt.Errorf("netlink message of %d bytes: %w", len(b), ErrTruncated)
	}
	n := int(binary.NativeEndian.Uint32(b[0:4]))
	if n < nlmsgHdrLen || n > len(b) {
		return 0, 0, nil, nil, fmt.Errorf("netlink message length %d of %d bytes: %w", n, len(b), ErrTruncated)
	}
	typ = binary.NativeEndian.Uint16(b[4:6])
	seq = binary.NativeEndian.Uint32(b[8:12])
	body = b[nlmsgHdrLen:n]
	if a := align4(n); a < len(b) {
		rest = b[a:]
	}
	return typ, seq, body, rest, nil
}

var errNoPacketHdr = errors.New("queue message without NFQA_PACKET_HDR")

// parseQueueMsg parses the body of an NFQNL_MSG_PACKET (after the netlink
// header): the nfgenmsg, then the attributes. It does not allocate.
func parseQueueMsg(body []byte, m *queueMsg) error {
	*m = queueMsg{}
	if len(body) < nfgenHdrLen {
		return ErrTruncated
	}
	b := body[nfgenHdrLen:]
	for len(b) >= nlaHdrLen {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask
		if l < nlaHdrLen || l > len(b) {
			return ErrTruncated
		}
		v := b[nlaHdrLen:l]
		switch t {
		case nfqaPacketHdr:
			if len(v) >= 4 {
				m.ID, m.HasID = binary.BigEndian.Uint32(v[0:4]), true
			}
		case nfqaMark:
			if len(v) >= 4 {
				m.Mark = binary.BigEndian.Uint32(v[0:4])
			}
		case nfqaPayload:
			m.Payload = v
		}
		if a := align4(l); a < len(b) {
			b = b[a:]
		} else {
			b = nil
		}
	}
	if !m.HasID {
		return errNoPacketHdr
	}
	return nil
}

// putNetlinkHdr writes a netlink header and an nfgenmsg for queue num at the
// start of b and returns the offset after them.
func putNetlinkHdr(b []byte, msg uint8, flags uint16, seq uint32, queue uint16) int {
	binary.NativeEndian.PutUint32(b[0:4], 0) // length, set by finishMsg
	binary.NativeEndian.PutUint16(b[4:6], nfnlSubsysQueue<<8|uint16(msg))
	binary.NativeEndian.PutUint16(b[6:8], nlmFRequest|flags)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	binary.NativeEndian.PutUint32(b[12:16], 0) // port id: the kernel fills in ours
	b[16] = 0                                  // AF_UNSPEC: since Linux 3.8 one queue serves every family
	b[17] = 0                                  // NFNETLINK_V0
	binary.BigEndian.PutUint16(b[18:20], queue)
	return nlmsgHdrLen + nfgenHdrLen
}

// putAttr appends attribute t with value v at b[off:] and returns the new
// offset (4-byte aligned).
func putAttr(b []byte, off int, t uint16, v []byte) int {
	l := nlaHdrLen + len(v)
	binary.NativeEndian.PutUint16(b[off:], uint16(l))
	binary.NativeEndian.PutUint16(b[off+2:], t)
	copy(b[off+nlaHdrLen:], v)
	end := align4(off + l)
	clear(b[off+l : end])
	return end
}

func putAttrU32(b []byte, off int, t uint16, v uint32) int {
	var x [4]byte
	binary.BigEndian.PutUint32(x[:], v)
	return putAttr(b, off, t, x[:])
}

// finishMsg sets the length of the message that starts at b[0] and ends at end.
func finishMsg(b []byte, end int) []byte {
	binary.NativeEndian.PutUint32(b[0:4], uint32(end))
	return b[:end]
}

// appendVerdict writes one verdict message (NFQNL_MSG_VERDICT, or with
// batch NFQNL_MSG_VERDICT_BATCH: every queued packet with an id up to id)
// into b, with the packet mark when setMark, and returns its length. b must
// hold verdictMsgSz bytes.
func appendVerdict(b []byte, queue uint16, batch bool, id, verdict uint32, setMark bool, mark uint32) int {
	typ := uint8(nfqnlMsgVerdict)
	if batch {
		typ = nfqnlMsgVerdictBatch
	}
	off := putNetlinkHdr(b, typ, 0, 0, queue)
	var vh [8]byte
	binary.BigEndian.PutUint32(vh[0:4], verdict)
	binary.BigEndian.PutUint32(vh[4:8], id)
	off = putAttr(b, off, nfqaVerdictHdr, vh[:])
	if setMark {
		off = putAttrU32(b, off, nfqaMark, mark)
	}
	finishMsg(b, off)
	return off
}

// configMsg returns the one configuration request of a queue: bind, copy
// mode, queue length and flags, acknowledged together. The kernel applies
// the attributes of one config message in that order, under one lock, so
// no packet reaches the new instance in its default copy mode ("none": no
// payload, which the reader could only drop as unparsable); with a bind
// request followed by a separate parameters request, packets queued between
// the two were dropped (seen on an agent restart under load).
func configMsg(queue uint16, copyRange, maxLen, flags uint32) []byte {
	b := make([]byte, 128)
	off := putNetlinkHdr(b, nfqnlMsgConfig, nlmFAck, 1, queue)
	off = putAttr(b, off, nfqaCfgCmd, []byte{nfqnlCfgCmdBind, 0, 0, 0})
	var p [5]byte
	binary.BigEndian.PutUint32(p[0:4], copyRange)
	p[4] = nfqnlCopyPacket
	off = putAttr(b, off, nfqaCfgParams, p[:])
	off = putAttrU32(b, off, nfqaCfgQueueMaxlen, maxLen)
	off = putAttrU32(b, off, nfqaCfgFlags, flags)
	off = putAttrU32(b, off, nfqaCfgMask, nfqaCfgFFailOpen|nfqaCfgFGSO)
	return finishMsg(b, off)
}

// netlinkErrno returns the error code of an NLMSG_ERROR body (0 is an
// acknowledgement) and the sequence number of the request it answers.
func netlinkErrno(body []byte) (errno int32, reqSeq uint32, ok bool) {
	if len(body) < 4+nlmsgHdrLen {
		return 0, 0, false
	}
	errno = -int32(binary.NativeEndian.Uint32(body[0:4]))
	reqSeq = binary.NativeEndian.Uint32(body[4+8 : 4+12])
	return errno, reqSeq, true
}
