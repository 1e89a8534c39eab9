package nftnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Why mdlayher/netlink and not google/nftables' SetAddElements: the
// messages are few and simple (NEWSETELEM and DELSETELEM between
// BATCH_BEGIN and BATCH_END), and writing them here keeps what google/nftables
// does not offer: the bytes nft writes, including the "open interval"
// element flag (a userdata TLV next to the comment; nft 1.0.6 lists a set
// the same without it, later versions read it); socket buffers sized for
// the batch (Conn.Flush uses the default ones, a few hundred kilobytes,
// and expects one reply per message within them); extended error messages;
// and a connection dropped after any failure, so that no late reply is
// read as the next batch's. mdlayher/netlink opens the socket and runs the
// dumps; a batch is encoded into one buffer (batch.go) and written, and
// its acknowledgements read (acks.go), on the socket's raw fd.

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (kernel 5.6), missing from
// x/sys/unix.
const nftaSetElemKeyEnd = 10

// Socket buffers asked for (SO_SNDBUFFORCE, SO_RCVBUFFORCE need
// CAP_NET_ADMIN, which the agent has; without it the kernel's maximum
// applies). A batch must fit in one send buffer: the kernel reads one batch
// from one message.
const netlinkBufferBytes = 8 << 20

// dumpBufferBytes is the receive buffer of one netlink message (dial).
const dumpBufferBytes = 64 << 10

// elementListBytes bounds one message's element list: a netlink attribute
// length is 16 bits.
const elementListBytes = 60 << 10

// Conn is a netlink connection to one inet table: it writes batches of
// changes (Batch), each of which the kernel commits as one transaction or
// not at all, and reads back the table's objects and set elements. Safe for
// concurrent use.
type Conn struct {
	netNS   int
	table   string
	timeout time.Duration

	mu   sync.Mutex
	conn *netlink.Conn
	// seq is the sequence number of the last message sent.
	seq uint32
	// ackBuf receives acknowledgements (readAcks).
	ackBuf []byte
	// maxBytes and maxMessages are what the connection's buffers hold: a
	// bigger batch goes to nft instead.
	maxBytes, maxMessages int
}

// NewConn returns a connection to the inet table of that name in the
// network namespace netNSFd refers to (0: the namespace of the calling
// thread when the connection is opened). The connection opens on first
// use, and again after any failure.
func NewConn(table string, netNSFd int) *Conn {
	return &Conn{netNS: netNSFd, table: table, timeout: 10 * time.Second}
}

// Close closes the connection.
func (w *Conn) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closeLocked()
}

func (w *Conn) closeLocked() error {
	if w.conn == nil {
		return nil
	}
	err := w.conn.Close()
	w.conn = nil
	return err
}

func (w *Conn) dial() error {
	// A fixed receive buffer of 64 KiB: the kernel sizes a dump's messages
	// after the reader's biggest buffer, up to 32 KiB, and restarts the walk
	// of a set from its first element for each message; with the default
	// (a buffer of exactly the message peeked) a dump's messages stay at
	// 4 KiB, and reading a big set walks it many times over.
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.netNS, MessageBufferSize: dumpBufferBytes})
	if err != nil {
		return fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	// Error replies do not carry a copy of the request (up to 64 KiB
	// each). Extended acknowledgements are left off: mdlayher/netlink
	// v1.11 cannot parse an error carrying both.
	_ = c.SetOption(netlink.CapAcknowledge, true)
	setBuffer(c, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF)
	setBuffer(c, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF)
	wb, err1 := c.WriteBuffer()
	rb, err2 := c.ReadBuffer()
	if err := errors.Join(err1, err2); err != nil {
		c.Close()
		return fmt.Errorf("reading netlink socket buffer sizes: %w", err)
	}
	// The kernel refuses a message longer than the send buffer less 32
	// bytes; every acknowledgement takes about 1 KiB of receive buffer
	// (its socket buffer's true size), all of them queued at commit.
	w.conn, w.maxBytes, w.maxMessages = c, wb-4096, rb/2048
	return nil
}

func setBuffer(c *netlink.Conn, force, plain int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, netlinkBufferBytes) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, plain, netlinkBufferBytes)
		}
	})
}

// ErrBatchTooBig sends a batch to nft: it would not fit the socket.
var ErrBatchTooBig = errors.New("element batch larger than the netlink socket buffers")

// Write sends the batch and waits for the kernel's verdict: nil when the
// kernel committed it, ErrBatchTooBig (nothing sent) when it does not fit
// the socket, another error when the kernel refused it (it changed
// nothing) or the connection failed.
func (w *Conn) Write(ctx context.Context, b *Batch) error {
	batch := b.finish()
	if batch == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		if err := w.dial(); err != nil {
			return err
		}
	}
	if len(batch) > w.maxBytes || b.msgs > w.maxMessages {
		return fmt.Errorf("%w: %d messages, %d bytes", ErrBatchTooBig, b.msgs, len(batch))
	}
	if err := w.roundTrip(ctx, batch, b.msgs); err != nil {
		// Replies may still be queued: never read them as the next
		// batch's.
		_ = w.closeLocked()
		return err
	}
	return nil
}

// roundTrip sends an encoded batch of msgs element messages in one write
// (the kernel reads a batch from one message) and waits for their
// acknowledgements.
func (w *Conn) roundTrip(ctx context.Context, batch []byte, msgs int) error {
	deadline := time.Now().Add(w.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// The write's deadline is cleared after it: the connection's later
	// requests (dumps, through mdlayher/netlink) set only read deadlines.
	if err := w.conn.SetDeadline(deadline); err != nil {
		return err
	}
	defer func() { _ = w.conn.SetWriteDeadline(time.Time{}) }()
	// Sequence numbers: BATCH_BEGIN has first, the element messages the
	// msgs that follow.
	first := w.seq + 1
	batchMessages(batch, func(off int) {
		w.seq++
		binary.NativeEndian.PutUint32(batch[off+8:], w.seq)
	})
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("sending element batch: %w", err)
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		n, werr = unix.Write(int(fd), batch)
		return werr != unix.EAGAIN
	})
	switch {
	case err != nil:
		return fmt.Errorf("sending element batch: %w", err)
	case werr != nil:
		return fmt.Errorf("sending element batch: %w", werr)
	case n != len(batch):
		return fmt.Errorf("sending element batch: %d of %d bytes written", n, len(batch))
	}
	// One acknowledgement per element message (not for BATCH_BEGIN and
	// BATCH_END); a failed batch answers with its errors, or with a single
	// error when the commit itself fails, and is wholly aborted.
	return w.readAcks(rc, first, msgs)
}

// NewBatch starts a batch of this connection's table for about elements
// elements.
func (w *Conn) NewBatch(elements int) *Batch {
	return newBatch(w.table, min(elements*elementSizeHint+256, netlinkBufferBytes))
}

// nfgenmsg is struct nfgenmsg: family, version, resource id (big endian).
func nfgenmsg(family uint8, resID uint16) []byte {
	return []byte{family, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}
}
