package nftnl

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestKernelDeclarationsCompared: sets and maps that nft declared from a
// desired declaration read back over netlink as that declaration; kernel
// sets that differ in any way a re-sync must repair (type, flags, timeout,
// size, policy, comment, a typeof key, an element expression) do not.
func TestKernelDeclarationsCompared(t *testing.T) {
	ns, f := scratchNetns(t)
	const table = "decls"
	set := func(name, typ string, flags ...knftables.SetFlag) *compile.Set {
		return &compile.Set{Key: keyOf(typ), Set: &knftables.Set{Name: name, Type: typ, Flags: flags, Comment: knftables.PtrTo("comment of " + name)}}
	}
	hour := time.Hour
	same := []*compile.Set{
		set("v4", "ipv4_addr"),
		set("v6-ranges", "ipv6_addr", knftables.IntervalFlag),
		set("named", "ipv4_addr . inet_proto . inet_service"),
		set("ports", "inet_proto . inet_service", knftables.IntervalFlag),
		set("self", "ipv6_addr . ipv6_addr"),
		set("learned", "ipv4_addr . ipv4_addr", knftables.TimeoutFlag),
		{Key: keyOf("inet_service"), Set: &knftables.Set{Name: "no-comment", Type: "inet_service", Timeout: &hour, Flags: []knftables.SetFlag{knftables.TimeoutFlag}}},
		{Key: keyOf("ipv4_addr"), Map: &knftables.Map{Name: "verdicts", Type: "ipv4_addr : verdict", Comment: knftables.PtrTo("pods")}},
	}
	text := "add table inet " + table + "\n"
	for _, s := range same {
		text += declText(table, s)
	}
	// Kernel declarations that differ from the desired one of their name.
	differ := map[string]*compile.Set{
		"other-type":    set("other-type", "ipv4_addr"),
		"other-flags":   set("other-flags", "ipv4_addr"),
		"other-comment": set("other-comment", "ipv4_addr"),
		"no-comment-k":  set("no-comment-k", "ipv4_addr"),
		"typeof-key":    set("typeof-key", "ipv4_addr"),
		"sized":         set("sized", "ipv4_addr"),
		"memory":        set("memory", "ipv4_addr"),
		"counted":       set("counted", "ipv4_addr"),
		"other-timeout": {Key: keyOf("inet_service"), Set: &knftables.Set{Name: "other-timeout", Type: "inet_service", Timeout: &hour, Flags: []knftables.SetFlag{knftables.TimeoutFlag}}},
		"a-set-not-map": {Key: keyOf("ipv4_addr"), Map: &knftables.Map{Name: "a-set-not-map", Type: "ipv4_addr : verdict"}},
		"other-data":    {Key: keyOf("ipv4_addr"), Map: &knftables.Map{Name: "other-data", Type: "ipv4_addr : verdict"}},
		"other-concat":  set("other-concat", "ipv4_addr . inet_service"),
	}
	text += `add set inet decls other-type { type ipv6_addr ; comment "comment of other-type" ; }
add set inet decls other-flags { type ipv4_addr ; flags interval ; comment "comment of other-flags" ; }
add set inet decls other-comment { type ipv4_addr ; comment "another comment" ; }
add set inet decls no-comment-k { type ipv4_addr ; }
add set inet decls typeof-key { typeof ip saddr ; comment "comment of typeof-key" ; }
add set inet decls sized { type ipv4_addr ; size 100 ; comment "comment of sized" ; }
add set inet decls memory { type ipv4_addr ; policy memory ; comment "comment of memory" ; }
add set inet decls counted { type ipv4_addr ; counter ; comment "comment of counted" ; }
add set inet decls other-timeout { type inet_service ; flags timeout ; timeout 2h ; }
add set inet decls a-set-not-map { type ipv4_addr ; }
add map inet decls other-data { type ipv4_addr : ipv4_addr ; }
add set inet decls other-concat { type ipv4_addr . inet_proto ; comment "comment of other-concat" ; }
`
	nftIn(t, ns, text, "-f", "-")
	w := NewConn(table, int(f.Fd()))
	t.Cleanup(func() { w.Close() })
	_, decls, err := w.ListTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range same {
		k := decls[s.Name()]
		if k == nil {
			t.Errorf("%s: not listed", s.Name())
		} else if !k.Matches(s) {
			t.Errorf("%s: the kernel's declaration %+v does not compare equal to the one nft wrote it from", s.Name(), *k)
		}
	}
	for n, s := range differ {
		k := decls[n]
		if k == nil {
			t.Errorf("%s: not listed", n)
		} else if k.Matches(s) {
			t.Errorf("%s: the kernel's declaration %+v compares equal to a different desired one", n, *k)
		}
	}
}

// declText is the nft command that declares s, as knftables writes it.
func declText(table string, s *compile.Set) string {
	nft := knftables.NewFake(knftables.InetFamily, table)
	tx := nft.NewTransaction()
	s.AddTo(tx)
	return tx.String()
}
