package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// udpMagic marks probe datagrams; servers answer them with
// payload + "\n" + server name. Other datagrams are echoed verbatim.
const udpMagic = "NETLAB-PROBE "

// servers are the in-process TCP/UDP servers of one namespace.
type servers struct {
	name string
	mu   sync.Mutex
	tcp  []*net.TCPListener
	udp  []*net.UDPConn
	wg   sync.WaitGroup
}

// startServers listens inside h: TCP on the wildcard address (dual-stack),
// UDP on each of ips so that replies leave from the address that was probed.
func startServers(h *nsHandle, name string, ips []netip.Addr, tcpPorts, udpPorts []uint16) (*servers, error) {
	s := &servers{name: name}
	err := h.run(func() error {
		for _, p := range tcpPorts {
			ln, err := net.ListenTCP("tcp", &net.TCPAddr{Port: int(p)})
			if err != nil {
				return err
			}
			s.tcp = append(s.tcp, ln)
		}
		for _, p := range udpPorts {
			for _, a := range ips {
				network := "udp4"
				if a.Is6() {
					network = "udp6"
				}
				c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, p)))
				if err != nil {
					return err
				}
				// Bursts of hundreds of parallel probes must not overflow
				// the receive queue (FORCE bypasses rmem_max; we are root).
				if rc, err := c.SyscallConn(); err == nil {
					_ = rc.Control(func(fd uintptr) {
						_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
					})
				}
				s.udp = append(s.udp, c)
			}
		}
		return nil
	})
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("start servers in %s: %w", h.name, err)
	}
	for _, ln := range s.tcp {
		s.wg.Add(1)
		go s.serveTCP(ln)
	}
	for _, c := range s.udp {
		s.wg.Add(1)
		go s.serveUDP(c)
	}
	return s, nil
}

func (s *servers) serveTCP(ln *net.TCPListener) {
	defer s.wg.Done()
	msg := []byte(s.name + "\n")
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // e.g. EMFILE
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write(msg)
			_ = c.Close()
		}()
	}
}

func (s *servers) serveUDP(c *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 64<<10)
	var out []byte
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ECONNREFUSED from an ICMP error
		}
		p := buf[:n]
		if bytes.HasPrefix(p, []byte(udpMagic)) {
			out = append(append(append(out[:0], p...), '\n'), s.name...)
			p = out
		}
		_, _ = c.WriteToUDPAddrPort(p, from)
	}
}

// stop closes all sockets and waits for every server goroutine to exit.
// It is safe on a nil receiver and idempotent.
func (s *servers) stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	for _, ln := range s.tcp {
		_ = ln.Close()
	}
	for _, c := range s.udp {
		_ = c.Close()
	}
	s.tcp, s.udp = nil, nil
	s.mu.Unlock()
	s.wg.Wait()
}
