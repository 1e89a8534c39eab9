package queue

import (
	"encoding/binary"
	"errors"
	"testing"
)

// packetMsg builds an NFQNL_MSG_PACKET as the kernel sends it.
func packetMsg(id uint32, mark *uint32, payload []byte) []byte {
	b := make([]byte, 256+len(payload))
	off := putNetlinkHdr(b, nfqnlMsgPacket, 0, 0, 7)
	var hdr [7]byte
	binary.BigEndian.PutUint32(hdr[0:4], id)
	binary.BigEndian.PutUint16(hdr[4:6], 0x0800)
	hdr[6] = 3
	off = putAttr(b, off, nfqaPacketHdr, hdr[:])
	if mark != nil {
		off = putAttrU32(b, off, nfqaMark, *mark)
	}
	off = putAttrU32(b, off, 5, 42) // NFQA_IFINDEX_INDEV: skipped
	if payload != nil {
		off = putAttr(b, off, nfqaPayload, payload)
	}
	return finishMsg(b, off)
}

func TestParseQueueMsg(t *testing.T) {
	mark := uint32(0x4000)
	payload := []byte{0x45, 1, 2, 3, 4}
	two := append(packetMsg(9, &mark, payload), packetMsg(10, nil, nil)...)

	typ, _, body, rest, err := nextNetlinkMsg(two)
	if err != nil || typ != nfnlSubsysQueue<<8|nfqnlMsgPacket {
		t.Fatalf("first message: type %#x, err %v", typ, err)
	}
	var m queueMsg
	if err := parseQueueMsg(body, &m); err != nil {
		t.Fatal(err)
	}
	if m.ID != 9 || m.Mark != 0x4000 || string(m.Payload) != string(payload) {
		t.Errorf("first message = %+v", m)
	}
	_, _, body, rest, err = nextNetlinkMsg(rest)
	if err != nil || rest != nil {
		t.Fatalf("second message: rest %d bytes, err %v", len(rest), err)
	}
	if err := parseQueueMsg(body, &m); err != nil || m.ID != 10 || m.Mark != 0 || m.Payload != nil {
		t.Errorf("second message = %+v, %v", m, err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = parseQueueMsg(body, &m) }); n != 0 {
		t.Errorf("parseQueueMsg allocates %v times", n)
	}
}

func TestParseQueueMsgBad(t *testing.T) {
	good := packetMsg(1, nil, []byte{1, 2, 3})
	if _, _, _, _, err := nextNetlinkMsg(good[:10]); !errors.Is(err, ErrTruncated) {
		t.Errorf("short header: %v", err)
	}
	long := append([]byte(nil), good...)
	binary.NativeEndian.PutUint32(long[0:4], uint32(len(good)+8))
	if _, _, _, _, err := nextNetlinkMsg(long); !errors.Is(err, ErrTruncated) {
		t.Errorf("length beyond the datagram: %v", err)
	}
	var m queueMsg
	// An attribute whose length runs past the message.
	body := append([]byte(nil), good[nlmsgHdrLen:]...)
	binary.NativeEndian.PutUint16(body[nfgenHdrLen:], 200)
	if err := parseQueueMsg(body, &m); !errors.Is(err, ErrTruncated) {
		t.Errorf("attribute beyond the message: %v", err)
	}
	// No packet header: no id, no verdict possible.
	b := make([]byte, 64)
	off := putNetlinkHdr(b, nfqnlMsgPacket, 0, 0, 7)
	off = putAttrU32(b, off, nfqaMark, 1)
	if err := parseQueueMsg(finishMsg(b, off)[nlmsgHdrLen:], &m); !errors.Is(err, errNoPacketHdr) {
		t.Errorf("without packet header: %v", err)
	}
}

