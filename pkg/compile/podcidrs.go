package compile

import (
	"net/netip"
	"slices"
	"strings"
)

// podCIDRs returns the pod address ranges of the input: the override when
// given, else every Node's spec.podCIDRs (spec.podCIDR on old objects).
// Unparsable entries are skipped: a Node object is not the place to fail
// a build, and an unparsed range only means its new pods are not held back.
func podCIDRs(in Input) []netip.Prefix {
	var out []netip.Prefix
	if len(in.PodCIDRs) > 0 {
		out = append(out, in.PodCIDRs...)
	} else {
		for _, n := range in.Nodes {
			cidrs := n.Spec.PodCIDRs
			if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
				cidrs = []string{n.Spec.PodCIDR}
			}
			for _, c := range cidrs {
				if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return normalizePrefixes(out)
}

// normalizePrefixes masks, sorts and deduplicates prefixes and drops those
// inside another one.
func normalizePrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if q := netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked(); p.IsValid() && q.IsValid() {
			out = append(out, q)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var res []netip.Prefix
	for _, p := range out {
		// Sorted by address, then by length: a prefix covering p, if any,
		// is the last one kept.
		if n := len(res); n > 0 && res[n-1].Contains(p.Addr()) && res[n-1].Bits() <= p.Bits() {
			continue
		}
		res = append(res, p)
	}
	return res
}

// unmapBits is how many bits an IPv4-mapped IPv6 prefix loses when unmapped.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// InPodCIDRs reports whether ip lies in one of the cluster's pod ranges.
func (p *Program) InPodCIDRs(ip netip.Addr) bool {
	for _, c := range p.PodCIDRs {
		if c.Contains(ip) {
			return true
		}
	}
	return false
}

// IsUnknownPodAddr reports whether ip is in the pod ranges but neither a
// pod nor a node of the program holds it: most likely a pod that was
// started before the agent learned about it. The ruleset queues such
// connections (known-pods, pod-cidrs sets) and the evaluator holds them
// until a program that knows the address is published.
func (p *Program) IsUnknownPodAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if len(p.PodCIDRs) == 0 || !p.InPodCIDRs(ip) {
		return false
	}
	if _, ok := p.PodByIP(ip); ok {
		return false
	}
	return !p.isAnyNodeAddr(ip)
}

func (p *Program) isAnyNodeAddr(ip netip.Addr) bool {
	if p.IsNodeIP(ip) {
		return true
	}
	for _, addrs := range p.NodeAddrs {
		if slices.Contains(addrs, ip) {
			return true
		}
	}
	return false
}
