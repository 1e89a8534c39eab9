package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// randomElement is an element of a random shape from a small pool of
// values, so that keys repeat: addresses of both families, ranges,
// protocols, ports and port ranges.
func randomElement(r *rand.Rand, i int) Element {
	addrs := []string{"10.0.0.1", "10.0.0.10", "10.0.0.2", "10.0.0.0", "fd00::1", "fd00::1:0", "::ffff:10.0.0.1"}
	ends := []string{"10.0.0.9", "10.0.0.255", "fd00::ffff"}
	protos := []Protocol{ProtoTCP, ProtoUDP, ProtoSCTP, 1, 200}
	ports := [][2]uint16{{80, 80}, {8080, 8080}, {1, 1024}, {443, 443}, {80, 90}}
	e := Element{Addr: netip.MustParseAddr(addrs[r.IntN(len(addrs))]), Shape: Shape(r.IntN(int(ShapePorts) + 1)),
		Comment: ptr(fmt.Sprint("emitted ", i))}
	p := ports[r.IntN(len(ports))]
	e.Ports = PortRange{Protocol: protos[r.IntN(len(protos))], First: p[0], Last: p[1]}
	if e.Shape == ShapeAddrProtoPort {
		e.Ports.Last = e.Ports.First
	}
	if end := netip.MustParseAddr(ends[r.IntN(len(ends))]); e.Shape == ShapeAddr && r.IntN(2) == 0 && e.Addr.Is4() == end.Is4() && e.Addr.Less(end) {
		e.Last = &end
	}
	if r.IntN(2) == 0 {
		e.Verdict, e.Chain = VerdictGoto, fmt.Sprint("c", i)
	}
	return e
}

// TestSortElementsIsStableSortAndDedup checks the in-place sort against
// its definition: a stable sort by compareElements (the order the tracker
// inserts in), then the first of each run of equal keys. The keys mix
// shapes, addresses of both families, ranges and ports, with duplicates
// that differ in value and comment.
func TestSortElementsIsStableSortAndDedup(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		n := r.IntN(60)
		var es []Element
		for i := 0; i < n; i++ {
			es = append(es, randomElement(r, i))
		}
		want := slices.Clone(es)
		slices.SortStableFunc(want, func(a, b Element) int { return compareElements(&a, &b) })
		want = slices.CompactFunc(want, func(a, b Element) bool { return a.SameKey(&b) })
		got := sortElements(slices.Clone(es))
		if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
			t.Fatalf("round %d: sortElements differs from a stable sort (-want +got):\n%s", round, diff)
		}
	}
}

// TestElementSorterReusesScratch sorts sets of different sizes and shapes
// with one sorter, as render does: what an earlier set left in the
// scratch space must not leak into a later set's order.
func TestElementSorterReusesScratch(t *testing.T) {
	var so elementSorter
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	wide := []Element{
		{Addr: a("10.0.0.2"), Ports: PortRange{ProtoTCP, 80, 80}, Shape: ShapeAddrProtoPort},
		{Addr: a("10.0.0.1"), Ports: PortRange{ProtoUDP, 53, 53}, Shape: ShapeAddrProtoPort},
		{Addr: a("10.0.0.1"), Ports: PortRange{ProtoTCP, 8080, 8080}, Shape: ShapeAddrProtoPort},
	}
	narrow := []Element{AddrElement(a("10.0.0.9"), nil), AddrElement(a("10.0.0.10"), nil)}
	so.sort(wide)
	got := so.sort(narrow)
	want := []Element{AddrElement(a("10.0.0.9"), nil), AddrElement(a("10.0.0.10"), nil)}
	if diff := cmp.Diff(ids(want), ids(got)); diff != "" {
		t.Errorf("second set (-want +got):\n%s", diff)
	}
}

// TestElementText checks each shape's text, as nft reads it, and that
// sorting orders keys as their texts sort field by field: addresses and
// ports by number, protocols by name, a tie of starts by the text.
func TestElementText(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	rg := func(from, to string) Element { return RangeElement(IPRange{From: a(from), To: a(to)}) }
	for _, tc := range []struct {
		e    Element
		want string
	}{
		{AddrElement(a("10.0.0.1"), nil), "10.0.0.1"},
		{rg("10.0.0.0", "10.0.0.255"), "10.0.0.0/24"},
		{rg("10.0.0.1", "10.0.0.9"), "10.0.0.1-10.0.0.9"},
		{rg("fd00::", "fd00::ffff"), "fd00::/112"},
		{Element{Addr: a("fd00::1"), Shape: ShapeAddrAddr}, "fd00::1 . fd00::1"},
		{Element{Addr: a("10.0.0.1"), Ports: PortRange{ProtoTCP, 80, 80}, Shape: ShapeAddrProtoPort}, "10.0.0.1 . tcp . 80"},
		{Element{Ports: PortRange{ProtoSCTP, 1, 1024}, Shape: ShapeProtoPorts}, "sctp . 1-1024"},
		{Element{Ports: PortRange{200, 53, 53}, Shape: ShapeProtoPorts, Verdict: VerdictAccept}, "200 . 53 : accept"},
		{Element{Ports: PortRange{First: 8080, Last: 8080}, Shape: ShapePorts}, "8080"},
	} {
		if got := tc.e.Text(); got != tc.want {
			t.Errorf("%+v: text %q, want %q", tc.e, got, tc.want)
		}
	}
	ordered := []Element{
		AddrElement(a("10.0.0.2"), nil), rg("10.0.0.10", "10.0.0.11"), AddrElement(a("fd00::1"), nil),
	}
	ports := []Element{
		{Ports: PortRange{200, 9, 9}, Shape: ShapeProtoPorts},
		{Ports: PortRange{ProtoSCTP, 80, 80}, Shape: ShapeProtoPorts},
		{Ports: PortRange{ProtoTCP, 9, 9}, Shape: ShapeProtoPorts},
		{Ports: PortRange{ProtoTCP, 80, 80}, Shape: ShapeProtoPorts},
		{Ports: PortRange{ProtoTCP, 80, 90}, Shape: ShapeProtoPorts},
		{Ports: PortRange{ProtoUDP, 1, 1}, Shape: ShapeProtoPorts},
	}
	for _, want := range [][]Element{ordered, ports} {
		got := slices.Clone(want)
		slices.Reverse(got)
		if got = sortElements(got); !slices.EqualFunc(got, want, func(x, y Element) bool { return x.SameKey(&y) }) {
			t.Errorf("sorted %v, want %v", texts(got), texts(want))
		}
	}
}

func texts(es []Element) []string {
	out := make([]string, len(es))
	for i := range es {
		out[i] = es[i].Text()
	}
	return out
}

// ids are the elements' identities (key, value and comment).
func ids(es []Element) []string {
	out := make([]string, len(es))
	for i := range es {
		out[i] = ElementID(&es[i])
	}
	return out
}