func TestAppendVerdict(t *testing.T) {
	b := make([]byte, verdictMsgSz)
	n := appendVerdict(b, 300, true, 77, nfRepeat, true, 0x4001)
	if n != verdictMsgSz {
		t.Fatalf("length %d, want %d", n, verdictMsgSz)
	}
	typ, _, body, rest, err := nextNetlinkMsg(b[:n])
	if err != nil || rest != nil || typ != nfnlSubsysQueue<<8|nfqnlMsgVerdictBatch {
		t.Fatalf("type %#x, rest %d, err %v", typ, len(rest), err)
	}
	if q := binary.BigEndian.Uint16(body[2:4]); q != 300 {
		t.Errorf("queue %d, want 300", q)
	}
	a := body[nfgenHdrLen:]
	if binary.NativeEndian.Uint16(a[2:4]) != nfqaVerdictHdr || binary.BigEndian.Uint32(a[4:8]) != nfRepeat || binary.BigEndian.Uint32(a[8:12]) != 77 {
		t.Errorf("verdict attribute % x", a[:12])
	}
	a = a[12:]
	if binary.NativeEndian.Uint16(a[2:4]) != nfqaMark || binary.BigEndian.Uint32(a[4:8]) != 0x4001 {
		t.Errorf("mark attribute % x", a)
	}
	n = appendVerdict(b, 300, false, 78, nfDrop, false, 0)
	if typ, _, _, _, _ := nextNetlinkMsg(b[:n]); typ != nfnlSubsysQueue<<8|nfqnlMsgVerdict || n != verdictMsgSz-8 {
		t.Errorf("drop verdict: type %#x, length %d", typ, n)
	}
}

// TestHandleDatagramAllocs: reading a queued packet, deciding it and
// collecting its verdict allocates nothing.
func TestHandleDatagramAllocs(t *testing.T) {
	r, err := NewRuntime(RuntimeConfig{QueueNum: 7, AllowMark: 0x100}, DeciderFunc(func(p Packet) (bool, string) {
		return p.DstPort == 80, "test"
	}))
	if err != nil {
		t.Fatal(err)
	}
	rd := newReader(r, &qsock{queue: 7})
	syn := []byte{
		0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, // IPv4, TCP
		0x9c, 0x40, 0, 80, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0, // ports 40000 -> 80, SYN
	}
	msg := packetMsg(1, nil, syn)
	if n := testing.AllocsPerRun(200, func() {
		rd.handleDatagram(msg)
		rd.vs = rd.vs[:0]
	}); n != 0 {
		t.Errorf("handling a queued packet allocates %v times", n)
	}
	rd.handleDatagram(msg)
	if len(rd.vs) != 1 || rd.vs[0] != (pendingVerdict{id: 1, verdict: nfRepeat, setMark: true, mark: 0x100}) {
		t.Errorf("verdicts %+v, want NF_REPEAT of packet 1 with mark 0x100", rd.vs)
	}
}

// TestUnparsableDroppedFailOpen: a packet the parser refuses (here IPv6
// with nine extension headers, which a pod with raw sockets can send) is
// dropped with FailOpen too: its bytes are the sender's to choose, and
// accepting them would admit whatever connection it opens.
func TestUnparsableDroppedFailOpen(t *testing.T) {
	r, err := NewRuntime(RuntimeConfig{QueueNum: 7, AllowMark: 0x100, FailOpen: true}, DeciderFunc(func(p Packet) (bool, string) {
		return true, "test"
	}))
	if err != nil {
		t.Fatal(err)
	}
	rd := newReader(r, &qsock{queue: 7})
	pkt := make([]byte, 40, 40+9*8+4)
	pkt[0], pkt[6] = 0x60, 0 // next header: hop-by-hop
	for i := 0; i < 9; i++ {
		pkt = append(pkt, 0, 0, 0, 0, 0, 0, 0, 0) // hop-by-hop, 8 bytes, next hop-by-hop
	}
	pkt = append(pkt, 0, 80, 0, 80)
	rd.handleDatagram(packetMsg(1, nil, pkt))
	if len(rd.vs) != 1 || rd.vs[0].verdict != nfDrop {
		t.Errorf("verdicts %+v, want NF_DROP of the unparsable packet", rd.vs)
	}
	if s := r.Stats(); s.UnparsableDropped != 1 {
		t.Errorf("stats %+v, want 1 unparsable packet dropped", s)
	}
}
