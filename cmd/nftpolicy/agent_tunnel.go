package main

import (
	"fmt"
	"net/netip"
	"strings"
)

// tunnelOptions are the flags of the tunnel check (pkg/compile
// render_source.go): which UDP ports are overlay encapsulation, and which
// sources besides the Nodes' addresses may send it to this node.
type tunnelOptions struct {
	udpPorts []uint16
	peers    []string
}

// parse validates the flags. An empty port list is a non-nil empty slice:
// no UDP ports (nil would mean the defaults).
func (o *tunnelOptions) parse() ([]uint16, []netip.Prefix, error) {
	ports := []uint16{}
	for _, p := range o.udpPorts {
		if p == 0 {
			return nil, nil, fmt.Errorf("--tunnel-udp-ports: 0 is no port (1-65535)")
		}
		ports = append(ports, p)
	}
	var peers []netip.Prefix
	for _, s := range o.peers {
		s = strings.TrimSpace(s)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, nil, fmt.Errorf("--tunnel-peers: %w", err)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		peers = append(peers, p)
	}
	return ports, peers, nil
}
