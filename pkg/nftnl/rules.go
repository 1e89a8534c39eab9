package nftnl

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// A selector field of a rule: what it loads and the set key kind it is.
type ruleField struct {
	kind fieldKind
	// nfproto is the network protocol the field needs (0: none).
	nfproto byte
	meta    bool
	base    uint32 // payload base
	offset  uint32
}

var ruleFields = map[string]ruleField{
	"ip saddr":     {kind: kindIPv4, nfproto: unix.NFPROTO_IPV4, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 12},
	"ip daddr":     {kind: kindIPv4, nfproto: unix.NFPROTO_IPV4, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 16},
	"ip6 saddr":    {kind: kindIPv6, nfproto: unix.NFPROTO_IPV6, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 8},
	"ip6 daddr":    {kind: kindIPv6, nfproto: unix.NFPROTO_IPV6, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 24},
	"meta l4proto": {kind: kindProto, meta: true},
	"th dport":     {kind: kindService, base: unix.NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2},
}

// concatReg is the register nft loads a concatenation's field at this byte
// offset of the key into: a 16-byte register where one starts, else a
// 4-byte one.
func concatReg(offset int) uint32 {
	if offset%16 == 0 {
		return unix.NFT_REG_1 + uint32(offset/16)
	}
	return nftReg32 + uint32(offset/4)
}

// parseRule turns a rule of the compiler's forms into expressions:
//
//	rule     = { match } { stmt } [ verdict ]
//	match    = field { "." field } [ "!=" | "vmap" ] "@"set
//	field    = ("ip" | "ip6") ("saddr" | "daddr") | "meta l4proto" | "th dport"
//	stmt     = "counter" | "limit rate" N"/second burst" M "packets"
//	         | "log" [ "prefix" "quoted" ] [ "group" N ]
//	verdict  = "accept" | "drop" | ("jump" | "goto") chain
//
// Anything else is ErrUnsupported.
func parseRule(text string, sets func(string) *compile.Set) ([]nlExpr, error) {
	toks, err := ruleTokens(text)
	if err != nil {
		return nil, err
	}
	p := &ruleParser{toks: toks, sets: sets}
	for p.i < len(p.toks) {
		if err := p.statement(); err != nil {
			return nil, err
		}
	}
	return p.out, nil
}

// ruleParser reads a rule's tokens from i on into expressions.
type ruleParser struct {
	toks []string
	i    int
	sets func(string) *compile.Set
	out  []nlExpr
	// nfproto is the network protocol the rule has checked.
	nfproto byte
}

func unsupported(what string) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, what)
}

// statement reads one match, statement or verdict.
func (p *ruleParser) statement() error {
	switch t := p.toks[p.i]; t {
	case "ip", "ip6", "meta", "th":
		return p.match()
	case "counter":
		p.out = append(p.out, nlExpr{name: "counter"})
		p.i++
		return nil
	case "limit":
		return p.limit()
	case "log":
		return p.log()
	case "accept", "drop", "jump", "goto":
		return p.verdict()
	default:
		return unsupported("statement " + t)
	}
}

// match reads a set lookup: its fields, loaded into the key's registers,
// and the lookup.
func (p *ruleParser) match() error {
	fields, err := p.fields()
	if err != nil {
		return err
	}
	toks := p.toks
	var inv, vmap bool
	if p.i < len(toks) && (toks[p.i] == "!=" || toks[p.i] == "vmap") {
		inv, vmap = toks[p.i] == "!=", toks[p.i] == "vmap"
		p.i++
	}
	if p.i >= len(toks) || !strings.HasPrefix(toks[p.i], "@") {
		return unsupported("a match that is not a set lookup")
	}
	name := toks[p.i][1:]
	p.i++
	set := p.sets(name)
	if set == nil {
		return unsupported("set " + name + " is not in the ruleset")
	}
	l, err := LayoutOf(set)
	if err != nil {
		return err
	}
	if len(l.key) != len(fields) || vmap != l.verdict || (set.Map != nil && !vmap) {
		return unsupported("lookup of " + name + " does not match its type")
	}
	if err := p.loadKey(fields, &l, name); err != nil {
		return err
	}
	p.out = append(p.out, nlExpr{name: "lookup", reg: unix.NFT_REG_1, set: name, inv: inv, vmap: vmap})
	return nil
}

// fields reads a field or a concatenation of fields.
func (p *ruleParser) fields() ([]ruleField, error) {
	var fields []ruleField
	for {
		if p.i+1 >= len(p.toks) {
			return nil, unsupported("a field without a set")
		}
		f, ok := ruleFields[p.toks[p.i]+" "+p.toks[p.i+1]]
		if !ok {
			return nil, unsupported("field " + p.toks[p.i] + " " + p.toks[p.i+1])
		}
		fields = append(fields, f)
		p.i += 2
		if p.i < len(p.toks) && p.toks[p.i] == "." {
			p.i++
			continue
		}
		return fields, nil
	}
}

