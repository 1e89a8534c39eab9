package nftnl

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// ruleSets are the sets the rules below name.
func ruleSets(name string) *compile.Set {
	interval := knftables.IntervalFlag
	switch name {
	case "peers-v4":
		return set("ipv4_addr")
	case "peers-v6":
		return set("ipv6_addr")
	case "ports":
		return set("inet_proto . inet_service", interval)
	case "named-v4":
		return set("ipv4_addr . inet_proto . inet_service")
	case "named-v6":
		return set("ipv6_addr . inet_proto . inet_service")
	case "proto-v4":
		return set("inet_proto . ipv4_addr")
	case "pods-v4":
		return &compile.Set{Key: keyOf("ipv4_addr : verdict"), Map: &knftables.Map{Name: name, Type: "ipv4_addr : verdict"}}
	}
	return nil
}

// exprNames is a rule's expressions as nft --debug=netlink names them, with
// their registers where a concatenation spreads over several.
func exprNames(es []nlExpr) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.name)
		switch e.name {
		case "meta", "payload", "byteorder", "lookup":
			b.WriteString(":" + strconv.Itoa(int(e.reg)))
		}
		if e.inv {
			b.WriteString("!")
		}
		if e.vmap {
			b.WriteString("(vmap)")
		}
	}
	return b.String()
}

func lk(set string, fields ...compile.RuleField) compile.RuleExpr {
	return compile.RuleExpr{Kind: compile.ExprLookup, Set: set, Fields: fields}
}

