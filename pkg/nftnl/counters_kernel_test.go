package nftnl

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRuleCountersMatchNFT: the counters a rule dump reads are those nft's
// own listing shows, with each rule's chain and comment (rules with two
// counters give two, rules without none, another table's none); a table
// that does not exist has none, without an error.
func TestRuleCountersMatchNFT(t *testing.T) {
	ns, f := scratchNetns(t)
	w := NewConn("t", int(f.Fd()))
	defer w.Close()
	ctx := context.Background()
	if got, err := w.RuleCounters(ctx); err != nil || len(got) != 0 {
		t.Fatalf("no table: %v, %v; want none and no error", got, err)
	}
	nftIn(t, ns, `
table inet t {
	set s { type ipv4_addr; elements = { 10.0.0.1, 10.0.0.2, 10.0.0.3 } }
	chain a {
		counter packets 5 bytes 50 comment "x/p ingress[0]"
		ip saddr @s counter packets 7 bytes 70 accept comment "default deny ingress: x/p, y/q"
		accept comment "no counter"
	}
	chain b {
		counter packets 1 bytes 2 counter packets 3 bytes 4
		counter packets 1099511627776 bytes 9 comment "a comment of 128 characters: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	}
}
table inet other {
	chain c {
		counter packets 9 bytes 9 comment "x/other ingress[0]"
	}
}
`, "-f", "-")
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Chain, Comment string
				Expr           []map[string]json.RawMessage
			}
		}
	}
	if err := json.Unmarshal([]byte(nftIn(t, ns, "", "-j", "list", "table", "inet", "t")), &doc); err != nil {
		t.Fatal(err)
	}
	var want []RuleCounter
	index := map[string]int{}
	for _, o := range doc.Nftables {
		if o.Rule == nil {
			continue
		}
		i := index[o.Rule.Chain]
		index[o.Rule.Chain]++
		for _, e := range o.Rule.Expr {
			if raw, ok := e["counter"]; ok {
				var c struct{ Packets, Bytes uint64 }
				if err := json.Unmarshal(raw, &c); err != nil {
					t.Fatal(err)
				}
				want = append(want, RuleCounter{Chain: o.Rule.Chain, Comment: o.Rule.Comment, Index: i, Packets: c.Packets, Bytes: c.Bytes})
			}
		}
	}
	if len(want) != 5 {
		t.Fatalf("nft lists %d counters, the test wrote 5: %+v", len(want), want)
	}
	got, err := w.RuleCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rule counters (-nft +netlink):\n%s", diff)
	}
}
