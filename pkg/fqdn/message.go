package fqdn

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
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

// maxChain bounds the names of a CNAME chain, the question included
// (resolvers stop far earlier).
const maxChain = 16

// Why an answer record of a reply was not learned: the values of the cause
// label of nftpolicy_dns_answers_not_learned_total.
const (
	// AnswerMapped: an AAAA record holding an IPv4-mapped address
	// (::ffff:a.b.c.d).
	AnswerMapped = "ipv4_mapped"
	// AnswerNotUnicast: an unspecified, loopback, multicast or (IPv4)
	// limited broadcast address.
	AnswerNotUnicast = "not_unicast"
	// AnswerOverBound: the reply alone holds more names or addresses than
	// the pod may keep (Config.MaxNamesPerPod, MaxAddrsPerPod).
	AnswerOverBound = "over_pod_bound"
)

// Answer is one set of addresses of a reply and the chain of names that
// leads to them: from the question, through the reply's CNAME records, to
// the owner of the A/AAAA records.
type Answer struct {
	// Names holds the question name, then the CNAME targets, in chain
	// order, up to the records' owner (the last).
	Names []string
	Addrs []netip.Addr
	// TTL is the smallest TTL of the chain's CNAME records and the owner's
	// address records.
	TTL time.Duration
}

// Question returns the name the pod asked, the first of the chain: the
// only name the answer may be learned for. The trusted resolver answers
// the question truthfully, but the records it relays past the question
// were written by whichever zones the chain passes through: a zone the
// pod controls may alias its name to any other ("y.attacker.test CNAME
// www.example.com") and give that name any address in the same reply.
// Matched against the rules, a name reached only through a CNAME would
// let any zone assert addresses for every name it can point at.
func (a Answer) Question() string {
	if len(a.Names) == 0 {
		return ""
	}
	return a.Names[0]
}

// Reply is what ParseMessage found in a DNS response.
type Reply struct {
	Answers []Answer
	// Skipped counts address records not learned, by cause (AnswerMapped,
	// AnswerNotUnicast); records not on a chain from the question are
	// ignored without being counted.
	Skipped map[string]int
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

// ParseReply parses a DNS response (see ParseMessage) and returns its
// answers.
func ParseReply(msg []byte) ([]Answer, error) {
	r, err := ParseMessage(msg)
	return r.Answers, err
}

// ParseMessage parses a DNS response and resolves, for each A or AAAA
// question of class IN, which addresses each name of its CNAME chain
// resolves to within the reply. An address is resolved by a name N only if
// N owns the address record, or N reaches the owner through CNAME records
// of the reply that form a chain starting at the question name: a record
// whose owner no chain from the question reaches is ignored, whatever its
// name, so a reply cannot make an address stand for a name that does not
// resolve to it (a record "x A addr" next to "x CNAME www.example.com"
// admits addr for x, never for www.example.com). The order of the records
// does not matter. A name with more than one distinct CNAME target ends
// its chain (the reply is inconsistent; neither target is followed);
// loops end at the first repeated name and chains at maxChain names.
// Every name of a chain resolves to its addresses, but the learner learns
// them for the question only (Answer.Question).
//
// AAAA records are learned only as IPv6 addresses: an IPv4-mapped AAAA
// answer (::ffff:a.b.c.d) is not learned. A dual-stack socket connecting
// to it sends IPv4 from the pod's IPv4 address to a.b.c.d, which only an A
// answer may admit; learning it as a.b.c.d would let a name's AAAA record
// stand in for an A record the resolver never returned, and as an IPv6
// element it would never match a packet. Unspecified, loopback, multicast
// and limited-broadcast addresses are not learned either: no policy means
// to admit them by name. Both are counted in Reply.Skipped.
func ParseMessage(msg []byte) (Reply, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return Reply{}, notLearnable(CauseMalformed)
	}
	if !h.Response {
		return Reply{}, notLearnable(CauseNotAnswer)
	}
	if h.Truncated {
		// Part of the answer is missing; the client retries over TCP.
		return Reply{}, notLearnable(CauseTruncated)
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return Reply{}, notLearnable(CauseMalformed)
	}
	rs := answerRecords{cname: map[string]*alias{}, addrs: map[string]*owned{}}
	if err := rs.read(&p); err != nil {
		return Reply{}, err
	}
	out := Reply{Skipped: rs.skipped}
	for _, q := range qs {
		if q.Class != dnsmessage.ClassINET || (q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA) {
			continue
		}
		out.Answers = rs.resolve(compile.NormalizeDomain(q.Name.String()), out.Answers)
	}
	return out, nil
}

