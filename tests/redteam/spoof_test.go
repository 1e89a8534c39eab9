package redteam

// Spoofed source addresses (issue 25, item 2's kernel half): a pod with
// NET_RAW, on a CNI without anti-spoofing (the lab's ptp veths have none),
// writes IP packets whose source is not its own. Every IP-based rule trusts
// the source: a podSelector or ipBlock peer that a victim admits, the
// conntrack entry of the victim's own DNS query (a spoofed "reply" is
// established), the attacker's own egress rules (they key on its address).
// The defence is the ruleset's source-address validation (pkg/compile,
// render_source.go): a packet that arrives from a pod interface with a source
// the node does not route back through that interface is dropped in
// prerouting, before conntrack, forward and input. Each test runs its attack with the validation switched
// off too (lab.Config.NoSourceValidation), and asserts that it then
// succeeds: the attack is real on this lab, so its failure with the
// validation on is the defence's doing.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// spoofScenario: on node-1 the attacker, a victim and a pod the victims
// admit ("near"); on node-2 another victim, another admitted pod ("far") and
// the DNS server. The victims admit UDP 9000-9010 from the friends and from
// the outside ranges 192.0.2.0/24 and 2001:db8::/32, nothing else; a
// ClusterNetworkPolicy denies the attacker's namespace UDP to the nodes.
// The probes are the legitimate traffic that must keep working. The nodes
// list their pod ranges: without them an unknown source on a pod interface
// (the outside addresses spoofed here) is dropped by the unknown-source
// rule too (unknownsrc_test.go), and the control would not show the
// spoofing that source validation alone stops.
const spoofScenario = `
namespaces:
  - {name: victim}
  - {name: attacker, labels: {role: attacker}}
  - {name: friends}
  - {name: kube-system}
nodes:
  - {name: node-1, ips: [192.168.7.1, "fd00:192:168:7::1"], podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]}
  - {name: node-2, ips: [192.168.7.2, "fd00:192:168:7::2"], podCIDRs: [10.244.2.0/24, "fd00:10:244:2::/64"]}
pods:
  - {namespace: victim, name: v1, labels: {app: v}, ips: [10.244.1.10, "fd00:10:244:1::10"], node: node-1}
  - {namespace: victim, name: v2, labels: {app: v}, ips: [10.244.2.10, "fd00:10:244:2::10"], node: node-2}
  - {namespace: attacker, name: a, labels: {app: a}, ips: [10.244.1.66, "fd00:10:244:1::66"], node: node-1}
  - {namespace: friends, name: near, labels: {app: friend}, ips: [10.244.1.20, "fd00:10:244:1::20"], node: node-1}
  - {namespace: friends, name: far, labels: {app: friend}, ips: [10.244.2.20, "fd00:10:244:2::20"], node: node-2}
  - {namespace: kube-system, name: dns, labels: {app: dns}, ips: [10.244.2.53, "fd00:10:244:2::53"], node: node-2, ports: [{name: dns, port: 53, protocol: UDP}]}
policies:
  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: v-in, namespace: victim}
    spec:
      podSelector: {matchLabels: {app: v}}
      ingress:
        - from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: friend}}}]
          ports: [{protocol: UDP, port: 9000, endPort: 9010}]
        - from: [{ipBlock: {cidr: 192.0.2.0/24}}, {ipBlock: {cidr: "2001:db8::/32"}}]
          ports: [{protocol: UDP, port: 9000, endPort: 9010}]
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: attackers-no-node-udp}
    spec:
      tier: Admin
      priority: 5
      subject: {namespaces: {matchLabels: {role: attacker}}}
      egress:
        - {name: no-udp-to-nodes, action: Deny, to: [{networks: [192.168.7.0/24, "fd00:192:168:7::/64"]}], protocols: [{udp: {}}]}
probes:
  - {from: {pod: friends/near}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: friends/far}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: friends/near}, to: {pod: victim/v2}, port: 9000, protocol: UDP}
  - {from: {ip: "fd00:10:244:1::20"}, to: {ip: "fd00:10:244:1::10"}, port: 9000, protocol: UDP}
  - {from: {ip: "fd00:10:244:2::20"}, to: {ip: "fd00:10:244:1::10"}, port: 9000, protocol: UDP}
  - {from: {ip: "fd00:10:244:1::20"}, to: {ip: "fd00:10:244:2::10"}, port: 9000, protocol: UDP}
  - {from: {ip: 192.0.2.10}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {ip: 192.0.2.10}, to: {pod: victim/v2}, port: 9000, protocol: UDP}
  - {from: {ip: "2001:db8::10"}, to: {ip: "fd00:10:244:1::10"}, port: 9000, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: victim/v2}, port: 9000, protocol: UDP}
  - {from: {ip: "fd00:10:244:1::66"}, to: {ip: "fd00:10:244:1::10"}, port: 9000, protocol: UDP}
  - {from: {pod: victim/v1}, to: {pod: kube-system/dns}, port: 53, protocol: UDP}
  - {from: {ip: "fd00:10:244:1::10"}, to: {ip: "fd00:10:244:2::53"}, port: 53, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: kube-system/dns}, port: 53, protocol: UDP}
  - {from: {pod: attacker/a}, to: {pod: friends/near}, port: 80}
  - {from: {pod: friends/far}, to: {pod: attacker/a}, port: 80}
  - {from: {pod: friends/near}, to: {node: node-1}, port: 9099, protocol: UDP}
  - {from: {ip: "fd00:10:244:1::20"}, to: {ip: "fd00:192:168:7::1"}, port: 9099, protocol: UDP}
  - {from: {pod: attacker/a}, to: {node: node-1}, port: 9099, protocol: UDP}
  - {from: {pod: attacker/a}, to: {node: node-1}, port: 22}
  - {from: {node: node-1}, to: {pod: attacker/a}, port: 80}
  - {from: {node: node-2}, to: {pod: victim/v1}, port: 9000, protocol: UDP}
`

