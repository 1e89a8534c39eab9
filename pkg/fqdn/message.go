package fqdn

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Why a reply was not learned: the values of the cause label.
const (
	CauseUntrusted  = "untrusted_source"
	CauseMalformed  = "malformed"
	CauseTruncated  = "truncated"
	CauseSplit      = "tcp_split"
	CauseNotAnswer  = "not_a_response"
	CauseNoMatch    = "no_matching_name"
	CauseNoAddress  = "no_address"
	CauseWriteError = "write_failed"
	CauseNoProgram  = "no_program"
)

// maxChain bounds CNAME chains (resolvers stop far earlier).
const maxChain = 16

// Answer is one resolved name of a reply: the name (normalized), the
// names it is an alias of or that alias it within the reply, and its
// addresses with the chain's smallest TTL.
type Answer struct {
	// Names holds the question name, then the CNAME targets, in chain order.
	Names []string
	Addrs []netip.Addr
	TTL   time.Duration
}

// errNotLearnable carries the cause of a reply that cannot be learned.
type errNotLearnable struct{ cause string }

func (e errNotLearnable) Error() string { return "DNS reply not learned: " + e.cause }

func notLearnable(cause string) error { return errNotLearnable{cause} }

// Cause returns the cause label of an error of ParseReply or DNSPayload.
func Cause(err error) string {
	var e errNotLearnable
	if errors.As(err, &e) {
		return e.cause
	}
	return CauseMalformed
}

// DNSPayload returns the DNS message carried by a queued packet: after the
// UDP header (bounded by the UDP length), or after the TCP header without
// the two-byte length prefix. A TCP segment without data returns nil, nil
// (nothing to learn, nothing wrong); one that holds only part of a message
// is an error (CauseSplit).
func DNSPayload(proto uint8, packet []byte, l4 int) ([]byte, error) {
	if l4 <= 0 || l4 > len(packet) {
		return nil, notLearnable(CauseMalformed)
	}
	seg := packet[l4:]
	switch proto {
	case 17:
		if len(seg) < 8 {
			return nil, notLearnable(CauseMalformed)
		}
		n := int(binary.BigEndian.Uint16(seg[4:6]))
		if n < 8 || n > len(seg) {
			// Longer than what was queued: the copy range or the IP
			// packet cut it.
			return nil, notLearnable(CauseMalformed)
		}
		return seg[8:n], nil
	case 6:
		if len(seg) < 20 {
			return nil, notLearnable(CauseMalformed)
		}
		off := int(seg[12]>>4) * 4
		if off < 20 || off > len(seg) {
			return nil, notLearnable(CauseMalformed)
		}
		data := seg[off:]
		if len(data) == 0 {
			return nil, nil
		}
		if len(data) < 2 {
			return nil, notLearnable(CauseSplit)
		}
		n := int(binary.BigEndian.Uint16(data[:2]))
		if n > len(data)-2 {
			return nil, notLearnable(CauseSplit)
		}
		return data[2 : 2+n], nil
	}
	return nil, notLearnable(CauseMalformed)
}

// ParseReply parses a DNS response and resolves, for each question, its
// CNAME chain within the reply and the A and AAAA records at the end of
// the chain (records of any name of the chain count: servers put them at
// the end, but a reply may list an alias's address too).
func ParseReply(msg []byte) ([]Answer, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, notLearnable(CauseMalformed)
	}
	if !h.Response {
		return nil, notLearnable(CauseNotAnswer)
	}
	if h.Truncated {
		// Part of the answer is missing; the client retries over TCP.
		return nil, notLearnable(CauseTruncated)
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, notLearnable(CauseMalformed)
	}
	type rec struct {
		addrs []netip.Addr
		ttl   uint32
	}
	cname := map[string]string{}
	cnameTTL := map[string]uint32{}
	addrs := map[string]*rec{}
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return nil, notLearnable(CauseMalformed)
		}
		name := compile.NormalizeDomain(rh.Name.String())
		switch rh.Type {
		case dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				return nil, notLearnable(CauseMalformed)
			}
			cname[name] = compile.NormalizeDomain(r.CNAME.String())
			cnameTTL[name] = rh.TTL
		case dnsmessage.TypeA, dnsmessage.TypeAAAA:
			var a netip.Addr
			if rh.Type == dnsmessage.TypeA {
				r, err := p.AResource()
				if err != nil {
					return nil, notLearnable(CauseMalformed)
				}
				a = netip.AddrFrom4(r.A)
			} else {
				r, err := p.AAAAResource()
				if err != nil {
					return nil, notLearnable(CauseMalformed)
				}
				a = netip.AddrFrom16(r.AAAA).Unmap()
			}
			x := addrs[name]
			if x == nil {
				x = &rec{ttl: rh.TTL}
				addrs[name] = x
			}
			x.addrs = append(x.addrs, a)
			x.ttl = min(x.ttl, rh.TTL)
		default:
			if err := p.SkipAnswer(); err != nil {
				return nil, notLearnable(CauseMalformed)
			}
		}
	}
	var out []Answer
	for _, q := range qs {
		if q.Class != dnsmessage.ClassINET || (q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA) {
			continue
		}
		name := compile.NormalizeDomain(q.Name.String())
		ans := Answer{}
		ttl := ^uint32(0)
		for i := 0; i < maxChain && name != ""; i++ {
			if containsName(ans.Names, name) {
				break // a CNAME loop
			}
			ans.Names = append(ans.Names, name)
			if r := addrs[name]; r != nil {
				ans.Addrs = append(ans.Addrs, r.addrs...)
				ttl = min(ttl, r.ttl)
			}
			next, ok := cname[name]
			if ok {
				ttl = min(ttl, cnameTTL[name])
			}
			name = next
		}
		if len(ans.Addrs) == 0 {
			continue
		}
		ans.TTL = time.Duration(ttl) * time.Second
		out = append(out, ans)
	}
	return out, nil
}

func containsName(ns []string, n string) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}