// answerRecords are the IN-class CNAME and address records of a reply's
// answer section, by owner name.
type answerRecords struct {
	cname   map[string]*alias
	addrs   map[string]*owned
	skipped map[string]int
}

// owned are the learnable addresses of one owner name and their smallest
// TTL.
type owned struct {
	addrs []netip.Addr
	ttl   uint32
}

// alias is the CNAME of one owner name.
type alias struct {
	target   string
	ttl      uint32
	conflict bool // more than one distinct target
}

// read reads the answer section; any record it cannot parse makes the
// reply malformed.
func (rs *answerRecords) read(p *dnsmessage.Parser) error {
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return nil
		}
		if err != nil {
			return notLearnable(CauseMalformed)
		}
		name := compile.NormalizeDomain(rh.Name.String())
		switch {
		case rh.Class == dnsmessage.ClassINET && rh.Type == dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				return notLearnable(CauseMalformed)
			}
			rs.addCNAME(name, compile.NormalizeDomain(r.CNAME.String()), rh.TTL)
		case rh.Class == dnsmessage.ClassINET && rh.Type == dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				return notLearnable(CauseMalformed)
			}
			rs.addAddr(name, netip.AddrFrom4(r.A), rh.TTL)
		case rh.Class == dnsmessage.ClassINET && rh.Type == dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			if err != nil {
				return notLearnable(CauseMalformed)
			}
			rs.addAddr(name, netip.AddrFrom16(r.AAAA), rh.TTL)
		default:
			if err := p.SkipAnswer(); err != nil {
				return notLearnable(CauseMalformed)
			}
		}
	}
}

func (rs *answerRecords) addCNAME(name, target string, ttl uint32) {
	switch a := rs.cname[name]; {
	case a == nil:
		rs.cname[name] = &alias{target: target, ttl: ttl}
	case a.target != target:
		a.conflict = true
	default:
		a.ttl = min(a.ttl, ttl)
	}
}

func (rs *answerRecords) addAddr(name string, a netip.Addr, ttl uint32) {
	if cause := skipAddr(a); cause != "" {
		if rs.skipped == nil {
			rs.skipped = map[string]int{}
		}
		rs.skipped[cause]++
		return
	}
	x := rs.addrs[name]
	if x == nil {
		x = &owned{ttl: ttl}
		rs.addrs[name] = x
	}
	if !slices.Contains(x.addrs, a) {
		x.addrs = append(x.addrs, a)
	}
	x.ttl = min(x.ttl, ttl)
}

// resolve walks the chain from a question name and appends an answer for
// each owner of address records on it: resolved by the names before it on
// the chain and by itself.
func (rs *answerRecords) resolve(name string, out []Answer) []Answer {
	var chain []string
	ttl := ^uint32(0) // the smallest CNAME TTL so far
	for len(chain) < maxChain && !slices.Contains(chain, name) {
		chain = append(chain, name)
		if r := rs.addrs[name]; r != nil {
			out = append(out, Answer{Names: slices.Clone(chain), Addrs: r.addrs,
				TTL: time.Duration(min(ttl, r.ttl)) * time.Second})
		}
		a := rs.cname[name]
		if a == nil || a.conflict {
			break
		}
		ttl = min(ttl, a.ttl)
		name = a.target
	}
	return out
}

// skipAddr returns why an answer address is not learned ("" if it is).
func skipAddr(a netip.Addr) string {
	switch {
	case a.Is4In6():
		return AnswerMapped
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return AnswerNotUnicast
	}
	return ""
}
