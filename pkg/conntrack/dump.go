package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// A revocation pass reads the whole conntrack table, whose size pods
// control: every UDP datagram to a new port is an entry. The ctnetlink
// library's Dump collects every message of the dump and then decodes every
// entry into a Flow, so its memory grows with the table.
// KernelTable reads the dump itself instead: one datagram at a time into
// one fixed buffer, each entry decoded in place into one reused Flow and
// handed to the caller, which keeps nothing but what it deletes. A pass's
// memory is the buffer's, whatever the table's size.

// dumpBufSize holds any datagram of a dump: the kernel fills at most 32 KiB
// (the most a netlink dump allocates, SKB_WITH_OVERHEAD(32768)).
const dumpBufSize = 64 << 10

// KernelTable is the conntrack table of one network namespace over
// ctnetlink: dumps are streamed (Stream), deletions go through the
// ctnetlink library on a socket of their own, so a pass deletes while it
// reads.
type KernelTable struct {
	ct   *ct.Conn
	dump *netlink.Conn
	buf  []byte
}

// Dial opens the ctnetlink sockets in the network namespace netns (an fd;
// 0: the caller's).
func Dial(netns int) (*KernelTable, error) {
	c, err := ct.Dial(&netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("opening ctnetlink: %w", err)
	}
	d, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("opening ctnetlink: %w", err)
	}
	return &KernelTable{ct: c, dump: d}, nil
}

// Close closes the sockets.
func (c *KernelTable) Close() error { return errors.Join(c.dump.Close(), c.ct.Close()) }

// Delete deletes an entry (ID and tuples, as Stream reports them).
func (c *KernelTable) Delete(f ct.Flow) error { return c.ct.Delete(f) }

// Stream dumps the entries of an address family (unix.AF_INET, AF_INET6;
// AF_UNSPEC: both) and calls fn with each, in the kernel's order. The Flow
// is reused: only its ID, Zone and tuples are set, and only during the
// call. An error of fn stops the dump and is returned. Not safe for
// concurrent use.
func (c *KernelTable) Stream(family uint8, fn func(f *ct.Flow) error) error {
	if c.buf == nil {
		c.buf = make([]byte, dumpBufSize)
	}
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8 | ipctnlMsgCtGet), Flags: netlink.Request | netlink.Dump},
		Data:   []byte{family, unix.NFNETLINK_V0, 0, 0},
	}
	sent, err := c.dump.Send(req)
	if err != nil {
		return fmt.Errorf("requesting the conntrack dump: %w", err)
	}
	raw, err := c.dump.SyscallConn()
	if err != nil {
		return err
	}
	var f ct.Flow
	var stop error // fn's or a decoding error: the rest is read and dropped
	for {
		n, err := recvDatagram(raw, c.buf)
		if err != nil {
			return fmt.Errorf("reading the conntrack dump: %w", err)
		}
		done, err := eachMessage(c.buf[:n], sent.Header.Sequence, func(payload []byte) error {
			if stop != nil {
				return nil
			}
			f = ct.Flow{}
			if err := decodeFlow(payload, &f); err != nil {
				stop = err
				return nil
			}
			stop = fn(&f)
			return nil
		})
		if err != nil {
			return err
		}
		if done {
			return stop
		}
	}
}

// ipctnlMsgCtGet is IPCTNL_MSG_CT_GET; entries come back as
// IPCTNL_MSG_CT_NEW.
const (
	ipctnlMsgCtNew = 0
	ipctnlMsgCtGet = 1
)

// recvDatagram reads one datagram into buf without allocating (the
// netlink library allocates a buffer per datagram). MSG_TRUNC makes the
// kernel return the datagram's length, so a datagram larger than buf is an
// error rather than entries lost.
func recvDatagram(raw syscall.RawConn, buf []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := raw.Read(func(fd uintptr) bool {
		r, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN || e == unix.EINTR {
			return false
		}
		n, errno = int(r), e
		return true
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, errno
	case n > len(buf):
		return 0, fmt.Errorf("a datagram of %d bytes, more than the %d-byte buffer", n, len(buf))
	}
	return n, nil
}

const nlmsgHdrLen = 16

// eachMessage walks the netlink messages of one datagram of the dump with
// sequence number seq, calling fn with the payload (netfilter header and
// attributes) of each conntrack entry. done is true at the dump's end. A
// message of another sequence (what remained of an earlier dump) is
// skipped.
func eachMessage(b []byte, seq uint32, fn func(payload []byte) error) (done bool, err error) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		mseq := binary.NativeEndian.Uint32(b[8:12])
		if l < nlmsgHdrLen || l > len(b) {
			return false, fmt.Errorf("malformed netlink message: length %d of %d bytes", l, len(b))
		}
		payload := b[nlmsgHdrLen:l]
		b = b[min(nlmsgAlign(l), len(b)):]
		if mseq != seq {
			continue
		}
		switch typ {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			// Both carry an errno (0: none); an error ends the dump.
			if len(payload) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(payload[0:4])); e < 0 {
					return true, fmt.Errorf("conntrack dump: %w", syscall.Errno(-e))
				}
			}
			if typ == unix.NLMSG_DONE {
				return true, nil
			}
		case unix.NFNL_SUBSYS_CTNETLINK<<8 | ipctnlMsgCtNew:
			if err := fn(payload); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}

