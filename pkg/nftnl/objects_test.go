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
		return &compile.Set{Map: &knftables.Map{Name: name, Type: "ipv4_addr : verdict"}}
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

// The expression sequences of the accepted forms are what nft 1.0.6
// writes (nft --debug=netlink); the kernel test compares them with nft's
// for every golden ruleset. Everything else is refused, so the sync goes
// through nft.
func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		rule, want string
	}{
		{"ip saddr @peers-v4 counter accept",
			"meta:1 cmp payload:1 lookup:1 counter immediate"},
		{"ip saddr @peers-v4 meta l4proto . th dport @ports counter accept",
			"meta:1 cmp payload:1 lookup:1 meta:1 byteorder:1 payload:9 lookup:1 counter immediate"},
		{"ip saddr @peers-v4 ip daddr . meta l4proto . th dport @named-v4 counter jump egress-allowed",
			"meta:1 cmp payload:1 lookup:1 payload:1 meta:9 payload:10 lookup:1 counter immediate"},
		{"ip6 saddr @peers-v6 ip6 daddr . meta l4proto . th dport @named-v6 counter accept",
			"meta:1 cmp payload:1 lookup:1 payload:1 meta:2 payload:13 lookup:1 counter immediate"},
		{"ip daddr != @peers-v4 goto ingress-networkpolicy", "meta:1 cmp payload:1 lookup:1! immediate"},
		{"ip daddr vmap @pods-v4", "meta:1 cmp payload:1 lookup:1(vmap)"},
		{`limit rate 20/second burst 20 packets counter log prefix "nftpolicy deny: " group 7`, "limit counter log"},
		{"counter drop", "counter immediate"},
		{"jump ingress-x/allow-web", "immediate"},
	} {
		got, err := parseRule(tc.rule, ruleSets)
		if err != nil {
			t.Errorf("%q: %v", tc.rule, err)
			continue
		}
		if g := exprNames(got); g != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.rule, g, tc.want)
		}
	}
	for _, rule := range []string{
		"ct state established,related accept",
		"meta l4proto tcp accept",
		"ip saddr 10.0.0.1 accept",
		"ip saddr @missing accept",
		"ip saddr @peers-v6 accept",                     // type mismatch
		"ip saddr @pods-v4 accept",                      // a map without vmap
		"ip saddr vmap @peers-v4",                       // vmap of a set
		"ip saddr @peers-v4 ip6 daddr @peers-v6 accept", // two network protocols
		"meta l4proto . ip saddr @proto-v4 accept",      // a protocol check inside a concatenation
		"accept counter",
		"jump",
		"queue to 100",
		`log prefix "a \"b\"" group 7`,
		"ip saddr { 10.0.0.1 } accept",
	} {
		if _, err := parseRule(rule, ruleSets); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: err %v, want ErrUnsupported", rule, err)
		}
	}
}
