package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// IPRange is an inclusive range of addresses of one family.
type IPRange struct {
	From, To netip.Addr
}

// Contains reports whether ip lies in the range.
func (r IPRange) Contains(ip netip.Addr) bool {
	return r.From.Compare(ip) <= 0 && ip.Compare(r.To) <= 0
}

// String renders the range the way nft prints interval elements: a prefix
// where the range is exactly one, a single address, or "from-to".
func (r IPRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	if p, ok := r.prefix(); ok {
		return p.String()
	}
	return r.From.String() + "-" + r.To.String()
}

func (r IPRange) prefix() (netip.Prefix, bool) {
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits).Masked()
		if p.Addr() != r.From {
			continue
		}
		if lastAddr(p) == r.To {
			return p, true
		}
		if lastAddr(p).Compare(r.To) < 0 {
			return netip.Prefix{}, false
		}
	}
	return netip.Prefix{}, false
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	b := a.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

func prefixRange(p netip.Prefix) IPRange {
	p = p.Masked()
	return IPRange{From: p.Addr(), To: lastAddr(p)}
}

// normalizeRanges sorts ranges and merges overlapping or adjacent ones, so
// that the result is disjoint, as nftables interval sets require.
func normalizeRanges(in []IPRange) []IPRange {
	if len(in) == 0 {
		return nil
	}
	rs := append([]IPRange(nil), in...)
	sort.Slice(rs, func(i, j int) bool {
		if c := rs[i].From.Compare(rs[j].From); c != 0 {
			return c < 0
		}
		return rs[i].To.Compare(rs[j].To) < 0
	})
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if r.From.Is4() == last.To.Is4() {
			next := last.To.Next()
			if r.From.Compare(last.To) <= 0 || (next.IsValid() && next == r.From) {
				if r.To.Compare(last.To) > 0 {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// blockRanges turns an ipBlock into disjoint sorted ranges: the CIDR minus
// its exceptions. It sorts the exceptions once and subtracts them in one
// sweep, O(n log n) in their number whatever their order, overlaps or
// nesting: an ipBlock is written by namespace users, and one with tens of
// thousands of exceptions must not stall the build. Exceptions of the other
// family are ignored and those reaching outside the CIDR are clipped to it
// (the caller has validated that every exception lies strictly in the CIDR
// and reports those that do not).
func blockRanges(cidr netip.Prefix, except []netip.Prefix) []IPRange {
	whole := prefixRange(cidr)
	if len(except) == 0 {
		return []IPRange{whole}
	}
	holes := make([]IPRange, 0, len(except))
	for _, e := range except {
		if e.Addr().Is4() == whole.From.Is4() {
			holes = append(holes, prefixRange(e))
		}
	}
	slices.SortFunc(holes, func(a, b IPRange) int { return a.From.Compare(b.From) })
	var out []IPRange
	next := whole.From // the first address not yet decided
	for _, h := range holes {
		if h.To.Less(next) || whole.To.Less(h.From) {
			continue // already removed, or outside the CIDR
		}
		if next.Less(h.From) {
			out = append(out, IPRange{From: next, To: h.From.Prev()})
		}
		if !h.To.Less(whole.To) {
			return out // the hole reaches the CIDR's end
		}
		next = h.To.Next()
	}
	return append(out, IPRange{From: next, To: whole.To})
}

// rangesContain reports whether ip lies in one of the sorted disjoint ranges.
func rangesContain(rs []IPRange, ip netip.Addr) bool {
	i := sort.Search(len(rs), func(i int) bool { return ip.Compare(rs[i].To) <= 0 })
	return i < len(rs) && rs[i].From.Compare(ip) <= 0
}

// RangesContain reports whether ip lies in one of the sorted disjoint ranges
// of a rule's IPBlocks.
func RangesContain(rs []IPRange, ip netip.Addr) bool { return rangesContain(rs, ip) }

// parseCIDR parses a CIDR the way the API server accepts it and returns the
// masked prefix; IPv4-mapped IPv6 forms are rejected, as the API does.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("must be a valid CIDR (e.g. 10.0.0.0/8 or 2001:db8::/32): %q", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("must be a plain IPv4 or IPv6 CIDR, not IPv4-mapped IPv6: %q", s)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("must not have a zone: %q", s)
	}
	return p.Masked(), nil
}

// appendAddr parses s and appends it to out, an IPv4-mapped address as
// IPv4, unless it is unparsable or already there. Pod and node addresses
// are read this way.
func appendAddr(out []netip.Addr, s string) []netip.Addr {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return out
	}
	a = a.Unmap()
	for _, x := range out {
		if x == a {
			return out
		}
	}
	return append(out, a)
}
