package dnsserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Record is what the server knows about one name.
type Record struct {
	// Name is the owner name, without the trailing dot.
	Name string
	// CNAME, when set, makes Name an alias: the answer is the CNAME
	// record followed by the target's records (chains are followed).
	CNAME string
	// Addrs are the name's A and AAAA addresses.
	Addrs []netip.Addr
	// TTL is the records' TTL in seconds.
	TTL uint32
	// Truncated answers with the TC bit set (the answer section kept).
	Truncated bool
	// Clients, when not empty, limits the record to queries from these
	// addresses (two pods may have resolved one name differently).
	Clients []netip.Addr
	// Raw, when not empty, is the whole answer section, in this order,
	// for any question of Name (CNAME and Addrs are then unused): replies
	// a resolver would pass on from a zone an attacker controls.
	Raw []RawRecord
	// TXT are the name's TXT strings (each at most 255 bytes, any bytes):
	// one TXT record answers a TXT question.
	TXT []string
	// TCPChunk, when not 0, writes the TCP answer in pieces of this many
	// bytes (the length prefix included), each sent as a segment of its
	// own: a reply split over several segments.
	TCPChunk int
}

// RawRecord is one answer record of a Raw answer: a CNAME when CNAME is
// set, else an A or AAAA record of Addr (an IPv4-mapped IPv6 address is an
// AAAA record).
type RawRecord struct {
	Name, CNAME string
	Addr        netip.Addr
	TTL         uint32
}

// Server answers from its records until closed. Safe for concurrent use.
type Server struct {
	mu      sync.RWMutex
	records map[string][]Record

	udp net.PacketConn
	tcp net.Listener
	wg  sync.WaitGroup
}

// Listen opens UDP and TCP port 53 (or the given port) on addr and serves.
// Call it on a thread inside the target network namespace (netlab's
// InNetns): the sockets stay in that namespace.
func Listen(addr netip.Addr, port uint16, records []Record) (*Server, error) {
	s := &Server{}
	s.Set(records)
	ap := netip.AddrPortFrom(addr, port).String()
	var err error
	if s.udp, err = net.ListenPacket("udp", ap); err != nil {
		return nil, err
	}
	if s.tcp, err = net.Listen("tcp", ap); err != nil {
		s.udp.Close()
		return nil, err
	}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

// Set replaces the records.
func (s *Server) Set(records []Record) {
	m := make(map[string][]Record, len(records))
	for _, r := range records {
		k := strings.ToLower(strings.TrimSuffix(r.Name, "."))
		m[k] = append(m[k], r)
	}
	s.mu.Lock()
	s.records = m
	s.mu.Unlock()
}

// Close stops serving.
func (s *Server) Close() error {
	err := errors.Join(s.udp.Close(), s.tcp.Close())
	s.wg.Wait()
	return err
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, _, ok := s.answer(buf[:n], addrOf(from)); ok {
			_, _ = s.udp.WriteTo(out, from)
		}
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			for {
				msg, err := readTCP(c)
				if err != nil {
					return
				}
				out, chunk, ok := s.answer(msg, addrOf(c.RemoteAddr()))
				if !ok {
					return
				}
				if err := writeChunked(c, append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...), chunk); err != nil {
					return
				}
			}
		}()
	}
}

