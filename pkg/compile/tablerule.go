package compile

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// A TableRule is one rule of the nftpolicy table as the renderer emits it:
// typed matches and statements, a verdict, a comment, and the policy rule
// it belongs to. Every reader takes these values: pkg/nftnl encodes the
// netlink messages from them, the depth check follows their verdicts,
// the per-policy counters read their owners. Their nft text (Text) is only
// a printing of them, for knftables (full syncs and the goldens) and for
// the nft path of the expressions pkg/nftnl does not encode (ExprNft):
// nothing parses it back.
type TableRule struct {
	Exprs   []RuleExpr
	Verdict RuleVerdict
	Comment *string
	// Owner is the policy rule (or default deny) that the rule decides
	// for: the zero Owner for a rule of no policy.
	Owner RuleOwner
}

// RuleField is a packet field a rule loads into a set lookup's key.
type RuleField uint8

// The fields the renderer's lookups use.
const (
	FieldIPSaddr RuleField = iota + 1
	FieldIPDaddr
	FieldIP6Saddr
	FieldIP6Daddr
	FieldL4Proto
	FieldTHDport
)

var fieldText = [...]string{
	FieldIPSaddr: "ip saddr", FieldIPDaddr: "ip daddr", FieldIP6Saddr: "ip6 saddr", FieldIP6Daddr: "ip6 daddr",
	FieldL4Proto: "meta l4proto", FieldTHDport: "th dport",
}

func (f RuleField) String() string {
	if int(f) < len(fieldText) && fieldText[f] != "" {
		return fieldText[f]
	}
	return fmt.Sprintf("field(%d)", uint8(f))
}

// IPv4 reports a field of the IPv4 header; IPv6 one of the IPv6 header.
func (f RuleField) IPv4() bool { return f == FieldIPSaddr || f == FieldIPDaddr }

// IPv6 reports a field of the IPv6 header.
func (f RuleField) IPv6() bool { return f == FieldIP6Saddr || f == FieldIP6Daddr }

// addrField is the source ("saddr") or destination ("daddr") address of a
// family.
func addrField(v4 bool, end string) RuleField {
	switch {
	case v4 && end == "saddr":
		return FieldIPSaddr
	case v4:
		return FieldIPDaddr
	case end == "saddr":
		return FieldIP6Saddr
	}
	return FieldIP6Daddr
}

// ExprKind is the kind of a rule's match or statement.
type ExprKind uint8

// The matches and statements of the renderer's rules.
const (
	// ExprLookup: Fields (a concatenation) looked up in Set; Neg for "!=".
	ExprLookup ExprKind = iota + 1
	// ExprVmap: Fields looked up in the verdict map Set, whose element
	// decides.
	ExprVmap
	// ExprCounter counts the rule's packets and bytes.
	ExprCounter
	// ExprLimit: packets within Rate/second, Burst (Over: beyond them).
	ExprLimit
	// ExprLog: NFLOG to Group with Prefix.
	ExprLog
	// ExprMeter: the per-key limit of a dynamic set Set keyed by
	// Fields[0] ("update @Set { field limit rate ... }").
	ExprMeter
	// ExprNfproto: packets of IPv4 (V4) or IPv6.
	ExprNfproto
	// ExprNumgen: a random number modulo Mod below Below (sampling).
	ExprNumgen
	// ExprNft is an expression only nft writes (conntrack state and
	// marks, interface kinds, fib, ICMPv6 types, anonymous sets, queue
	// statements), kept as the text nft takes, which is built here and
	// never read: pkg/nftnl refuses it by kind, so a rule with one goes
	// through nft, as the base chains do.
	ExprNft
)

// RuleExpr is one match or statement of a rule; which fields count
// depends on Kind.
type RuleExpr struct {
	Kind   ExprKind
	Fields []RuleField
	Set    string
	Neg    bool
	// Rate and Burst are packets per second (ExprLimit, ExprMeter).
	Rate, Burst uint32
	Over        bool
	Prefix      string
	Group       uint16
	Mod, Below  uint32
	V4          bool
	Text        string
}

// VerdictKind is a rule's verdict.
type VerdictKind uint8

