package nftnl

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

func set(typ string, flags ...knftables.SetFlag) *compile.Set {
	return &compile.Set{Key: keyOf(typ), Set: &knftables.Set{Name: "s", Type: typ, Flags: flags}}
}

func ptrStr(s string) *string { return &s }

// The byte layouts below are what "nft --debug=netlink add element" prints
// for the same text with nft 1.0.6.
func TestElementEncoding(t *testing.T) {
	interval := knftables.IntervalFlag
	for _, tc := range []struct {
		name string
		set  *compile.Set
		el   knftables.Element
		want []refElement
	}{{
		name: "address with comment",
		set:  set("ipv4_addr"),
		el:   knftables.Element{Key: []string{"10.1.2.3"}, Comment: ptrStr("x/a")},
		want: []refElement{{key: []byte{10, 1, 2, 3}, udata: []byte{0, 4, 'x', '/', 'a', 0}}},
	}, {
		name: "concatenation pads every field to 4 bytes",
		set:  set("ipv4_addr . inet_proto . inet_service"),
		el:   knftables.Element{Key: []string{"10.1.2.3", "tcp", "80"}},
		want: []refElement{{key: []byte{10, 1, 2, 3, 6, 0, 0, 0, 0, 80, 0, 0}}},
	}, {
		name: "one-field key is not padded",
		set:  set("inet_service"),
		el:   knftables.Element{Key: []string{"8080"}},
		want: []refElement{{key: []byte{0x1f, 0x90}}},
	}, {
		name: "interval: start and the value after the end",
		set:  set("ipv4_addr", interval),
		el:   knftables.Element{Key: []string{"10.0.0.0/8"}, Comment: ptrStr("x")},
		want: []refElement{
			{key: []byte{10, 0, 0, 0}, udata: []byte{0, 2, 'x', 0}},
			{key: []byte{11, 0, 0, 0}, flags: 1},
		},
	}, {
		name: "interval: a range with a carry",
		set:  set("ipv4_addr", interval),
		el:   knftables.Element{Key: []string{"192.168.1.1-192.168.1.255"}},
		want: []refElement{
			{key: []byte{192, 168, 1, 1}},
			{key: []byte{192, 168, 2, 0}, flags: 1},
		},
	}, {
		name: "interval ending at the largest address is open",
		set:  set("ipv4_addr", interval),
		el:   knftables.Element{Key: []string{"255.255.255.0/24"}},
		want: []refElement{{key: []byte{255, 255, 255, 0}, udata: []byte{1, 4, 1, 0, 0, 0}}},
	}, {
		name: "concatenated interval: key and key end",
		set:  set("inet_proto . inet_service", interval),
		el:   knftables.Element{Key: []string{"udp", "53-60"}},
		want: []refElement{{key: []byte{17, 0, 0, 0, 0, 53, 0, 0}, keyEnd: []byte{17, 0, 0, 0, 0, 60, 0, 0}}},
	}, {
		name: "concatenated interval: a single value has key end = key",
		set:  set("inet_proto . inet_service", interval),
		el:   knftables.Element{Key: []string{"tcp", "8080"}},
		want: []refElement{{key: []byte{6, 0, 0, 0, 0x1f, 0x90, 0, 0}, keyEnd: []byte{6, 0, 0, 0, 0x1f, 0x90, 0, 0}}},
	}, {
		name: "verdict map",
		set:  &compile.Set{Key: keyOf("ipv6_addr : verdict"), Map: &knftables.Map{Name: "m", Type: "ipv6_addr : verdict"}},
		el:   knftables.Element{Key: []string{"fd00::1"}, Value: []string{"goto ingress-x"}},
		want: []refElement{{key: []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, hasVerdict: true, verdict: -4, chain: "ingress-x"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := LayoutOf(tc.set)
			if err != nil {
				t.Fatal(err)
			}
			te := mustTyped(t, tc.set, &tc.el)
			var out [2]Element
			n, err := l.encode(&te, false, &out)
			if err != nil {
				t.Fatal(err)
			}
			got := out[:n]
			if len(got) != len(tc.want) {
				t.Fatalf("got %d elements %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				g, w := &got[i], tc.want[i]
				if !bytes.Equal(g.key(), w.key) || !bytes.Equal(g.keyEnd(), w.keyEnd) || g.flags != w.flags ||
					!bytes.Equal(g.appendUdata(nil), w.udata) || g.hasVerdict != w.hasVerdict || g.verdict != w.verdict || g.chain != w.chain {
					t.Errorf("element %d: got key %x keyEnd %x flags %d udata %x verdict %v %d %q, want %+v", i,
						g.key(), g.keyEnd(), g.flags, g.appendUdata(nil), g.hasVerdict, g.verdict, g.chain, w)
				}
			}
			// A deletion carries the keys and flags only.
			var del [2]Element
			nd, err := l.encode(&te, true, &del)
			if err != nil {
				t.Fatal(err)
			}
			if nd != n {
				t.Errorf("deletion: %d elements, addition %d", nd, n)
			}
			for i := range nd {
				d := &del[i]
				if d.appendUdata(nil) != nil || d.hasVerdict || !bytes.Equal(d.key(), got[i].key()) || d.flags != got[i].flags {
					t.Errorf("deletion element %d: %+v", i, d)
				}
			}
		})
	}
}

func TestElementEncodingErrors(t *testing.T) {
	interval := knftables.IntervalFlag
	vmap := &compile.Set{Key: keyOf("ipv4_addr : verdict"), Map: &knftables.Map{Name: "m", Type: "ipv4_addr : verdict"}}
	a := netip.MustParseAddr
	addr := func(s string) compile.Element { return compile.AddrElement(a(s), nil) }
	rg := func(from, to string) compile.Element {
		e := addr(from)
		last := a(to)
		e.Last = &last
		return e
	}
	withValue := func(e compile.Element, k compile.VerdictKind, chain string) compile.Element {
		e.Verdict, e.Chain = k, chain
		return e
	}
	withComment := func(e compile.Element, c string) compile.Element { e.Comment = &c; return e }
	ports := func(p compile.Protocol, first, last uint16) compile.Element {
		return compile.Element{Ports: compile.PortRange{Protocol: p, First: first, Last: last}, Shape: compile.ShapeProtoPorts}
	}
	for _, tc := range []struct {
		set  *compile.Set
		el   compile.Element
		want string
	}{
		{set("ipv4_addr"), rg("10.0.0.0", "10.255.255.255"), "without the interval flag"},
		{set("ipv4_addr"), addr("fd00::1"), "not of the set's family"},
		{set("ipv4_addr"), addr("::ffff:10.0.0.1"), "not of the set's family"},
		{set("ipv6_addr"), addr("::ffff:10.0.0.1"), "IPv4-mapped"},
		{set("ipv4_addr . ipv4_addr"), addr("10.0.0.1"), "fields of the set's type"},
		{set("ipv4_addr", interval), rg("10.0.0.9", "10.0.0.1"), "descending"},
		{set("ipv4_addr", interval), rg("10.0.0.1", "fd00::1"), "not of the set's family"},
		{set("inet_proto . inet_service", interval), ports(compile.ProtoTCP, 90, 80), "descending"},
		{set("inet_proto . inet_service"), ports(compile.ProtoTCP, 80, 90), "without the interval flag"},
		{set("ipv4_addr"), withValue(addr("10.0.0.1"), compile.VerdictAccept, ""), "has a value"},
		{set("ipv4_addr . inet_service"), addr("10.0.0.1"), "fields of the set's type"},
		{vmap, withValue(addr("10.0.0.1"), compile.VerdictGoto, ""), "need a chain"},
		{vmap, withValue(addr("10.0.0.1"), compile.VerdictAccept, "x"), "need a chain"},
		{vmap, withValue(addr("10.0.0.1"), compile.VerdictKind(9), ""), "not a verdict"},
		{vmap, withComment(withValue(addr("10.0.0.1"), compile.VerdictAccept, ""), strings.Repeat("c", 200)), "comment longer"},
	} {
		l, err := LayoutOf(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		var out [2]Element
		_, err = l.encode(&tc.el, false, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: error %v, want one containing %q", tc.set.Name(), tc.el.Text(), err, tc.want)
		}
	}
	for _, s := range []*compile.Set{
		set("ether_addr"),
		{Set: &knftables.Set{Name: "s", TypeOf: "ip saddr"}},
		set("ipv4_addr", knftables.TimeoutFlag),
		{Map: &knftables.Map{Name: "m", Type: "ipv4_addr : mark"}},
		// Keys and data longer than the kernel's 64 bytes.
		set("ipv6_addr . ipv6_addr . ipv6_addr . ipv6_addr . inet_service"),
		{Map: &knftables.Map{Name: "m", Type: "ipv4_addr : ipv6_addr . ipv6_addr . ipv6_addr . ipv6_addr . inet_proto"}},
	} {
		if _, err := LayoutOf(s); err == nil {
			t.Errorf("layout of %+v: no error", s)
		}
	}
}