// writeChunked writes b in one write (one segment when it fits), or in
// pieces of chunk bytes, each flushed on its own (TCP_NODELAY) after a
// pause that lets the previous one leave.
func writeChunked(c net.Conn, b []byte, chunk int) error {
	if chunk <= 0 {
		_, err := c.Write(b)
		return err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	for len(b) > 0 {
		n := min(chunk, len(b))
		if _, err := c.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func readTCP(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

func addrOf(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// lookup returns the record of name for a client (the caller holds mu).
func (s *Server) lookup(name string, client netip.Addr) (Record, bool) {
	for _, r := range s.records[name] {
		if len(r.Clients) == 0 || slices.Contains(r.Clients, client) {
			return r, true
		}
	}
	return Record{}, false
}

// answer builds the response to a query from client and the name's
// TCPChunk; false for what is not a query.
func (s *Server) answer(query []byte, client netip.Addr) ([]byte, int, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, 0, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, 0, false
	}
	chunk := 0
	resp := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	var answers []dnsmessage.Resource
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	s.mu.RLock()
	found := false
	for i := 0; i < 8; i++ {
		r, ok := s.lookup(name, client)
		if !ok {
			break
		}
		found = true
		chunk = max(chunk, r.TCPChunk)
		if len(r.Raw) > 0 {
			answers = rawAnswers(r.Raw)
			break
		}
		if r.Truncated {
			resp.Truncated = true
		}
		hdr := dnsmessage.ResourceHeader{Name: mustName(name), Class: dnsmessage.ClassINET, TTL: r.TTL}
		if r.CNAME != "" {
			answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.CNAMEResource{CNAME: mustName(r.CNAME)}})
			name = strings.ToLower(strings.TrimSuffix(r.CNAME, "."))
			continue
		}
		for _, a := range r.Addrs {
			switch {
			case a.Is4() && q.Type == dnsmessage.TypeA:
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AResource{A: a.As4()}})
			case a.Is6() && q.Type == dnsmessage.TypeAAAA:
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
			}
		}
		if len(r.TXT) > 0 && q.Type == dnsmessage.TypeTXT {
			answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.TXTResource{TXT: r.TXT}})
		}
		break
	}
	s.mu.RUnlock()
	if !found {
		resp.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, resp)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	for _, a := range answers {
		switch body := a.Body.(type) {
		case *dnsmessage.CNAMEResource:
			_ = b.CNAMEResource(a.Header, *body)
		case *dnsmessage.AResource:
			_ = b.AResource(a.Header, *body)
		case *dnsmessage.AAAAResource:
			_ = b.AAAAResource(a.Header, *body)
		case *dnsmessage.TXTResource:
			_ = b.TXTResource(a.Header, *body)
		}
	}
	out, err := b.Finish()
	return out, chunk, err == nil
}

func rawAnswers(rs []RawRecord) []dnsmessage.Resource {
	var out []dnsmessage.Resource
	for _, r := range rs {
		hdr := dnsmessage.ResourceHeader{Name: mustName(r.Name), Class: dnsmessage.ClassINET, TTL: r.TTL}
		switch {
		case r.CNAME != "":
			out = append(out, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.CNAMEResource{CNAME: mustName(r.CNAME)}})
		case r.Addr.Is4():
			out = append(out, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AResource{A: r.Addr.As4()}})
		default:
			out = append(out, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: r.Addr.As16()}})
		}
	}
	return out
}

func mustName(n string) dnsmessage.Name {
	if !strings.HasSuffix(n, ".") {
		n += "."
	}
	return dnsmessage.MustNewName(n)
}

// Lookup asks server for name's A (v6 false) or AAAA records, over TCP or
// UDP, and returns the addresses of the answer section. Call it inside the
// client's network namespace; timeout bounds the whole exchange.
func Lookup(server netip.AddrPort, name string, v6, tcp bool, timeout time.Duration) ([]netip.Addr, error) {
	qt := dnsmessage.TypeA
	if v6 {
		qt = dnsmessage.TypeAAAA
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(time.Now().UnixNano()), RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: mustName(name), Type: qt, Class: dnsmessage.ClassINET}); err != nil {
		return nil, err
	}
	q, err := b.Finish()
	if err != nil {
		return nil, err
	}
	network := "udp"
	if tcp {
		network = "tcp"
	}
	c, err := net.DialTimeout(network, server.String(), timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var resp []byte
	if tcp {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
			return nil, err
		}
		if resp, err = readTCP(c); err != nil {
			return nil, err
		}
	} else {
		if _, err := c.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		resp = buf[:n]
	}
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return nil, err
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("%s: %v", name, h.RCode)
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, err
	}
	rs, err := p.AllAnswers()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, r := range rs {
		switch body := r.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(body.A))
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(body.AAAA))
		}
	}
	return out, nil
}
