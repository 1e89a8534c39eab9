package compile_test

import (
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestSourceValidation: in every mode the source check is a prerouting
// base chain at priority raw (before conntrack, forward and input), whose
// neighbour discovery rule comes before the drop (DAD's source is ::);
// forward and input do not change; NoSourceValidation leaves the chain out.
func TestSourceValidation(t *testing.T) {
	const check = "fib saddr . iif oif missing counter drop"
	for _, cfg := range []compile.RenderConfig{{Mode: compile.ModeHybrid}, {Mode: compile.ModeKernel}, {Mode: compile.ModeQueue}, {Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat}} {
		for _, sc := range []string{"testdata/golden/cluster-tiers.yaml", "testdata/golden/egress-dualstack.yaml"} {
			name := string(cfg.Mode) + " " + sc
			rs := renderScenarioRuleset(t, sc, cfg)
			c := rs.Chains[compile.ChainPrerouting]
			if c == nil {
				t.Fatalf("%s: no %s chain", name, compile.ChainPrerouting)
			}
			if *c.Chain.Hook != knftables.PreroutingHook || *c.Chain.Priority != knftables.RawPriority || *c.Chain.Policy != knftables.AcceptPolicy {
				t.Errorf("%s: chain %+v", name, c.Chain)
			}
			if len(c.Rules) != 4 || !strings.Contains(c.Rules[0].Text(), "nd-neighbor-solicit") || !strings.Contains(c.Rules[1].Text(), check) ||
				c.Rules[1].Comment == nil || !strings.Contains(*c.Rules[1].Comment, "--source-validation=false") ||
				c.Rules[2].Text() != "meta l4proto { ipip, ipv6, gre } jump tunnel" || c.Rules[3].Text() != "udp dport { 4789, 6081, 8472 } jump tunnel" {
				t.Errorf("%s: prerouting rules %+v", name, c.Rules)
			}
			checkTunnelChain(t, name, rs)

			off := cfg
			off.NoSourceValidation = true
			rsOff := renderScenarioRuleset(t, sc, off)
			if rsOff.Chains[compile.ChainPrerouting] != nil || rsOff.Chains[compile.ChainTunnel] != nil || rsOff.Sets[compile.SetNodeAddrsV4] != nil {
				t.Errorf("%s, validation off: the prerouting chain is there", name)
			}
			for _, ch := range []string{compile.ChainForward, compile.ChainInput} {
				on, off := rs.Chains[ch].Rules, rsOff.Chains[ch].Rules
				if len(on) != len(off) {
					t.Errorf("%s: %s differs with and without validation", name, ch)
				}
				for _, r := range off {
					if strings.Contains(r.Text(), "fib ") {
						t.Errorf("%s, validation off: %s has %q", name, ch, r.Text())
					}
				}
			}
		}
	}
}

// checkTunnelChain: the tunnel chain drops, per family, encapsulation from
// pod interfaces to node addresses and encapsulation to this node from
// non-nodes, each counted; node-addrs holds every node's addresses.
func checkTunnelChain(t *testing.T, name string, rs *compile.Ruleset) {
	t.Helper()
	c := rs.Chains[compile.ChainTunnel]
	if c == nil {
		t.Fatalf("%s: no %s chain", name, compile.ChainTunnel)
	}
	want := []string{
		`meta iifkind { "veth", "bridge", "netkit" } ip daddr @node-addrs-v4 counter drop`,
		`meta iifkind { "veth", "bridge", "netkit" } ip daddr @tunnel-senders-v4 counter drop`,
		`meta iifkind { "veth", "bridge", "netkit" } ip6 daddr @node-addrs-v6 counter drop`,
		`meta iifkind { "veth", "bridge", "netkit" } ip6 daddr @tunnel-senders-v6 counter drop`,
		`iifname != "lo" ip saddr != @node-addrs-v4 ip saddr != @tunnel-senders-v4 fib daddr type { local, broadcast, multicast } counter drop`,
		`iifname != "lo" ip6 saddr != @node-addrs-v6 ip6 saddr != @tunnel-senders-v6 fib daddr type { local, broadcast, multicast } counter drop`,
	}
	if len(c.Rules) != len(want) {
		t.Fatalf("%s: tunnel rules %+v", name, c.Rules)
	}
	for i, w := range want {
		if c.Rules[i].Text() != w {
			t.Errorf("%s: tunnel rule %d is %q, want %q", name, i, c.Rules[i].Text(), w)
		}
	}
	for _, s := range []string{compile.SetNodeAddrsV4, compile.SetNodeAddrsV6, compile.SetTunnelPeersV4, compile.SetTunnelPeersV6} {
		if rs.Sets[s] == nil {
			t.Errorf("%s: no set %s", name, s)
		}
	}
}

// TestTunnelConfig: the tunnel check's UDP ports follow the configuration
// (none: only the IP protocols jump to the tunnel chain), port 0 is
// refused, and --tunnel-peers and every node's addresses (IPv4 and IPv6,
// this node's too) are in node-addrs, each once.
func TestTunnelConfig(t *testing.T) {
	const sc = "testdata/golden/cluster-tiers.yaml"
	rs := renderScenarioRuleset(t, sc, compile.RenderConfig{Mode: compile.ModeHybrid, TunnelUDPPorts: []uint16{}})
	for _, r := range rs.Chains[compile.ChainPrerouting].Rules {
		if strings.Contains(r.Text(), "udp dport") {
			t.Errorf("no tunnel ports configured, yet %q", r.Text())
		}
	}
	rs = renderScenarioRuleset(t, sc, compile.RenderConfig{Mode: compile.ModeKernel, TunnelUDPPorts: []uint16{7777, 53, 7777},
		TunnelPeers: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("198.51.100.7/32")}})
	if got := rs.Chains[compile.ChainPrerouting].Rules[3].Text(); got != "udp dport { 53, 7777 } jump tunnel" {
		t.Errorf("prerouting's UDP rule is %q", got)
	}
	str := func(set string) []string {
		var out []string
		for _, e := range rs.Sets[set].Elements {
			out = append(out, e.Addr.String()+"-"+e.LastAddr().String())
		}
		return out
	}
	for set, want := range map[string]string{
		compile.SetNodeAddrsV4:   "192.168.0.1-192.168.0.1 192.168.0.2-192.168.0.2",
		compile.SetNodeAddrsV6:   "",
		compile.SetTunnelPeersV4: "198.51.100.0-198.51.100.255",
		compile.SetTunnelPeersV6: "2001:db8:1::-2001:db8:1:ffff:ffff:ffff:ffff:ffff",
	} {
		if got := strings.Join(str(set), " "); got != want {
			t.Errorf("%s %q, want %q", set, got, want)
		}
	}
	if _, err := compile.Render(&compile.Program{}, compile.RenderConfig{TunnelUDPPorts: []uint16{0}}); err == nil {
		t.Errorf("tunnel port 0 accepted")
	}
}

