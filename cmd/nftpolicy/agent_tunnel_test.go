package main

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

// TestTunnelFlags: the default ports are the VXLAN and Geneve ones; an
// empty --tunnel-udp-ports means none (a non-nil empty list, not the
// defaults); --tunnel-peers takes prefixes and single addresses; port 0,
// ports past 65535 and bad peers are refused.
func TestTunnelFlags(t *testing.T) {
	parse := func(args ...string) ([]uint16, []string, error) {
		o := &agentOptions{}
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o.addFlags(fs)
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if err := o.cfg.Validate(); err != nil {
			return nil, nil, err
		}
		o.applyConfig()
		ports, peers, err := o.tunnel.parse()
		var ps []string
		for _, p := range peers {
			ps = append(ps, p.String())
		}
		return ports, ps, err
	}
	ports, peers, err := parse()
	if err != nil || !slices.Equal(ports, []uint16{4789, 6081, 8472}) || peers != nil {
		t.Errorf("defaults: %v %v %v", ports, peers, err)
	}
	ports, _, err = parse("--tunnel-udp-ports=")
	if err != nil || ports == nil || len(ports) != 0 {
		t.Errorf("empty: %#v %v", ports, err)
	}
	ports, peers, err = parse("--tunnel-udp-ports=4789,7000", "--tunnel-peers=198.51.100.0/24,203.0.113.9,2001:db8::1")
	if err != nil || !slices.Equal(ports, []uint16{4789, 7000}) || !slices.Equal(peers, []string{"198.51.100.0/24", "203.0.113.9/32", "2001:db8::1/128"}) {
		t.Errorf("set: %v %v %v", ports, peers, err)
	}
	for _, bad := range [][]string{{"--tunnel-udp-ports=0"}, {"--tunnel-udp-ports=65536"}, {"--tunnel-peers=nope"}} {
		if _, _, err := parse(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