// Ports the attacks aim at: a victim's own socket (in the policy's port
// range, not one the lab's servers hold), a node's own socket, and the
// victim's DNS client socket.
const (
	spoofVictimPort = 9009
	spoofNodePort   = 9098
	spoofDNSClient  = 40053
)

func spoofRequireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, raw sockets and nftables rulesets")
	}
}

// spoofLab is the scenario's cluster with the endpoints the attacks use.
type spoofLab struct {
	c   *lab.Lab
	s   *scenario.Scenario
	lab *netlab.Lab
}

func newSpoofLab(t *testing.T, cfg lab.Config) *spoofLab {
	t.Helper()
	return newScenarioLab(t, spoofScenario, cfg)
}

// newScenarioLab is the lab of a scenario, applied, with its endpoints.
func newScenarioLab(t *testing.T, text string, cfg lab.Config) *spoofLab {
	t.Helper()
	spoofRequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	c, err := lab.New(ctx, s, cfg)
	if err != nil {
		t.Fatalf("lab.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if _, err := c.Apply(ctx, s, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return &spoofLab{c: c, s: s, lab: c.Net()}
}

func (l *spoofLab) pod(t *testing.T, key string) netlab.Endpoint {
	t.Helper()
	ep, ok := l.c.PodEndpoint(key)
	if !ok {
		t.Fatalf("no pod %s", key)
	}
	return ep
}

// addr is the scenario pod's address of a family.
func (l *spoofLab) addr(t *testing.T, key string, v4 bool) netip.Addr {
	t.Helper()
	for _, a := range l.s.Pod(key).Addrs() {
		if a.Is4() == v4 {
			return a
		}
	}
	t.Fatalf("pod %s has no address of that family", key)
	return netip.Addr{}
}

func spoofNodeAddr(l *spoofLab, t *testing.T, node string, v4 bool) netip.Addr {
	t.Helper()
	for _, a := range l.s.Node(node).Addrs() {
		if a.Is4() == v4 {
			return a
		}
	}
	t.Fatalf("node %s has no address of that family", node)
	return netip.Addr{}
}

// spoofListener is a UDP socket in some namespace that records every
// datagram it gets.
type spoofListener struct {
	conn *net.UDPConn
	mu   sync.Mutex
	got  []string // "source payload"
	done chan struct{}
}

func spoofListen(t *testing.T, lab *netlab.Lab, ep netlab.Endpoint, network string, port int) *spoofListener {
	t.Helper()
	sl := &spoofListener{done: make(chan struct{})}
	err := lab.InNetns(ep, func() error {
		c, err := net.ListenUDP(network, &net.UDPAddr{Port: port})
		sl.conn = c
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %d in %v: %v", network, port, ep, err)
	}
	go sl.read()
	t.Cleanup(sl.close)
	return sl
}

func (sl *spoofListener) read() {
	defer close(sl.done)
	buf := make([]byte, 2048)
	for {
		n, from, err := sl.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		sl.mu.Lock()
		sl.got = append(sl.got, from.Addr().Unmap().String()+" "+string(buf[:n]))
		sl.mu.Unlock()
	}
}

func (sl *spoofListener) close() {
	sl.conn.Close()
	<-sl.done
}

// seen reports the datagrams whose payload holds marker.
func (sl *spoofListener) seen(marker string) []string {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	var out []string
	for _, g := range sl.got {
		if strings.Contains(g, marker) {
			out = append(out, g)
		}
	}
	return out
}

// spoofUDP sends, from inside ep's namespace, one UDP datagram with any
// source address, as a pod with NET_RAW can: an IPPROTO_RAW socket (the IP
// header is the caller's) and a header built here.
func spoofUDP(lab *netlab.Lab, ep netlab.Endpoint, src, dst netip.AddrPort, payload []byte) error {
	pkt := spoofPacket(src, dst, payload)
	return lab.InNetns(ep, func() error {
		fam := unix.AF_INET
		if dst.Addr().Is6() {
			fam = unix.AF_INET6
		}
		fd, err := unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		if dst.Addr().Is4() {
			return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
		}
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet6{Addr: dst.Addr().As16()})
	})
}

// spoofPacket is an IPv4 or IPv6 packet holding one UDP datagram, with a
// correct UDP checksum (IPv6 requires it; the kernel fills the IPv4
// header's own checksum, length and ID).
func spoofPacket(src, dst netip.AddrPort, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	var pseudo []byte
	pseudo = append(append(pseudo, s...), d...)
	if src.Addr().Is4() {
		pseudo = append(pseudo, 0, unix.IPPROTO_UDP, byte(len(udp)>>8), byte(len(udp)))
	} else {
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(udp)))
		pseudo = append(pseudo, 0, 0, 0, unix.IPPROTO_UDP)
	}
	sum := spoofChecksum(append(pseudo, udp...))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	if src.Addr().Is4() {
		h := make([]byte, 20)
		h[0], h[8], h[9] = 0x45, 64, unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(udp)))
		binary.BigEndian.PutUint16(h[4:], 0x5f0f) // ID
		copy(h[12:], s)
		copy(h[16:], d)
		binary.BigEndian.PutUint16(h[10:], spoofChecksum(h))
		return append(h, udp...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(udp)))
	h[6], h[7] = unix.IPPROTO_UDP, 64
	copy(h[8:], s)
	copy(h[24:], d)
	return append(h, udp...)
}