// The verdicts; VerdictNone for a rule that ends in a verdict map or a
// queue statement, or falls through.
const (
	VerdictNone VerdictKind = iota
	VerdictAccept
	VerdictDrop
	VerdictReturn
	VerdictJump
	VerdictGoto
)

// RuleVerdict is a rule's last statement: Chain for jump and goto.
type RuleVerdict struct {
	Kind  VerdictKind
	Chain string
}

func accept() RuleVerdict            { return RuleVerdict{Kind: VerdictAccept} }
func drop() RuleVerdict              { return RuleVerdict{Kind: VerdictDrop} }
func jump(chain string) RuleVerdict  { return RuleVerdict{Kind: VerdictJump, Chain: chain} }
func gotoV(chain string) RuleVerdict { return RuleVerdict{Kind: VerdictGoto, Chain: chain} }
func returnV() RuleVerdict           { return RuleVerdict{Kind: VerdictReturn} }

func (v RuleVerdict) String() string {
	switch v.Kind {
	case VerdictAccept:
		return "accept"
	case VerdictDrop:
		return "drop"
	case VerdictReturn:
		return "return"
	case VerdictJump:
		return "jump " + v.Chain
	case VerdictGoto:
		return "goto " + v.Chain
	}
	return ""
}

// OwnerKind says what a rule decides for.
type OwnerKind uint8

// The owners of rules.
const (
	OwnerNone OwnerKind = iota
	// OwnerAllow: an allow rule of the NetworkPolicy Policies[0].
	OwnerAllow
	// OwnerDeny: the default deny of the NetworkPolicies Policies (an
	// isolation chain's last rule).
	OwnerDeny
	// OwnerClusterRule: a rule of the ClusterNetworkPolicy Policies[0].
	OwnerClusterRule
)

// RuleOwner is the policy rule a rule of the table belongs to.
type RuleOwner struct {
	Kind      OwnerKind
	Direction Direction
	// Policies are NetworkPolicy keys (namespace/name), or a
	// ClusterNetworkPolicy's name.
	Policies []string
	// Rule names the policy rule (e.g. "ns/name ingress[0]").
	Rule string
}

// Text prints the rule as nft reads it (without its comment).
func (r *TableRule) Text() string {
	var b strings.Builder
	for i := range r.Exprs {
		if i > 0 {
			b.WriteByte(' ')
		}
		r.Exprs[i].appendText(&b)
	}
	if v := r.Verdict.String(); v != "" {
		if len(r.Exprs) > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(v)
	}
	return b.String()
}

// Knft is the rule as knftables writes it.
func (r *TableRule) Knft() knftables.Rule {
	return knftables.Rule{Rule: r.Text(), Comment: r.Comment}
}

// Equal reports whether two rules are the same rule of the table: same
// expressions, verdict, comment and owner. (A value method: go-cmp
// compares rules with it.)
func (r TableRule) Equal(o TableRule) bool {
	if r.Verdict != o.Verdict || !equalComment(r.Comment, o.Comment) || len(r.Exprs) != len(o.Exprs) ||
		r.Owner.Kind != o.Owner.Kind || r.Owner.Direction != o.Owner.Direction || r.Owner.Rule != o.Owner.Rule ||
		!slices.Equal(r.Owner.Policies, o.Owner.Policies) {
		return false
	}
	for i := range r.Exprs {
		if !r.Exprs[i].equal(&o.Exprs[i]) {
			return false
		}
	}
	return true
}

