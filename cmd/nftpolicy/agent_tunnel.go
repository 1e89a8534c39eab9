package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// tunnelOptions are the flags of the tunnel check (pkg/compile
// render_source.go): which UDP ports are overlay encapsulation, and which
// sources besides the Nodes' addresses may send it to this node.
type tunnelOptions struct {
	udpPorts []string
	peers    []string
}

func (o *tunnelOptions) addFlags(fs *pflag.FlagSet) {
	def := make([]string, len(compile.DefaultTunnelUDPPorts))
	for i, p := range compile.DefaultTunnelUDPPorts {
		def[i] = strconv.Itoa(int(p))
	}
	fs.StringSliceVar(&o.udpPorts, "tunnel-udp-ports", def,
		"UDP ports of overlay encapsulation (VXLAN 4789 and Flannel's 8472, Geneve 6081): pods may not send them to nodes, and this node takes them from nodes' addresses and --tunnel-peers only; empty for none (IPIP, 6in4 and GRE are always checked); with --source-validation")
	fs.StringSliceVar(&o.peers, "tunnel-peers", nil,
		"address ranges besides every Node's status addresses that may send encapsulation to this node (tunnel endpoints on other addresses, load balancers delivering IPIP)")
}

// parse validates the flags. An empty port list is a non-nil empty slice:
// no UDP ports (nil would mean the defaults).
func (o *tunnelOptions) parse() ([]uint16, []netip.Prefix, error) {
	ports := []uint16{}
	for _, s := range o.udpPorts {
		p, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
		if err != nil || p == 0 {
			return nil, nil, fmt.Errorf("--tunnel-udp-ports: %q is no port (1-65535)", s)
		}
		ports = append(ports, uint16(p))
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