func nlmsgAlign(n int) int { return (n + 3) &^ 3 }

// ctnetlink attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaID         = 12
	ctaZone       = 18

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaTupleZone  = 3

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum        = 1
	ctaProtoSrcPort    = 2
	ctaProtoDstPort    = 3
	ctaProtoICMPID     = 4
	ctaProtoICMPType   = 5
	ctaProtoICMPCode   = 6
	ctaProtoICMPv6ID   = 7
	ctaProtoICMPv6Type = 8
	ctaProtoICMPv6Code = 9

	nfgenmsgLen = 4
	nlaTypeMask = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

var errMalformed = errors.New("malformed conntrack entry")

// decodeFlow decodes what the revoker needs of an entry (its ID, zone and
// tuples) from a message's payload, without allocating.
func decodeFlow(payload []byte, f *ct.Flow) error {
	if len(payload) < nfgenmsgLen {
		return errMalformed
	}
	return eachAttr(payload[nfgenmsgLen:], func(typ uint16, v []byte) error {
		switch typ {
		case ctaTupleOrig:
			return decodeTuple(v, &f.TupleOrig)
		case ctaTupleReply:
			return decodeTuple(v, &f.TupleReply)
		case ctaID:
			if len(v) != 4 {
				return errMalformed
			}
			f.ID = binary.BigEndian.Uint32(v)
		case ctaZone:
			if len(v) != 2 {
				return errMalformed
			}
			f.Zone = binary.BigEndian.Uint16(v)
		}
		return nil
	})
}

func decodeTuple(b []byte, t *ct.Tuple) error {
	return eachAttr(b, func(typ uint16, v []byte) error {
		switch typ {
		case ctaTupleIP:
			return eachAttr(v, func(typ uint16, v []byte) error {
				a, ok := netip.AddrFromSlice(v)
				if !ok || (typ <= ctaIPv4Dst) != a.Is4() {
					return errMalformed
				}
				switch typ {
				case ctaIPv4Src, ctaIPv6Src:
					t.IP.SourceAddress = a
				case ctaIPv4Dst, ctaIPv6Dst:
					t.IP.DestinationAddress = a
				}
				return nil
			})
		case ctaTupleProto:
			return eachAttr(v, func(typ uint16, v []byte) error { return decodeProto(typ, v, &t.Proto) })
		case ctaTupleZone:
			if len(v) != 2 {
				return errMalformed
			}
			t.Zone = binary.BigEndian.Uint16(v)
		}
		return nil
	})
}

// decodeProto decodes one attribute of a tuple's protocol: its number and
// ports, or an ICMP or ICMPv6 echo's identifier, type and code. Deleting an
// ICMP entry needs the latter: the kernel finds the entry by the whole
// tuple.
func decodeProto(typ uint16, v []byte, p *ct.ProtoTuple) error {
	switch {
	case typ == ctaProtoNum && len(v) == 1:
		p.Protocol = v[0]
		p.ICMPv4, p.ICMPv6 = v[0] == unix.IPPROTO_ICMP, v[0] == unix.IPPROTO_ICMPV6
	case typ == ctaProtoSrcPort && len(v) == 2:
		p.SourcePort = binary.BigEndian.Uint16(v)
	case typ == ctaProtoDstPort && len(v) == 2:
		p.DestinationPort = binary.BigEndian.Uint16(v)
	case (typ == ctaProtoICMPID || typ == ctaProtoICMPv6ID) && len(v) == 2:
		p.ICMPID = binary.BigEndian.Uint16(v)
	case (typ == ctaProtoICMPType || typ == ctaProtoICMPv6Type) && len(v) == 1:
		p.ICMPType = v[0]
	case (typ == ctaProtoICMPCode || typ == ctaProtoICMPv6Code) && len(v) == 1:
		p.ICMPCode = v[0]
	case typ <= ctaProtoICMPv6Code:
		return errMalformed
	}
	return nil
}

// eachAttr walks netlink attributes, calling fn with each one's type and
// value.
func eachAttr(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return errMalformed
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[4:l]); err != nil {
			return err
		}
		b = b[min(nlmsgAlign(l), len(b)):]
	}
	return nil
}