func equalComment(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func (e *RuleExpr) equal(o *RuleExpr) bool {
	return e.Kind == o.Kind && slices.Equal(e.Fields, o.Fields) && e.Set == o.Set && e.Neg == o.Neg &&
		e.Rate == o.Rate && e.Burst == o.Burst && e.Over == o.Over && e.Prefix == o.Prefix && e.Group == o.Group &&
		e.Mod == o.Mod && e.Below == o.Below && e.V4 == o.V4 && e.Text == o.Text
}

func (e *RuleExpr) appendText(b *strings.Builder) {
	fields := func() {
		for i, f := range e.Fields {
			if i > 0 {
				b.WriteString(" . ")
			}
			b.WriteString(f.String())
		}
	}
	switch e.Kind {
	case ExprLookup:
		fields()
		if e.Neg {
			b.WriteString(" !=")
		}
		b.WriteString(" @" + e.Set)
	case ExprVmap:
		fields()
		b.WriteString(" vmap @" + e.Set)
	case ExprCounter:
		b.WriteString("counter")
	case ExprLimit:
		b.WriteString("limit " + limitText(e.Rate, e.Burst, e.Over))
	case ExprLog:
		fmt.Fprintf(b, "log prefix %q group %d", e.Prefix, e.Group)
	case ExprMeter:
		b.WriteString("update @" + e.Set + " { ")
		fields()
		b.WriteString(" limit " + limitText(e.Rate, e.Burst, e.Over) + " }")
	case ExprNfproto:
		if e.V4 {
			b.WriteString("meta nfproto ipv4")
		} else {
			b.WriteString("meta nfproto ipv6")
		}
	case ExprNumgen:
		fmt.Fprintf(b, "numgen random mod %d < %d", e.Mod, e.Below)
	case ExprNft:
		b.WriteString(e.Text)
	}
}

func limitText(rate, burst uint32, over bool) string {
	o := ""
	if over {
		o = "over "
	}
	return fmt.Sprintf("rate %s%d/second burst %d packets", o, rate, burst)
}

// Targets returns the chains the rule jumps or goes to, directly or
// through its verdict maps' elements (sets resolves a map by name).
func (r *TableRule) Targets(sets func(string) *Set) []string {
	var out []string
	if r.Verdict.Kind == VerdictJump || r.Verdict.Kind == VerdictGoto {
		out = append(out, r.Verdict.Chain)
	}
	for i := range r.Exprs {
		e := &r.Exprs[i]
		if e.Kind != ExprVmap {
			continue
		}
		s := sets(e.Set)
		if s == nil {
			continue
		}
		for j := range s.Elements {
			if v := s.Elements[j].Value(); v.Kind == VerdictJump || v.Kind == VerdictGoto {
				out = append(out, v.Chain)
			}
		}
	}
	return out
}

// Builders of the renderer's expressions.

func lookup(set string, fields ...RuleField) RuleExpr {
	return RuleExpr{Kind: ExprLookup, Set: set, Fields: fields}
}

func notIn(set string, fields ...RuleField) RuleExpr {
	return RuleExpr{Kind: ExprLookup, Set: set, Fields: fields, Neg: true}
}

func vmap(set string, fields ...RuleField) RuleExpr {
	return RuleExpr{Kind: ExprVmap, Set: set, Fields: fields}
}

func counter() RuleExpr { return RuleExpr{Kind: ExprCounter} }

func limitOver(rate, burst uint32) RuleExpr {
	return RuleExpr{Kind: ExprLimit, Rate: rate, Burst: burst, Over: true}
}

func logTo(prefix string, group uint16) RuleExpr {
	return RuleExpr{Kind: ExprLog, Prefix: prefix, Group: group}
}

func meter(set string, f RuleField, rate, burst uint32, over bool) RuleExpr {
	return RuleExpr{Kind: ExprMeter, Set: set, Fields: []RuleField{f}, Rate: rate, Burst: burst, Over: over}
}

func nftOnly(text string) RuleExpr { return RuleExpr{Kind: ExprNft, Text: text} }

// ruleEnd is what a rule does once its matches hold: count (or not),
// then its verdict.
type ruleEnd struct {
	counter bool
	v       RuleVerdict
}

func counted(v RuleVerdict) ruleEnd { return ruleEnd{counter: true, v: v} }
func plain(v RuleVerdict) ruleEnd   { return ruleEnd{v: v} }

// exprs returns the matches followed by the end's statements (a new
// slice).
func (e ruleEnd) exprs(matches []RuleExpr) []RuleExpr {
	n := len(matches)
	if e.counter {
		n++
	}
	out := make([]RuleExpr, 0, n)
	out = append(out, matches...)
	if e.counter {
		out = append(out, counter())
	}
	return out
}

// mkRule is a rule of matches ending in end, commented (none for "").
func mkRule(matches []RuleExpr, end ruleEnd, comment string) TableRule {
	r := TableRule{Exprs: end.exprs(matches), Verdict: end.v}
	if comment != "" {
		r.Comment = truncComment(comment)
	}
	return r
}
