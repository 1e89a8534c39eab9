package compile

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// subtractEach is the former blockRanges, kept as a reference: the CIDR's
// range minus each exception in turn (O(n) per exception).
func subtractEach(cidr netip.Prefix, except []netip.Prefix) []IPRange {
	rs := []IPRange{prefixRange(cidr)}
	for _, e := range except {
		hole := prefixRange(e)
		var out []IPRange
		for _, r := range rs {
			if r.From.Is4() != hole.From.Is4() || hole.To.Compare(r.From) < 0 || r.To.Compare(hole.From) < 0 {
				out = append(out, r)
				continue
			}
			if r.From.Compare(hole.From) < 0 {
				out = append(out, IPRange{From: r.From, To: hole.From.Prev()})
			}
			if hole.To.Compare(r.To) < 0 {
				out = append(out, IPRange{From: hole.To.Next(), To: r.To})
			}
		}
		rs = out
	}
	return normalizeRanges(rs)
}

// bruteForce lists, address by address, which addresses of cidr (small)
// are in it and in no exception.
func bruteForce(cidr netip.Prefix, except []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for a := cidr.Masked().Addr(); a.IsValid() && cidr.Contains(a); a = a.Next() {
		if !slices.ContainsFunc(except, func(e netip.Prefix) bool { return e.Contains(a) }) {
			out = append(out, a)
		}
	}
	return out
}

// randomBlock is a small random ipBlock: a CIDR of 1-8 host bits near the
// start, the end or the middle of its family's space (the sweep's edges:
// the first and the last address), and up to 12 exceptions inside it,
// overlapping, nested, repeated, in any order.
func randomBlock(r *rand.Rand) (netip.Prefix, []netip.Prefix) {
	v4 := r.IntN(2) == 0
	bitLen := 128
	if v4 {
		bitLen = 32
	}
	host := 1 + r.IntN(8)
	var b [16]byte
	switch r.IntN(3) {
	case 0: // all zeros: the family's first address
	case 1:
		for i := range b {
			b[i] = 0xff
		}
	default:
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	}
	var a netip.Addr
	if v4 {
		a = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		a = netip.AddrFrom16(b)
	}
	cidr := netip.PrefixFrom(a, bitLen-host).Masked()
	var except []netip.Prefix
	for range r.IntN(13) {
		// An address of the CIDR and a longer prefix around it.
		off := r.IntN(1 << host)
		e := cidr.Addr()
		for range off {
			e = e.Next()
		}
		bits := cidr.Bits() + 1 + r.IntN(host)
		except = append(except, netip.PrefixFrom(e, bits).Masked())
	}
	return cidr, except
}

func TestBlockRangesAgainstReferences(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		cidr, except := randomBlock(r)
		got := blockRanges(cidr, except)
		if want := subtractEach(cidr, except); !slices.Equal(got, want) {
			t.Fatalf("case %d: %s except %v:\n got %v\nwant %v (the former algorithm)", i, cidr, except, got, want)
		}
		// Disjoint, sorted, not adjacent (nothing left to merge).
		if n := normalizeRanges(got); !slices.Equal(n, got) {
			t.Fatalf("case %d: %s except %v: %v is not normalized (%v)", i, cidr, except, got, n)
		}
		var addrs []netip.Addr
		for _, rg := range got {
			for a := rg.From; ; a = a.Next() {
				addrs = append(addrs, a)
				if a == rg.To {
					break
				}
			}
		}
		if want := bruteForce(cidr, except); !slices.Equal(addrs, want) {
			t.Fatalf("case %d: %s except %v: ranges %v hold %v, want %v", i, cidr, except, got, addrs, want)
		}
	}
}

// TestBlockRangesIgnoresOutside: exceptions of the other family or outside
// the CIDR (which validation reports, making the peer match nothing) never
// add addresses.
func TestBlockRangesIgnoresOutside(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/30")
	got := blockRanges(cidr, []netip.Prefix{
		netip.MustParsePrefix("2001:db8::/126"), netip.MustParsePrefix("10.0.0.4/30"),
		netip.MustParsePrefix("9.255.255.255/32"), netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("0.0.0.0/0"),
	})
	if len(got) != 0 {
		t.Errorf("10.0.0.0/30 minus 0.0.0.0/0 and others: %v, want nothing", got)
	}
	got = blockRanges(cidr, []netip.Prefix{netip.MustParsePrefix("10.0.0.4/30"), netip.MustParsePrefix("10.0.0.1/32")})
	want := []IPRange{{netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.0.0.0")}, {netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
