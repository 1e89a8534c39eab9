package nftnl

import (
	"fmt"

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

var ruleFields = [...]ruleField{
	compile.FieldIPSaddr:  {kind: kindIPv4, nfproto: unix.NFPROTO_IPV4, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 12},
	compile.FieldIPDaddr:  {kind: kindIPv4, nfproto: unix.NFPROTO_IPV4, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 16},
	compile.FieldIP6Saddr: {kind: kindIPv6, nfproto: unix.NFPROTO_IPV6, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 8},
	compile.FieldIP6Daddr: {kind: kindIPv6, nfproto: unix.NFPROTO_IPV6, base: unix.NFT_PAYLOAD_NETWORK_HEADER, offset: 24},
	compile.FieldL4Proto:  {kind: kindProto, meta: true},
	compile.FieldTHDport:  {kind: kindService, base: unix.NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2},
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

// ruleExprs turns a typed rule of the compiler into expressions, as nft
// 1.0.6 writes the rule's printing: set lookups (and verdict-map
// lookups) of fields and their concatenations, each field after the
// network protocol check it needs; counter, limit and log statements;
// the verdict. A rule with an expression of another kind (ExprNft, the
// meters of ExprMeter, sampling's ExprNfproto and ExprNumgen) is
// ErrUnsupported, naming the kind: it goes through nft.
func ruleExprs(r *compile.TableRule, sets func(string) *compile.Set) ([]nlExpr, error) {
	p := &ruleEncoder{sets: sets}
	for i := range r.Exprs {
		if err := p.expr(&r.Exprs[i]); err != nil {
			return nil, err
		}
	}
	if err := p.verdict(r.Verdict); err != nil {
		return nil, err
	}
	return p.out, nil
}

// ruleEncoder turns a rule's expressions into netlink expressions.
type ruleEncoder struct {
	sets func(string) *compile.Set
	out  []nlExpr
	// nfproto is the network protocol the rule has checked.
	nfproto byte
}

func unsupported(what string) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, what)
}

// expr encodes one match or statement.
func (p *ruleEncoder) expr(e *compile.RuleExpr) error {
	switch e.Kind {
	case compile.ExprLookup, compile.ExprVmap:
		return p.match(e)
	case compile.ExprCounter:
		p.out = append(p.out, nlExpr{name: "counter"})
	case compile.ExprLimit:
		p.out = append(p.out, nlExpr{name: "limit", rate: e.Rate, burst: e.Burst, over: e.Over})
	case compile.ExprLog:
		prefix := e.Prefix
		p.out = append(p.out, nlExpr{name: "log", prefix: &prefix, group: int32(e.Group)})
	case compile.ExprMeter:
		return unsupported("meter update @" + e.Set)
	case compile.ExprNfproto, compile.ExprNumgen:
		return unsupported("sampling expression")
	case compile.ExprNft:
		return unsupported("expression only nft writes: " + e.Text)
	default:
		return unsupported(fmt.Sprintf("expression kind %d", e.Kind))
	}
	return nil
}

// match encodes a set lookup: its fields, loaded into the key's
// registers, and the lookup.
func (p *ruleEncoder) match(e *compile.RuleExpr) error {
	vmap := e.Kind == compile.ExprVmap
	if vmap && e.Neg {
		return unsupported("a negated verdict map lookup")
	}
	fields := make([]ruleField, len(e.Fields))
	for i, f := range e.Fields {
		if f < compile.FieldIPSaddr || int(f) >= len(ruleFields) {
			return unsupported("field " + f.String())
		}
		fields[i] = ruleFields[f]
	}
	name := e.Set
	set := p.sets(name)
	if set == nil {
		return unsupported("set " + name + " is not in the ruleset")
	}
	l, err := LayoutOf(set)
	if err != nil {
		return err
	}
	if len(fields) == 0 || len(l.key) != len(fields) || vmap != l.verdict || (set.Map != nil && !vmap) {
		return unsupported("lookup of " + name + " does not match its type")
	}
	if err := p.loadKey(fields, &l, name); err != nil {
		return err
	}
	p.out = append(p.out, nlExpr{name: "lookup", reg: unix.NFT_REG_1, set: name, inv: e.Neg, vmap: vmap})
	return nil
}

// loadKey writes the expressions that load the fields into the registers
// of the set's key (l), each after the network protocol check it needs.
func (p *ruleEncoder) loadKey(fields []ruleField, l *Layout, name string) error {
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

// verdict encodes the rule's verdict (none for a rule that ends in a
// verdict map or falls through).
func (p *ruleEncoder) verdict(v compile.RuleVerdict) error {
	if v.Kind == compile.VerdictNone {
		return nil
	}
	code, err := verdictCode(v)
	if err != nil {
		return err
	}
	p.out = append(p.out, nlExpr{name: "immediate", verdict: code, chain: v.Chain})
	return nil
}
