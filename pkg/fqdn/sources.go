package fqdn

import (
	"net/netip"
	"sync/atomic"
)

// Sources are the DNS servers whose replies may be learned: fixed prefixes
// (--dns-servers) and the cluster DNS service's endpoints, which the agent
// replaces as they change. Safe for concurrent use; Contains does not
// block.
type Sources struct {
	static    []netip.Prefix
	endpoints atomic.Pointer[map[netip.Addr]struct{}]
}

// NewSources returns sources trusting the prefixes (single addresses are
// /32 or /128 prefixes).
func NewSources(static []netip.Prefix) *Sources {
	s := &Sources{static: static}
	s.SetEndpoints(nil)
	return s
}

// SetEndpoints replaces the trusted endpoint addresses.
func (s *Sources) SetEndpoints(addrs []netip.Addr) {
	m := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		m[a.Unmap()] = struct{}{}
	}
	s.endpoints.Store(&m)
}

// Contains reports whether replies from a may be learned.
func (s *Sources) Contains(a netip.Addr) bool {
	a = a.Unmap()
	if _, ok := (*s.endpoints.Load())[a]; ok {
		return true
	}
	for _, p := range s.static {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