// The expression sequences of the accepted forms are what nft 1.0.6
// writes (nft --debug=netlink) for the rules' printing (the case's text);
// the kernel test compares them with nft's for every golden ruleset.
// Everything else is refused, so the sync goes through nft.
func TestRuleExprs(t *testing.T) {
	const (
		v4s, v4d = compile.FieldIPSaddr, compile.FieldIPDaddr
		v6s, v6d = compile.FieldIP6Saddr, compile.FieldIP6Daddr
		l4, dp   = compile.FieldL4Proto, compile.FieldTHDport
	)
	counter := compile.RuleExpr{Kind: compile.ExprCounter}
	accept := compile.RuleVerdict{Kind: compile.VerdictAccept}
	for _, tc := range []struct {
		text, want string
		rule       compile.TableRule
	}{
		{"ip saddr @peers-v4 counter accept", "meta:1 cmp payload:1 lookup:1 counter immediate",
			compile.TableRule{Exprs: []compile.RuleExpr{lk("peers-v4", v4s), counter}, Verdict: accept}},
		{"ip saddr @peers-v4 meta l4proto . th dport @ports counter accept",
			"meta:1 cmp payload:1 lookup:1 meta:1 byteorder:1 payload:9 lookup:1 counter immediate",
			compile.TableRule{Exprs: []compile.RuleExpr{lk("peers-v4", v4s), lk("ports", l4, dp), counter}, Verdict: accept}},
		{"ip saddr @peers-v4 ip daddr . meta l4proto . th dport @named-v4 counter jump egress-allowed",
			"meta:1 cmp payload:1 lookup:1 payload:1 meta:9 payload:10 lookup:1 counter immediate",
			compile.TableRule{Exprs: []compile.RuleExpr{lk("peers-v4", v4s), lk("named-v4", v4d, l4, dp), counter},
				Verdict: compile.RuleVerdict{Kind: compile.VerdictJump, Chain: "egress-allowed"}}},
		{"ip6 saddr @peers-v6 ip6 daddr . meta l4proto . th dport @named-v6 counter accept",
			"meta:1 cmp payload:1 lookup:1 payload:1 meta:2 payload:13 lookup:1 counter immediate",
			compile.TableRule{Exprs: []compile.RuleExpr{lk("peers-v6", v6s), lk("named-v6", v6d, l4, dp), counter}, Verdict: accept}},
		{"ip daddr != @peers-v4 goto ingress-networkpolicy", "meta:1 cmp payload:1 lookup:1! immediate",
			compile.TableRule{Exprs: []compile.RuleExpr{{Kind: compile.ExprLookup, Set: "peers-v4", Fields: []compile.RuleField{v4d}, Neg: true}},
				Verdict: compile.RuleVerdict{Kind: compile.VerdictGoto, Chain: "ingress-networkpolicy"}}},
		{"ip daddr vmap @pods-v4", "meta:1 cmp payload:1 lookup:1(vmap)",
			compile.TableRule{Exprs: []compile.RuleExpr{{Kind: compile.ExprVmap, Set: "pods-v4", Fields: []compile.RuleField{v4d}}}}},
		{`limit rate over 20/second burst 20 packets counter log prefix "nftpolicy deny: " group 7`, "limit counter log",
			compile.TableRule{Exprs: []compile.RuleExpr{{Kind: compile.ExprLimit, Rate: 20, Burst: 20, Over: true}, counter,
				{Kind: compile.ExprLog, Prefix: "nftpolicy deny: ", Group: 7}}}},
		{"counter drop", "counter immediate", compile.TableRule{Exprs: []compile.RuleExpr{counter}, Verdict: compile.RuleVerdict{Kind: compile.VerdictDrop}}},
		{"jump ingress-x/allow-web", "immediate", compile.TableRule{Verdict: compile.RuleVerdict{Kind: compile.VerdictJump, Chain: "ingress-x/allow-web"}}},
	} {
		if got := tc.rule.Text(); got != tc.text {
			t.Errorf("printed %q, want %q", got, tc.text)
		}
		got, err := ruleExprs(&tc.rule, ruleSets)
		if err != nil {
			t.Errorf("%q: %v", tc.text, err)
			continue
		}
		if g := exprNames(got); g != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.text, g, tc.want)
		}
	}
	for _, rule := range []compile.TableRule{
		{Exprs: []compile.RuleExpr{{Kind: compile.ExprNft, Text: "ct state established,related"}}, Verdict: accept},
		{Exprs: []compile.RuleExpr{lk("missing", v4s)}, Verdict: accept},
		{Exprs: []compile.RuleExpr{lk("peers-v6", v4s)}, Verdict: accept},                                        // type mismatch
		{Exprs: []compile.RuleExpr{lk("pods-v4", v4s)}, Verdict: accept},                                         // a map without vmap
		{Exprs: []compile.RuleExpr{{Kind: compile.ExprVmap, Set: "peers-v4", Fields: []compile.RuleField{v4s}}}}, // vmap of a set
		{Exprs: []compile.RuleExpr{lk("peers-v4", v4s), lk("peers-v6", v6d)}, Verdict: accept},                   // two network protocols
		{Exprs: []compile.RuleExpr{lk("proto-v4", l4, v4s)}, Verdict: accept},                                    // a protocol check inside a concatenation
		{Exprs: []compile.RuleExpr{lk("peers-v4")}, Verdict: accept},                                             // no field
		{Exprs: []compile.RuleExpr{{Kind: compile.ExprMeter, Set: "m", Fields: []compile.RuleField{v4s}, Rate: 1, Burst: 1}}},
		{Exprs: []compile.RuleExpr{{Kind: compile.ExprNumgen, Mod: 10, Below: 1}}, Verdict: accept},
		{Exprs: []compile.RuleExpr{{Kind: compile.ExprKind(200)}}, Verdict: accept},
		{Exprs: []compile.RuleExpr{lk("peers-v4", compile.RuleField(99))}, Verdict: accept},
	} {
		if _, err := ruleExprs(&rule, ruleSets); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: err %v, want ErrUnsupported", rule.Text(), err)
		}
	}
	for _, v := range []compile.RuleVerdict{{Kind: compile.VerdictJump}, {Kind: compile.VerdictAccept, Chain: "x"}, {Kind: compile.VerdictKind(42)}} {
		r := compile.TableRule{Verdict: v}
		if _, err := ruleExprs(&r, ruleSets); err == nil {
			t.Errorf("verdict %+v encoded", v)
		}
	}
}
