package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// SCTP without an SCTP stack: this kernel has no CONFIG_IP_SCTP, so no
// socket can connect or answer over SCTP. Conntrack and nftables still
// understand SCTP (CONFIG_NF_CT_PROTO_SCTP), and that is all a
// NetworkPolicy decision looks at: the first packet of an association, an
// INIT chunk. An SCTP probe therefore sends a well-formed INIT (vtag 0,
// CRC32c, one INIT chunk, as conntrack's sctp_new wants it) from a raw
// IPPROTO_SCTP socket in the client's namespace and reports it allowed when
// a raw IPPROTO_SCTP socket in the server's namespace receives it. With a
// raw socket bound to the protocol the server's kernel delivers the packet
// to it and sends no ICMP "protocol unreachable" back; nothing answers, so
// conntrack never sees a reply, exactly like a dropped INIT's retransmission
// would look. Each probe uses a random source port and initiate tag, so
// concurrent probes and conntrack entries of earlier probes never mix.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const sctpInitLen = 12 + 20 // common header + INIT chunk without parameters

// sctpInit builds an SCTP packet holding one INIT chunk.
func sctpInit(sport, dport uint16, tag uint32) []byte {
	b := make([]byte, sctpInitLen)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	// b[4:8] verification tag: 0 in a packet carrying INIT (RFC 9260 8.5.1).
	b[12] = 1                                 // chunk type INIT
	binary.BigEndian.PutUint16(b[14:], 20)    // chunk length
	binary.BigEndian.PutUint32(b[16:], tag)   // initiate tag (non-zero)
	binary.BigEndian.PutUint32(b[20:], 65535) // a_rwnd
	binary.BigEndian.PutUint16(b[24:], 1)     // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)     // max inbound streams
	binary.BigEndian.PutUint32(b[28:], tag^1) // initial TSN
	// CRC32c over the packet with a zero checksum field, stored
	// little-endian (RFC 9260 appendix A; Linux sctp_compute_cksum).
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// sctpKey identifies one probe's INIT at the receiver.
type sctpKey struct {
	sport, dport uint16
	tag          uint32
}

// parseSCTPInit reads the ports and initiate tag of an INIT packet (SCTP
// header first).
func parseSCTPInit(b []byte) (sctpKey, bool) {
	if len(b) < sctpInitLen || b[12] != 1 {
		return sctpKey{}, false
	}
	return sctpKey{binary.BigEndian.Uint16(b[0:]), binary.BigEndian.Uint16(b[2:]), binary.BigEndian.Uint32(b[16:])}, true
}

// sctpSocket is a raw IPPROTO_SCTP socket of one namespace and family: it
// sends this namespace's INITs and receives those sent to it.
type sctpSocket struct {
	f    *os.File
	fd   int
	is4  bool
	mu   sync.Mutex
	wait map[sctpKey]chan netip.Addr
	done chan struct{}
}

func openSCTPSocket(lab *netlab.Lab, ep netlab.Endpoint, is4 bool) (*sctpSocket, error) {
	domain := unix.AF_INET6
	if is4 {
		domain = unix.AF_INET
	}
	fd := -1
	err := lab.InNetns(ep, func() error {
		var err error
		fd, err = unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raw SCTP socket in %v: %w", ep, err)
	}
	// Bursts of hundreds of probes must not overflow the receive queue.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	s := &sctpSocket{f: os.NewFile(uintptr(fd), "sctp-raw"), fd: fd, is4: is4,
		wait: map[sctpKey]chan netip.Addr{}, done: make(chan struct{})}
	go s.read()
	return s, nil
}

func (s *sctpSocket) read() {
	defer close(s.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := s.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
		}
		p := buf[:n]
		var src netip.Addr
		if s.is4 {
			// IPv4 raw sockets read the IP header too.
			if n < 20 {
				continue
			}
			hl := int(p[0]&0x0f) * 4
			if hl < 20 || n < hl {
				continue
			}
			src = netip.AddrFrom4([4]byte(p[12:16]))
			p = p[hl:]
		}
		k, ok := parseSCTPInit(p)
		if !ok {
			continue
		}
		s.mu.Lock()
		ch := s.wait[k]
		delete(s.wait, k)
		s.mu.Unlock()
		if ch != nil {
			ch <- src
		}
	}
}

// expect registers a probe; the channel receives the source address (the
// zero Addr for IPv6) when its INIT arrives.
func (s *sctpSocket) expect(k sctpKey) chan netip.Addr {
	ch := make(chan netip.Addr, 1)
	s.mu.Lock()
	s.wait[k] = ch
	s.mu.Unlock()
	return ch
}

func (s *sctpSocket) forget(k sctpKey) {
	s.mu.Lock()
	delete(s.wait, k)
	s.mu.Unlock()
}

func (s *sctpSocket) send(dst netip.Addr, pkt []byte) error {
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: dst.As16()}
	}
	return unix.Sendto(s.fd, pkt, 0, sa)
}

func (s *sctpSocket) close() {
	_ = s.f.Close()
	<-s.done
}

// sctpProbe sends one INIT from src's socket to dst and waits for dst's
// socket to receive it. It is not retransmitted within the probe: a later
// copy could be let through by a policy change made after the probe
// started, which would spoil enforcement delay measurements (callers retry
// timed-out probes as new probes instead). It returns true when the INIT
// arrived (from the expected source, for IPv4).
func sctpProbe(from, to *sctpSocket, src, dst netip.Addr, port uint16, timeout time.Duration) (bool, string, error) {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	k := sctpKey{sport: 1024 + binary.BigEndian.Uint16(rnd[:2])%60000, dport: port, tag: binary.BigEndian.Uint32(rnd[2:]) | 1}
	ch := to.expect(k)
	defer to.forget(k)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	if err := from.send(dst, sctpInit(k.sport, k.dport, k.tag)); err != nil {
		return false, "", fmt.Errorf("sending an SCTP INIT to %v: %w", dst, err)
	}
	select {
	case got := <-ch:
		if src.Is4() && got != src {
			return false, "", fmt.Errorf("SCTP INIT arrived from %v, sent from %v", got, src)
		}
		return true, "received", nil
	case <-deadline.C:
		return false, "timeout", nil
	}
}
