package lab

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Pinger is a long-lived echo flow: a pod sends ICMP (ICMPv6) echo
// requests with one identifier at a steady pace, as ping does, and the
// replies' arrivals are recorded. Conntrack keeps one entry for it (type,
// code and identifier), which lives as long as the pings go on.
type Pinger struct {
	// Src, Dst and ID name the flow as conntrack does.
	Src, Dst netip.Addr
	ID       uint16

	conn    *icmp.PacketConn
	mu      sync.Mutex
	replies []time.Time
	done    chan struct{}
}

// StartPinger opens a raw ICMP (ICMPv6 for IPv6 addresses) socket in ep's
// namespace, bound to src, and pings dst every interval until ctx ends;
// Wait returns once its socket is closed. A send that fails (an echo the
// ruleset drops may come back as an error) is not retried: the next one
// goes on time.
func StartPinger(ctx context.Context, l *netlab.Lab, ep netlab.Endpoint, src, dst netip.Addr, id uint16, interval time.Duration) (*Pinger, error) {
	p := &Pinger{Src: src, Dst: dst, ID: id, done: make(chan struct{})}
	network := "ip4:icmp"
	if dst.Is6() {
		network = "ip6:ipv6-icmp"
	}
	if err := l.InNetns(ep, func() (err error) {
		p.conn, err = icmp.ListenPacket(network, src.String())
		return err
	}); err != nil {
		return nil, err
	}
	go p.read()
	go func() {
		defer p.conn.Close()
		t := time.NewTicker(interval)
		defer t.Stop()
		for seq := 1; ; seq++ {
			_ = p.send(seq)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p, nil
}

func (p *Pinger) send(seq int) error {
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if p.Dst.Is6() {
		typ = ipv6.ICMPTypeEchoRequest
	}
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: int(p.ID), Seq: seq & 0xffff, Data: []byte("nftpolicy")}}).Marshal(nil)
	if err != nil {
		return err
	}
	_, err = p.conn.WriteTo(b, &net.IPAddr{IP: p.Dst.AsSlice()})
	return err
}

// read records the echo replies of the flow until the socket closes.
func (p *Pinger) read() {
	defer close(p.done)
	proto := unix.IPPROTO_ICMP
	if p.Dst.Is6() {
		proto = unix.IPPROTO_ICMPV6
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || (m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply) {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); !ok || e.ID != int(p.ID) || from.String() != p.Dst.String() {
			continue
		}
		p.mu.Lock()
		p.replies = append(p.replies, time.Now())
		p.mu.Unlock()
	}
}

// After returns how many replies arrived after t, and when the last one
// (of all) did.
func (p *Pinger) After(t time.Time) (n int, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.replies {
		if r.After(t) {
			n++
		}
		last = r
	}
	return n, last
}

// Wait returns once the pinger stopped (its context ended).
func (p *Pinger) Wait() { <-p.done }
