package redteam

// Encapsulated packets from a pod (issue 43, item 1): on an overlay CNI a
// node decapsulates what anyone sends to its tunnel endpoint, and the inner
// packet, whose source the sender wrote, comes in on the tunnel device,
// which source validation does not check. A pod needs no NET_RAW for it: a
// plain UDP socket sends a VXLAN datagram to its node's (or another node's)
// Flannel port, 8472, whose inner frame carries a UDP datagram "from" a pod
// the victim admits. The tunnel device's MAC, which the inner frame must be
// addressed to, is public (Flannel writes it into the Node's annotations).
// The defence is the ruleset's tunnel check (pkg/compile render_source.go):
// pods may not send encapsulation to nodes, and a node takes it from nodes
// only. Each attack also runs with the check off (the control), where it
// must arrive: the lab's VXLAN devices really decapsulate.

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// tunnelScenario: victims v1 (node-1) and v2 (node-2) admit UDP 9000-9010
// from the friends only (near on node-1, far on node-2); the attacker, on
// node-1, has no policy of its own, so its datagrams to the nodes' tunnel
// port are admitted by policy, and its own datagrams to the victims are
// denied by theirs.
const tunnelScenario = `
namespaces:
  - {name: victim}
  - {name: attacker}
  - {name: friends}
nodes:
  - {name: node-1, ips: [192.168.7.1, "fd00:192:168:7::1"]}
  - {name: node-2, ips: [192.168.7.2, "fd00:192:168:7::2"]}
pods:
  - {namespace: victim, name: v1, labels: {app: v}, ips: [10.244.1.10, "fd00:10:244:1::10"], node: node-1}
  - {namespace: victim, name: v2, labels: {app: v}, ips: [10.244.2.10, "fd00:10:244:2::10"], node: node-2}
  - {namespace: attacker, name: a, labels: {app: a}, ips: [10.244.1.66, "fd00:10:244:1::66"], node: node-1}
  - {namespace: friends, name: near, labels: {app: friend}, ips: [10.244.1.20, "fd00:10:244:1::20"], node: node-1}
  - {namespace: friends, name: far, labels: {app: friend}, ips: [10.244.2.20, "fd00:10:244:2::20"], node: node-2}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: v-in, namespace: victim}
    spec:
      podSelector: {matchLabels: {app: v}}
      ingress:
        - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: friend}}}]
          ports: [{protocol: UDP, port: 9000, endPort: 9010}]
probes:
  - {from: {pod: friends/near}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: friends/far}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: victim/v2}, port: 9000, protocol: UDP}
`

// flannelPort is the UDP port of Flannel's VXLAN backend (the kernel's
// default VXLAN port too).
const flannelPort = 8472