// spoofBroadcast sends a UDP datagram from 0.0.0.0 to 255.255.255.255 out
// of the pod's eth0 through a packet socket, as a DHCP client does (a raw
// IP socket would replace the unspecified source with the pod's address).
func spoofBroadcast(lab *netlab.Lab, ep netlab.Endpoint, srcPort, dstPort uint16, payload []byte) error {
	pkt := spoofPacket(netip.AddrPortFrom(netip.IPv4Unspecified(), srcPort), netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), dstPort), payload)
	return lab.InNetns(ep, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		proto := uint16(unix.ETH_P_IP>>8 | (unix.ETH_P_IP&0xff)<<8) // network order
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(proto))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		return unix.Sendto(fd, pkt, 0, to)
	})
}

func spoofChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// spoofAttack is one spoofed datagram and where it must not arrive.
type spoofAttack struct {
	name     string
	src, dst netip.AddrPort
	at       *spoofListener
}

// spoofAttacks sets up the victims' sockets and lists every attack of the
// attacker pod, in both families: (i) another pod's address (on its own
// node and on the other) to a victim that admits that pod; (ii) an outside
// address a victim's ipBlock admits; (iii) the DNS server's address to the
// victim's DNS client socket, whose query to the server is answered (the
// spoofed reply matches that conntrack entry); (iv) to the node itself
// (input hook), whose UDP the attacker's ClusterNetworkPolicy denies, with
// another pod's and an outside source.
func (l *spoofLab) attacks(t *testing.T) []spoofAttack {
	t.Helper()
	var out []spoofAttack
	for _, v4 := range []bool{true, false} {
		fam, network := "v6", "udp6"
		if v4 {
			fam, network = "v4", "udp4"
		}
		ap := func(a netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }
		outside := netip.MustParseAddr("2001:db8::77")
		if v4 {
			outside = netip.MustParseAddr("192.0.2.77")
		}
		for _, v := range []string{"victim/v1", "victim/v2"} {
			ls := spoofListen(t, l.lab, l.pod(t, v), network, spoofVictimPort)
			dst := ap(l.addr(t, v, v4), spoofVictimPort)
			for _, f := range []string{"friends/near", "friends/far"} {
				out = append(out, spoofAttack{name: fmt.Sprintf("(i) %s as %s to %s", fam, f, v), src: ap(l.addr(t, f, v4), 4444), dst: dst, at: ls})
			}
			out = append(out, spoofAttack{name: fmt.Sprintf("(ii) %s as outside %s to %s", fam, outside, v), src: ap(outside, 4444), dst: dst, at: ls})
		}
		// (iii): the victim's query, answered by the DNS pod's echo.
		dns := ap(l.addr(t, "kube-system/dns", v4), 53)
		client := spoofListen(t, l.lab, l.pod(t, "victim/v1"), network, spoofDNSClient)
		if _, err := client.conn.WriteToUDPAddrPort([]byte("query "+fam), dns); err != nil {
			t.Fatalf("DNS query: %v", err)
		}
		if !spoofWait(func() bool { return len(client.seen("query "+fam)) > 0 }) {
			t.Fatalf("the DNS server's real answer (%s) never reached the victim: %q", fam, client.seen(""))
		}
		out = append(out, spoofAttack{name: fmt.Sprintf("(iii) %s as the DNS server to the victim's query socket", fam),
			src: dns, dst: ap(l.addr(t, "victim/v1", v4), spoofDNSClient), at: client})
		// (iv): the node itself.
		node := spoofListen(t, l.lab, netlab.Node("node-1"), network, spoofNodePort)
		nodeDst := ap(spoofNodeAddr(l, t, "node-1", v4), spoofNodePort)
		out = append(out,
			spoofAttack{name: fmt.Sprintf("(iv) %s as friends/far to node-1", fam), src: ap(l.addr(t, "friends/far", v4), 4444), dst: nodeDst, at: node},
			spoofAttack{name: fmt.Sprintf("(iv) %s as outside %s to node-1", fam, outside), src: ap(outside, 4444), dst: nodeDst, at: node})
	}
	return out
}