// loadKey writes the expressions that load the fields into the registers
// of the set's key (l), each after the network protocol check it needs.
func (p *ruleParser) loadKey(fields []ruleField, l *Layout, name string) error {
	offset := 0
	for k, f := range fields {
		if f.kind != l.key[k] {
			return unsupported("lookup of " + name + " does not match its type")
		}
		reg := uint32(unix.NFT_REG_1)
		if k > 0 {
			reg = concatReg(offset)
		}
		if f.nfproto != 0 && p.nfproto != f.nfproto {
			if p.nfproto != 0 || k > 0 {
				return unsupported("a network protocol check inside a concatenation")
			}
			p.nfproto = f.nfproto
			p.out = append(p.out,
				nlExpr{name: "meta", key: unix.NFT_META_NFPROTO, reg: unix.NFT_REG_1},
				nlExpr{name: "cmp", reg: unix.NFT_REG_1, cmpData: f.nfproto})
		}
		if f.meta {
			p.out = append(p.out, nlExpr{name: "meta", key: unix.NFT_META_L4PROTO, reg: reg})
			if l.interval && len(fields) > 1 {
				if k > 0 {
					return unsupported("a protocol inside an interval concatenation")
				}
				p.out = append(p.out, nlExpr{name: "byteorder", reg: reg})
			}
		} else {
			p.out = append(p.out, nlExpr{name: "payload", reg: reg, base: f.base, offset: f.offset, length: uint32(f.kind.size())})
		}
		offset += align4(f.kind.size())
	}
	return nil
}

// limit reads "limit rate N/second burst M packets".
func (p *ruleParser) limit() error {
	toks, i := p.toks, p.i
	if i+5 >= len(toks) || toks[i+1] != "rate" || toks[i+3] != "burst" || toks[i+5] != "packets" {
		return unsupported("limit")
	}
	r, ok := strings.CutSuffix(toks[i+2], "/second")
	rate, err1 := strconv.ParseUint(r, 10, 32)
	burst, err2 := strconv.ParseUint(toks[i+4], 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return unsupported("limit " + toks[i+2] + " burst " + toks[i+4])
	}
	p.out = append(p.out, nlExpr{name: "limit", rate: uint32(rate), burst: uint32(burst)})
	p.i += 6
	return nil
}

// log reads "log" and its prefix and group options.
func (p *ruleParser) log() error {
	toks := p.toks
	e := nlExpr{name: "log", group: -1}
	p.i++
	for p.i+1 < len(toks) && (toks[p.i] == "prefix" || toks[p.i] == "group") {
		if toks[p.i] == "prefix" {
			s, ok := unquote(toks[p.i+1])
			if !ok {
				return unsupported("log prefix " + toks[p.i+1])
			}
			e.prefix = &s
		} else {
			g, err := strconv.ParseUint(toks[p.i+1], 10, 16)
			if err != nil {
				return unsupported("log group " + toks[p.i+1])
			}
			e.group = int32(g)
		}
		p.i += 2
	}
	p.out = append(p.out, e)
	return nil
}

// verdict reads the rule's last statement: accept, drop, jump or goto.
func (p *ruleParser) verdict() error {
	t := p.toks[p.i]
	e := nlExpr{name: "immediate", verdict: verdictCodes[t]}
	p.i++
	if t == "jump" || t == "goto" {
		if p.i >= len(p.toks) {
			return unsupported(t + " without a chain")
		}
		e.chain = p.toks[p.i]
		p.i++
	}
	if p.i != len(p.toks) {
		return unsupported("statements after the verdict")
	}
	p.out = append(p.out, e)
	return nil
}

// ruleTokens splits a rule at spaces; a double-quoted string (without
// quotes or backslashes inside) is one token, quotes kept.
func ruleTokens(s string) ([]string, error) {
	var toks []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(s, " ") {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 || strings.ContainsRune(s[1:end+1], '\\') {
				return nil, fmt.Errorf("%w: quoting in %q", ErrUnsupported, s)
			}
			toks = append(toks, s[:end+2])
			s = s[end+2:]
			continue
		}
		n := strings.IndexByte(s, ' ')
		if n < 0 {
			n = len(s)
		}
		if strings.ContainsAny(s[:n], "\"\\{}") {
			return nil, fmt.Errorf("%w: token %q", ErrUnsupported, s[:n])
		}
		toks = append(toks, s[:n])
		s = s[n:]
	}
	return toks, nil
}

func unquote(t string) (string, bool) {
	if len(t) < 2 || t[0] != '"' || t[len(t)-1] != '"' {
		return "", false
	}
	return t[1 : len(t)-1], true
}