// addFlannel gives every node of the lab Flannel-like VXLAN devices:
// flannel.1 (VNI 1) on the node's IPv4 underlay address and flannel-v6.1
// (VNI 2, as Flannel's dual stack) on its IPv6 one, both UDP 8472, no
// learning, with rp_filter (all and the devices') set to rpFilter. It
// returns each node's devices' MACs, by node and outer family ("v4" or
// "v6").
func addFlannel(t *testing.T, l *spoofLab, rpFilter int) map[string]net.HardwareAddr {
	t.Helper()
	macs := map[string]net.HardwareAddr{}
	for i, node := range []string{"node-1", "node-2"} {
		for _, d := range flannelDevices {
			ip := spoofNodeAddr(l, t, node, d.fam == "v4")
			for _, args := range [][]string{
				{"ip", "link", "add", d.name, "type", "vxlan", "id", d.vni, "dstport", strconv.Itoa(flannelPort), "local", ip.String(), "dev", "eth0", "nolearning"},
				{"ip", "link", "set", d.name, "up"},
			} {
				if out, err := l.lab.NodeExec(node, args...); err != nil {
					t.Fatalf("%s: %v: %v\n%s", node, args, err, out)
				}
			}
			err := l.lab.InNode(node, func() error {
				ifi, err := net.InterfaceByName(d.name)
				if err == nil {
					macs[node+" "+d.fam] = ifi.HardwareAddr
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if out, err := l.lab.NodeExec(node, "ip", "addr", "add", fmt.Sprintf("10.244.%d.0/32", i+1), "dev", "flannel.1"); err != nil {
			t.Fatalf("%s: %v\n%s", node, err, out)
		}
		setRPFilter(t, l, node, rpFilter)
	}
	return macs
}

// flannelDevices are the VXLAN devices of addFlannel, by outer family.
var flannelDevices = []struct{ name, vni, fam string }{{"flannel.1", "1", "v4"}, {"flannel-v6.1", "2", "v6"}}

func setRPFilter(t *testing.T, l *spoofLab, node string, v int) {
	t.Helper()
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.flannel/1.rp_filter", "net.ipv4.conf.flannel-v6/1.rp_filter"} {
		if out, err := l.lab.NodeExec(node, "sysctl", "-w", fmt.Sprintf("%s=%d", k, v)); err != nil {
			t.Fatalf("%s: sysctl %s: %v\n%s", node, k, err, out)
		}
	}
}

// vxlanFrame is a VXLAN datagram's payload: the VXLAN header (VNI vni)
// and an Ethernet frame to dstMAC that holds an IPv4 UDP datagram from src
// to dst.
func vxlanFrame(vni uint32, dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 8, 8+14+28+len(payload))
	b[0] = 0x08 // the VNI is valid
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	b = append(b, dstMAC...)
	b = append(b, 0x02, 0xde, 0xad, 0xbe, 0xef, 0x01) // any source MAC but the device's
	b = append(b, 0x08, 0x00)
	return append(b, spoofPacket(src, dst, payload)...)
}

// sendVXLAN sends frame from inside ep with a plain UDP socket, as any pod
// process can.
func sendVXLAN(t *testing.T, l *spoofLab, ep netlab.Endpoint, to netip.Addr, frame []byte) {
	t.Helper()
	err := l.lab.InNetns(ep, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(to, flannelPort)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(frame)
		return err
	})
	if err != nil {
		t.Fatalf("send VXLAN to %s: %v", to, err)
	}
}

// tunnelAttack is one VXLAN datagram of the attacker: to which node, what
// inner source and destination, and where it must not arrive.
type tunnelAttack struct {
	name     string
	node     string // the tunnel endpoint's node
	outer    string // the outer family: "v4" or "v6"
	src, dst netip.AddrPort
	at       *spoofListener
}

// tunnelAttacks lists the attacks: to the attacker's own node, the inner
// datagram from far (node-2), which v1 admits, to v1; to the other node,
// from near (node-1) to v2; and the first again over IPv6 (the inner
// datagram is IPv4 in every attack).
func tunnelAttacks(t *testing.T, l *spoofLab) []tunnelAttack {
	t.Helper()
	ap := func(pod string) netip.AddrPort { return netip.AddrPortFrom(l.addr(t, pod, true), spoofVictimPort) }
	v1 := spoofListen(t, l.lab, l.pod(t, "victim/v1"), "udp4", spoofVictimPort)
	v2 := spoofListen(t, l.lab, l.pod(t, "victim/v2"), "udp4", spoofVictimPort)
	return []tunnelAttack{
		{name: "to its own node, as friends/far to victim/v1", node: "node-1", outer: "v4", src: netip.AddrPortFrom(l.addr(t, "friends/far", true), 4444), dst: ap("victim/v1"), at: v1},
		{name: "to node-2, as friends/near to victim/v2", node: "node-2", outer: "v4", src: netip.AddrPortFrom(l.addr(t, "friends/near", true), 4444), dst: ap("victim/v2"), at: v2},
		{name: "over IPv6 to its own node, as friends/far to victim/v1", node: "node-1", outer: "v6", src: netip.AddrPortFrom(l.addr(t, "friends/far", true), 4445), dst: ap("victim/v1"), at: v1},
	}
}

// runTunnel sends each attack (marked with tag) and reports which arrived
// at their victim; an arrival must carry the forged source.
func runTunnel(t *testing.T, l *spoofLab, macs map[string]net.HardwareAddr, attacks []tunnelAttack, tag string) map[string]bool {
	t.Helper()
	for i, a := range attacks {
		vni := uint32(1)
		if a.outer == "v6" {
			vni = 2
		}
		frame := vxlanFrame(vni, macs[a.node+" "+a.outer], a.src, a.dst, []byte(fmt.Sprintf("TUNNEL-%s-%d", tag, i)))
		sendVXLAN(t, l, l.pod(t, "attacker/a"), spoofNodeAddr(l, t, a.node, a.outer == "v4"), frame)
	}
	time.Sleep(time.Second)
	arrived := map[string]bool{}
	for i, a := range attacks {
		got := a.at.seen(fmt.Sprintf("TUNNEL-%s-%d", tag, i))
		arrived[a.name] = len(got) > 0
		if len(got) > 0 && !strings.HasPrefix(got[0], a.src.Addr().String()+" ") {
			t.Errorf("%s: arrived as %q, want from %s", a.name, got[0], a.src.Addr())
		}
	}
	return arrived
}

// tunnelDrops is the packet count of a node's tunnel-check rules (their
// comments start with "encapsulation").
func tunnelDrops(l *spoofLab, node string) int {
	re := regexp.MustCompile(`counter packets (\d+) bytes \d+ drop comment "encapsulation`)
	total := 0
	for _, m := range re.FindAllStringSubmatch(l.c.ListTable(node), -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// masquerade makes node-1 masquerade its pods' traffic leaving through the
// underlay, as many CNIs do towards node addresses: node-2 then sees the
// attacker's VXLAN come from node-1's address.
func masquerade(t *testing.T, l *spoofLab) {
	t.Helper()
	const nat = `table ip redteam-nat {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth0" ip saddr 10.244.0.0/16 masquerade
	}
}
`
	if out, err := l.lab.NodeExecInput("node-1", []byte(nat), "nft", "-f", "-"); err != nil {
		t.Fatalf("masquerade: %v\n%s", err, out)
	}
}

// TestRedTeamTunnelFromPod: the attacker pod on node-1 sends, with a plain
// UDP socket, VXLAN datagrams to its own node's and to node-2's Flannel
// port whose inner datagrams come "from" pods the victims admit; with
// rp_filter off and loose, and with node-1 masquerading pods' traffic to
// the underlay. With the tunnel check (part of source validation, the
// default, in every mode) nothing arrives and the drops are counted; with
// only the receiving node's half (the pod-interface rule taken out of
// node-1's ruleset) the attack on node-2 is still stopped there. Without
// the check (the control) every attack arrives. (IPIP, GRE and Geneve are
// the same rules with other matches; this lab's kernel builds none of those
// devices, so only VXLAN is enacted.)
func TestRedTeamTunnelFromPod(t *testing.T) {
	spoofRequireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) {
			l := newScenarioLab(t, tunnelScenario, lab.Config{Mode: mode})
			macs := addFlannel(t, l, 0)
			attacks := tunnelAttacks(t, l)
			for _, rp := range []int{0, 2} {
				for _, n := range []string{"node-1", "node-2"} {
					setRPFilter(t, l, n, rp)
				}
				for name, ok := range runTunnel(t, l, macs, attacks, fmt.Sprintf("rp%d", rp)) {
					if ok {
						t.Errorf("rp_filter %d: %s: the forged inner datagram arrived", rp, name)
					}
				}
			}
			masquerade(t, l)
			for name, ok := range runTunnel(t, l, macs, attacks[1:2], "masq") {
				if ok {
					t.Errorf("masqueraded: %s: the forged inner datagram arrived", name)
				}
			}
			if n := tunnelDrops(l, "node-1"); n < 2*len(attacks)+1 {
				t.Errorf("node-1's tunnel-check counters say %d packets, want at least %d:\n%s", n, 2*len(attacks)+1, l.c.ListTable("node-1"))
			}
		})
	}
	t.Run("receiving node alone", func(t *testing.T) {
		// node-1 without its pod-interface rule: as for a pod whose packets
		// do not enter through a pod interface (macvlan, ipvlan).
		l := newScenarioLab(t, tunnelScenario, lab.Config{MutateRuleset: func(node string, rs *compile.Ruleset) {
			if node != "node-1" {
				return
			}
			for _, c := range rs.Chains {
				kept := c.Rules[:0]
				for _, r := range c.Rules {
					if !strings.Contains(r.Text(), "meta iifkind") || !strings.Contains(r.Text(), "daddr @node-addrs") {
						kept = append(kept, r)
					}
				}
				c.Rules = kept
			}
		}})
		macs := addFlannel(t, l, 0)
		attacks := tunnelAttacks(t, l)[1:2]
		if runTunnel(t, l, macs, attacks, "recv")[attacks[0].name] {
			t.Errorf("%s: the forged inner datagram arrived", attacks[0].name)
		}
		if n := tunnelDrops(l, "node-2"); n < 1 {
			t.Errorf("node-2's tunnel-check counters say %d packets:\n%s", n, l.c.ListTable("node-2"))
		}
	})
	t.Run("control: validation off", func(t *testing.T) {
		l := newScenarioLab(t, tunnelScenario, lab.Config{NoSourceValidation: true})
		macs := addFlannel(t, l, 0)
		attacks := tunnelAttacks(t, l)
		for _, rp := range []int{0, 2} {
			for _, n := range []string{"node-1", "node-2"} {
				setRPFilter(t, l, n, rp)
			}
			for _, a := range attacks {
				if !runTunnel(t, l, macs, []tunnelAttack{a}, fmt.Sprintf("ctl%d", rp))[a.name] {
					t.Errorf("rp_filter %d: without the check %s should have arrived (the lab's VXLAN decapsulates), but did not", rp, a.name)
				}
			}
		}
		masquerade(t, l)
		if a := attacks[1]; !runTunnel(t, l, macs, []tunnelAttack{a}, "ctlmasq")[a.name] {
			t.Errorf("masqueraded: without the check %s should have arrived, but did not", a.name)
		}
	})
}