// TestUnknownLocalSources: without pod ranges, hybrid and queue mode drop a
// new connection from an unknown source on a pod interface, except on the
// configured uplinks; with ranges, in kernel mode and with unknown pods
// off, there is no such rule; a bad uplink name is refused.
func TestUnknownLocalSources(t *testing.T) {
	const drop = `meta iifkind { "veth", "bridge", "netkit" } iifname != "eth0" iifname != "ext*" ip saddr != @known-pods-v4 counter drop`
	has := func(rs *compile.Ruleset) bool {
		for _, r := range rs.Chains[compile.ChainForward].Rules {
			if strings.Contains(r.Text(), "saddr != @known-pods") && strings.HasSuffix(r.Text(), "counter drop") {
				return true
			}
		}
		return false
	}
	up := []string{"eth0", "ext*"}
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		rs := renderScenarioRuleset(t, "testdata/golden/egress-dualstack.yaml", compile.RenderConfig{Mode: mode, UplinkIfaces: up})
		found := false
		for _, r := range rs.Chains[compile.ChainForward].Rules {
			found = found || r.Text() == drop
		}
		if !found {
			t.Errorf("%s, no ranges: no rule %q", mode, drop)
		}
		if has(renderScenarioRuleset(t, "testdata/golden/cluster-tiers.yaml", compile.RenderConfig{Mode: mode, UplinkIfaces: up})) {
			t.Errorf("%s, ranges known: the drop rule is there", mode)
		}
		if has(renderScenarioRuleset(t, "testdata/golden/egress-dualstack.yaml", compile.RenderConfig{Mode: mode, SkipUnknownPods: true})) {
			t.Errorf("%s, unknown pods off: the drop rule is there", mode)
		}
	}
	if has(renderScenarioRuleset(t, "testdata/golden/egress-dualstack.yaml", compile.RenderConfig{Mode: compile.ModeKernel})) {
		t.Errorf("kernel mode: the drop rule is there")
	}
	for _, bad := range []string{`eth0" accept`, "", "averyveryverylongname0", "e*th"} {
		if _, err := compile.Render(&compile.Program{}, compile.RenderConfig{UplinkIfaces: []string{bad}}); err == nil {
			t.Errorf("uplink %q accepted", bad)
		}
	}
}
