package lab

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// FlowLog records what the server received on one long-lived flow: every
// 8-byte record is a sequence number, sent every FlowInterval.
type FlowLog struct {
	mu   sync.Mutex
	last time.Time
	seq  uint64
	n    int
	lost int // UDP: sequence numbers skipped
}

func (f *FlowLog) got(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n > 0 && seq > f.seq+1 {
		f.lost += int(seq - f.seq - 1)
	}
	f.seq, f.last = seq, time.Now()
	f.n++
}

// Snapshot returns the last record's arrival, how many arrived and how
// many UDP records were skipped.
func (f *FlowLog) Snapshot() (last time.Time, n, lost int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.n, f.lost
}

// FlowInterval is how often StartFlows sends a record on each flow.
const FlowInterval = 10 * time.Millisecond

// FlowServer serves TCP 8080 and UDP 9090 in a pod: it logs each record
// per client address and protocol, and echoes UDP datagrams (so that
// conntrack sees the UDP flow established, as it does the TCP one).
type FlowServer struct {
	mu   sync.Mutex
	logs map[string]*FlowLog
	ln   net.Listener
	pc   net.PacketConn
}

// Log is the record of the flow from ip over proto ("tcp", "udp").
func (s *FlowServer) Log(proto string, ip netip.Addr) *FlowLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := proto + " " + ip.String()
	if s.logs[k] == nil {
		s.logs[k] = &FlowLog{}
	}
	return s.logs[k]
}

// StartFlowServer starts a FlowServer on ip (of either family) in the
// pod's namespace.
func StartFlowServer(lab *netlab.Lab, pod netlab.Endpoint, ip netip.Addr) (*FlowServer, error) {
	s := &FlowServer{logs: map[string]*FlowLog{}}
	err := lab.InNetns(pod, func() error {
		var err error
		if s.ln, err = net.Listen("tcp", netip.AddrPortFrom(ip, 8080).String()); err != nil {
			return err
		}
		s.pc, err = net.ListenPacket("udp", netip.AddrPortFrom(ip, 9090).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			ip := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			go func() {
				defer c.Close()
				buf := make([]byte, 8)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					s.Log("tcp", ip).got(binary.BigEndian.Uint64(buf))
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := s.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n == 8 {
				s.Log("udp", from.(*net.UDPAddr).AddrPort().Addr().Unmap()).got(binary.BigEndian.Uint64(buf))
				_, _ = s.pc.WriteTo(buf[:n], from)
			}
		}
	}()
	return s, nil
}

// Close stops the server.
func (s *FlowServer) Close() {
	s.ln.Close()
	s.pc.Close()
}

// StartFlows opens one TCP and one UDP flow from the client pod to the
// server and sends a record on each every FlowInterval until ctx ends.
func StartFlows(ctx context.Context, lab *netlab.Lab, from netlab.Endpoint, srv netip.Addr) error {
	var tc, uc net.Conn
	err := lab.InNetns(from, func() error {
		var err error
		d := net.Dialer{Timeout: 5 * time.Second}
		if tc, err = d.Dial("tcp", netip.AddrPortFrom(srv, 8080).String()); err != nil {
			return err
		}
		tc.(*net.TCPConn).SetNoDelay(true)
		uc, err = d.Dial("udp", netip.AddrPortFrom(srv, 9090).String())
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	go func() {
		defer tc.Close()
		defer uc.Close()
		go func() { _, _ = io.Copy(io.Discard, uc) }() // the echoes
		buf := make([]byte, 8)
		t := time.NewTicker(FlowInterval)
		defer t.Stop()
		for seq := uint64(1); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			binary.BigEndian.PutUint64(buf, seq)
			_ = tc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = tc.Write(buf) // a revoked flow's writes only fill the buffer
			_, _ = uc.Write(buf)
		}
	}()
	return nil
}
