package nftnl

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The acknowledgements of a batch are read from the socket's raw fd into
// one buffer the writer keeps: mdlayher's Conn.Receive costs about two
// dozen allocations per reply, and every element message has one. The
// socket asks for acknowledgements without a copy of the request
// (NETLINK_CAP_ACK), so each is 36 bytes (one datagram per reply).

// ackBufferBytes holds one reply; a longer one is an error.
const ackBufferBytes = 8 << 10

// readAcks waits until each of the msgs element messages whose sequence
// numbers follow first (BATCH_BEGIN's) is acknowledged. Any error reply
// refuses the batch: the kernel aborted all of it.
func (w *Conn) readAcks(rc syscall.RawConn, first uint32, msgs int) error {
	if w.ackBuf == nil {
		w.ackBuf = make([]byte, ackBufferBytes)
	}
	buf := w.ackBuf
	acked := make([]bool, msgs)
	for pending := msgs; pending > 0; {
		var n int
		var rerr error
		// rc.Read waits for the socket to be readable until the deadline.
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = recvTrunc(int(fd), buf)
			return rerr != unix.EAGAIN
		}); err != nil {
			return fmt.Errorf("element batch refused: %w", err)
		}
		if rerr != nil {
			return fmt.Errorf("element batch refused: %w", rerr)
		}
		if n > len(buf) {
			return fmt.Errorf("element batch refused: a reply of %d bytes, longer than %d", n, len(buf))
		}
		for off := 0; off < n; {
			if n-off < nlmsgHeaderLen {
				return fmt.Errorf("element batch refused: a reply of %d bytes, shorter than a netlink header", n-off)
			}
			l := int(binary.NativeEndian.Uint32(buf[off:]))
			typ := binary.NativeEndian.Uint16(buf[off+4:])
			flags := binary.NativeEndian.Uint16(buf[off+6:])
			seq := binary.NativeEndian.Uint32(buf[off+8:])
			if l < nlmsgHeaderLen || l > n-off {
				return fmt.Errorf("element batch refused: a reply with a bad length %d", l)
			}
			// NLMSG_ERROR carries an error number (0: an acknowledgement);
			// so may NLMSG_DONE of a multipart reply.
			if typ == unix.NLMSG_ERROR || (typ == unix.NLMSG_DONE && flags&unix.NLM_F_MULTI != 0 && l > nlmsgHeaderLen) {
				if l < nlmsgHeaderLen+4 {
					return fmt.Errorf("element batch refused: a short error reply")
				}
				if code := int32(binary.NativeEndian.Uint32(buf[off+nlmsgHeaderLen:])); code != 0 {
					return fmt.Errorf("element batch refused: %w", unix.Errno(-code))
				}
			}
			if typ == unix.NLMSG_ERROR {
				if i := seq - first - 1; i < uint32(msgs) && !acked[i] {
					acked[i] = true
					pending--
				}
			}
			off += align4(l)
		}
	}
	return nil
}

// recvTrunc reads one datagram; with MSG_TRUNC the kernel returns its
// whole length even when b is shorter (unix.Recvfrom allocates the
// sender's address).
func recvTrunc(fd int, b []byte) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MSG_TRUNC, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