func spoofWait(cond func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// run sends every attack from the attacker pod and returns, per attack,
// whether it arrived.
func (l *spoofLab) run(t *testing.T, attacks []spoofAttack) map[string]bool {
	t.Helper()
	attacker := l.pod(t, "attacker/a")
	for i, a := range attacks {
		if err := spoofUDP(l.lab, attacker, a.src, a.dst, []byte(fmt.Sprintf("SPOOF-%d", i))); err != nil {
			t.Fatalf("%s: %v", a.name, err)
		}
	}
	// Delivered datagrams arrive in microseconds; a second is generous.
	time.Sleep(time.Second)
	arrived := map[string]bool{}
	for i, a := range attacks {
		got := a.at.seen(fmt.Sprintf("SPOOF-%d", i))
		arrived[a.name] = len(got) > 0
		if len(got) > 0 && !strings.HasPrefix(got[0], a.src.Addr().String()+" ") {
			t.Errorf("%s: arrived as %q, want from %s", a.name, got[0], a.src.Addr())
		}
	}
	return arrived
}

// spoofDrops is the packet count of a node's source-validation rule (its
// comment says "spoofed").
func spoofDrops(t *testing.T, l *spoofLab, node string) int {
	t.Helper()
	out := l.c.ListTable(node)
	re := regexp.MustCompile(`counter packets (\d+) bytes \d+ drop comment "spoofed`)
	total := 0
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// TestRedTeamSpoofedSource: a pod on node-1 spoofs other pods' addresses,
// outside addresses that victims' ipBlocks admit, the DNS server's address
// towards a victim's pending query socket, and sources towards the node
// itself, in IPv4 and IPv6. With source validation (the default, in every
// mode) nothing arrives and the drops are counted; without it (the
// control), every attack arrives.
func TestRedTeamSpoofedSource(t *testing.T) {
	spoofRequireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) {
			l := newSpoofLab(t, lab.Config{Mode: mode})
			attacks := l.attacks(t)
			arrived := l.run(t, attacks)
			for _, a := range attacks {
				if arrived[a.name] {
					t.Errorf("%s: the spoofed datagram arrived", a.name)
				}
			}
			if n := spoofDrops(t, l, "node-1"); n < len(attacks) {
				t.Errorf("node-1's source-validation counters say %d packets, want at least %d:\n%s", n, len(attacks), l.c.ListTable("node-1"))
			}
		})
	}
	t.Run("control: validation off", func(t *testing.T) {
		l := newSpoofLab(t, lab.Config{Mode: compile.ModeHybrid, NoSourceValidation: true})
		attacks := l.attacks(t)
		arrived := l.run(t, attacks)
		var missing []string
		for _, a := range attacks {
			if !arrived[a.name] {
				missing = append(missing, a.name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("without source validation these attacks should have arrived (the lab lets pods spoof), but did not: %s", strings.Join(missing, "; "))
		}
	})
}

// TestRedTeamSpoofLegitTraffic: with source validation on, every probe of
// the scenario gets the evaluator's verdict (pods to pods on the same and
// the other node, outside hosts, nodes to pods, pods to their node, both
// families); a pod that must resolve its gateway through ARP and neighbour
// discovery (its static entries deleted) still talks; a pod's link-local
// source reaches its node; and a DHCP-like broadcast from 0.0.0.0 still
// reaches the node.
func TestRedTeamSpoofLegitTraffic(t *testing.T) {
	spoofRequireRoot(t)
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) {
			l := newSpoofLab(t, lab.Config{Mode: mode})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			spoofCheckProbes(t, ctx, l)

			// Neighbour discovery and ARP from the pods' own stacks: the
			// NS comes from the pod's link-local address.
			for _, k := range []string{"friends/near", "victim/v1"} {
				ep := l.pod(t, k)
				for _, args := range [][]string{{"ip", "-6", "neigh", "del", "fe80::1", "dev", "eth0"}, {"ip", "-4", "neigh", "del", "169.254.1.1", "dev", "eth0"}} {
					if out, err := l.lab.Exec(ep, args...); err != nil {
						t.Fatalf("%s: %v: %v\n%s", k, args, err, out)
					}
				}
			}
			spoofCheckProbes(t, ctx, l)
			if out, err := l.lab.Exec(l.pod(t, "friends/near"), "ip", "-6", "neigh", "show", "fe80::1"); err != nil || !strings.Contains(string(out), "lladdr") {
				t.Errorf("the pod did not resolve fe80::1 by neighbour discovery: %v %s", err, out)
			}

			// A pod's link-local source (not ND) to its node.
			ll := spoofListen(t, l.lab, netlab.Node("node-1"), "udp6", 9097)
			err := l.lab.InNetns(l.pod(t, "friends/near"), func() error {
				// The zone by index: the net package caches zone names
				// process-wide, and every namespace has its own eth0.
				ifi, err := net.InterfaceByName("eth0")
				if err != nil {
					return err
				}
				c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.ParseIP("fe80::1"), Zone: strconv.Itoa(ifi.Index), Port: 9097})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("LINKLOCAL"))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if !spoofWait(func() bool { return len(ll.seen("LINKLOCAL")) > 0 }) {
				t.Errorf("a datagram from the pod's link-local address did not reach the node")
			} else if got := ll.seen("LINKLOCAL")[0]; !strings.HasPrefix(got, "fe80:") {
				t.Errorf("the link-local datagram came from %q", got)
			}

			// DHCP-like: 0.0.0.0:68 -> 255.255.255.255:67, to the node.
			dhcp := spoofListen(t, l.lab, netlab.Node("node-1"), "udp4", 67)
			if err := spoofBroadcast(l.lab, l.pod(t, "friends/near"), 68, 67, []byte("DHCPDISCOVER")); err != nil {
				t.Fatal(err)
			}
			if !spoofWait(func() bool { return len(dhcp.seen("DHCPDISCOVER")) > 0 }) {
				t.Errorf("a broadcast from 0.0.0.0 did not reach the node")
			}
		})
	}
}

func spoofCheckProbes(t *testing.T, ctx context.Context, l *spoofLab) {
	t.Helper()
	rep, err := l.c.Probe(ctx, l.s, nil)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if tab := rep.Table(); tab != "" {
		t.Errorf("%s", tab)
	}
	var errs []error
	allowed := 0
	for _, o := range rep.Outcomes {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("probe %d: %w", o.Index, o.Err))
		}
		if o.Connected {
			allowed++
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
	t.Logf("%d probes, %d allowed", len(rep.Outcomes), allowed)
}
