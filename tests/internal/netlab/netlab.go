package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"sync"
)

// Config describes a lab.
type Config struct {
	// Prefix of every namespace name. Empty means RandomPrefix("nl").
	// Letters, digits, '.', '_' and '-' only, at most 40 characters.
	Prefix string
	// Nodes to create; at least one.
	Nodes []NodeSpec
}

// NodeSpec describes a node.
type NodeSpec struct {
	Name string
	// Underlay addresses. Zero values default to 172.31.0.<i+1> and
	// fd00:172:31::<i+1> (i = index in Config.Nodes).
	IPv4, IPv6 netip.Addr
	// Optional host-network servers (TCP listens on the wildcard address,
	// UDP binds the node IPs).
	TCPPorts, UDPPorts []uint16
}

// NodeWithIPs returns the spec of a node whose underlay has the given
// addresses: the last IPv4 and the last IPv6 address of ips. A family ips
// lacks gets the default address. Harnesses use it to give a lab node the
// addresses a scenario lists for it, so that policies naming node addresses
// see the same ones on real packets.
func NodeWithIPs(name string, ips []netip.Addr) NodeSpec {
	spec := NodeSpec{Name: name}
	for _, a := range ips {
		if a.Is4() {
			spec.IPv4 = a
		} else {
			spec.IPv6 = a
		}
	}
	return spec
}

// PodSpec describes a pod.
type PodSpec struct {
	Name string // unique among pods
	Node string // node the pod runs on
	// IPs of the pod: any mix of IPv4 and IPv6, at least one, unique in
	// the lab (and not 169.254.1.1).
	IPs      []netip.Addr
	TCPPorts []uint16
	UDPPorts []uint16
}

// ExternalSpec describes a host outside the cluster that is reachable through
// Node (e.g. 192.0.2.10). The fields mean the same as in PodSpec.
type ExternalSpec PodSpec

// Kind tells what an Endpoint refers to.
type Kind string

// Endpoint kinds.
const (
	KindPod      Kind = "pod"
	KindExternal Kind = "external"
	KindNode     Kind = "node"
)

// Endpoint names a namespace of the lab: a pod, an external host or a node.
type Endpoint struct {
	Kind Kind
	Name string
}

// Pod returns the Endpoint of pod name.
func Pod(name string) Endpoint { return Endpoint{KindPod, name} }

// Ext returns the Endpoint of external host name.
func Ext(name string) Endpoint { return Endpoint{KindExternal, name} }

// Node returns the Endpoint of node name (host network).
func Node(name string) Endpoint { return Endpoint{KindNode, name} }

func (e Endpoint) String() string { return string(e.Kind) + "/" + e.Name }

// Info describes an endpoint of a running lab.
type Info struct {
	Endpoint  Endpoint
	Node      string       // owning node (the node itself for KindNode)
	IPs       []netip.Addr // pod/external IPs, or node underlay IPs
	Netns     string       // namespace name, usable with `ip netns exec`
	NetnsPath string       // /run/netns/<Netns>, usable with setns(2)
	// HostIface is the node-side veth of a pod/external ("veth<N>" or
	// "ext<N>" in the node namespace); "eth0" (the underlay) for nodes.
	HostIface string
	HostMAC   string // MAC of HostIface
	MAC       string // MAC of the endpoint's eth0
}

// Lab is a running simulated cluster. Its methods are safe for concurrent
// use; topology changes (AddPod, RemovePod, ...) are serialized.
type Lab struct {
	prefix string
	tag    [2]byte // random MAC tag
	sw     *nsHandle

	opMu sync.Mutex // serializes topology changes and Close

	mu      sync.RWMutex
	closed  bool
	nodes   map[string]*node
	order   []string // node names in config order
	members map[Endpoint]*member
	created []string // namespace names, in creation order
	nextIf  int
}

type node struct {
	name  string
	index int
	ipv4  netip.Addr
	ipv6  netip.Addr
	mac   string
	h     *nsHandle
	srv   *servers
}

type member struct {
	ep        Endpoint
	node      *node
	ips       []netip.Addr
	h         *nsHandle
	hostIface string
	hostMAC   string
	mac       string
	srv       *servers
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// RandomPrefix returns base + "-" + 6 random hex digits.
func RandomPrefix(base string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return base + "-" + hex.EncodeToString(b[:])
}

// New creates the node namespaces and the underlay. On error everything
// created so far is removed.
func New(cfg Config) (_ *Lab, err error) {
	if cfg.Prefix == "" {
		cfg.Prefix = RandomPrefix("nl")
	}
	if !nameRE.MatchString(cfg.Prefix) || len(cfg.Prefix) > 40 {
		return nil, fmt.Errorf("netlab: invalid prefix %q", cfg.Prefix)
	}
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("netlab: at least one node is required")
	}
	if len(cfg.Nodes) > 200 {
		return nil, errors.New("netlab: too many nodes")
	}
	l := &Lab{
		prefix:  cfg.Prefix,
		nodes:   map[string]*node{},
		members: map[Endpoint]*member{},
	}
	_, _ = rand.Read(l.tag[:])
	seen := map[netip.Addr]bool{}
	for i, ns := range cfg.Nodes {
		if !nameRE.MatchString(ns.Name) {
			return nil, fmt.Errorf("netlab: invalid node name %q", ns.Name)
		}
		if l.nodes[ns.Name] != nil {
			return nil, fmt.Errorf("netlab: duplicate node %q", ns.Name)
		}
		n := &node{name: ns.Name, index: i, ipv4: ns.IPv4.Unmap(), ipv6: ns.IPv6}
		if !n.ipv4.IsValid() {
			n.ipv4 = netip.AddrFrom4([4]byte{172, 31, 0, byte(i + 1)})
		}
		if !n.ipv6.IsValid() {
			n.ipv6 = netip.MustParseAddr(fmt.Sprintf("fd00:172:31::%x", i+1))
		}
		if !n.ipv4.Is4() || !n.ipv6.Is6() || n.ipv6.Is4In6() {
			return nil, fmt.Errorf("netlab: node %s: bad IPv4/IPv6 %v/%v", n.name, n.ipv4, n.ipv6)
		}
		for _, a := range []netip.Addr{n.ipv4, n.ipv6} {
			if seen[a] {
				return nil, fmt.Errorf("netlab: duplicate node IP %v", a)
			}
			seen[a] = true
		}
		n.mac = l.mac(0, i)
		l.nodes[n.name] = n
		l.order = append(l.order, n.name)
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()

	swName := l.prefix + "-sw"
	l.created = append(l.created, swName)
	if l.sw, err = createNetns(swName); err != nil {
		return nil, err
	}
	if err := l.sw.writeSysctls(
		"net/ipv6/conf/all/disable_ipv6", "1",
		"net/ipv6/conf/default/disable_ipv6", "1",
	); err != nil {
		return nil, err
	}
	for _, name := range l.order {
		n := l.nodes[name]
		nsName := l.nsName(KindNode, name)
		l.created = append(l.created, nsName)
		if n.h, err = createNetns(nsName); err != nil {
			return nil, err
		}
		if err := n.h.writeSysctls(
			"net/ipv4/ip_forward", "1",
			"net/ipv4/conf/all/rp_filter", "0",
			"net/ipv4/conf/default/rp_filter", "0",
			"net/ipv6/conf/all/accept_dad", "0",
			"net/ipv6/conf/default/accept_dad", "0",
			"net/ipv6/conf/all/forwarding", "1",
			"net/ipv6/conf/default/forwarding", "1",
		); err != nil {
			return nil, err
		}
	}

	// Underlay: a bridge in the switch namespace, eth0 in every node.
	var ports []int32
	err = withRtnl(l.sw, func(r *rtnl) error {
		if err := r.setUp(1, 0); err != nil { // lo
			return err
		}
		if err := r.addBridge("br0"); err != nil {
			return err
		}
		br, err := r.linkIndex("br0")
		if err != nil {
			return err
		}
		if err := r.setUp(br, 0); err != nil {
			return err
		}
		for _, name := range l.order {
			n := l.nodes[name]
			port := fmt.Sprintf("sw%d", n.index)
			if err := n.h.withFD(func(nsfd int) error {
				return r.addVeth(port, l.mac(3, n.index), "eth0", n.mac, nsfd)
			}); err != nil {
				return err
			}
			idx, err := r.linkIndex(port)
			if err != nil {
				return err
			}
			if err := r.setUp(idx, br); err != nil {
				return err
			}
			ports = append(ports, idx)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, name := range l.order {
		n := l.nodes[name]
		err := withRtnl(n.h, func(r *rtnl) error {
			eth0, err := r.linkIndex("eth0")
			if err != nil {
				return err
			}
			for _, e := range []error{
				r.setUp(1, 0),
				r.setUp(eth0, 0),
				r.addAddr(eth0, netip.PrefixFrom(n.ipv4, 32)),
				r.addAddr(eth0, netip.PrefixFrom(n.ipv6, 128)),
			} {
				if e != nil {
					return e
				}
			}
			for _, pname := range l.order {
				p := l.nodes[pname]
				if p == n {
					continue
				}
				for _, a := range []netip.Addr{p.ipv4, p.ipv6} {
					if err := r.addRoute(route{dst: netip.PrefixFrom(a, a.BitLen()), oif: eth0}); err != nil {
						return err
					}
					if err := r.addNeigh(eth0, a, p.mac); err != nil {
						return err
					}
				}
			}
			return r.waitReady(eth0)
		})
		if err != nil {
			return nil, err
		}
	}
	if err := withRtnl(l.sw, func(r *rtnl) error { return r.waitReady(ports...) }); err != nil {
		return nil, err
	}
	for i, name := range l.order {
		n := l.nodes[name]
		spec := cfg.Nodes[i]
		if len(spec.TCPPorts)+len(spec.UDPPorts) > 0 {
			if n.srv, err = startServers(n.h, n.name, []netip.Addr{n.ipv4, n.ipv6}, spec.TCPPorts, spec.UDPPorts); err != nil {
				return nil, fmt.Errorf("node %s: %w", n.name, err)
			}
		}
	}
	return l, nil
}

// mac returns a locally administered unicast MAC unique within the lab.
func (l *Lab) mac(kind byte, n int) string {
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", l.tag[0], l.tag[1], kind, byte(n>>8), byte(n))
}

func (l *Lab) nsName(k Kind, name string) string {
	switch k {
	case KindNode:
		return l.prefix + "-n-" + name
	case KindPod:
		return l.prefix + "-p-" + name
	default:
		return l.prefix + "-x-" + name
	}
}

// Prefix returns the namespace name prefix of the lab.
func (l *Lab) Prefix() string { return l.prefix }

// Nodes returns the node names in configuration order.
func (l *Lab) Nodes() []string { return append([]string(nil), l.order...) }

// Endpoints returns all pods and external hosts, sorted by kind and name.
func (l *Lab) Endpoints() []Endpoint {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Endpoint, 0, len(l.members))
	for ep := range l.members {
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind > out[j].Kind // pods first
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Info describes an endpoint.
func (l *Lab) Info(ep Endpoint) (Info, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return Info{}, ErrClosed
	}
	if ep.Kind == KindNode {
		n := l.nodes[ep.Name]
		if n == nil {
			return Info{}, fmt.Errorf("netlab: unknown node %q", ep.Name)
		}
		return Info{Endpoint: ep, Node: n.name, IPs: []netip.Addr{n.ipv4, n.ipv6},
			Netns: n.h.name, NetnsPath: n.h.path(), HostIface: "eth0", HostMAC: n.mac, MAC: n.mac}, nil
	}
	m := l.members[ep]
	if m == nil {
		return Info{}, fmt.Errorf("netlab: unknown endpoint %v", ep)
	}
	return Info{Endpoint: ep, Node: m.node.name, IPs: append([]netip.Addr(nil), m.ips...),
		Netns: m.h.name, NetnsPath: m.h.path(), HostIface: m.hostIface, HostMAC: m.hostMAC, MAC: m.mac}, nil
}

// IPs returns the addresses of an endpoint (see Info).
func (l *Lab) IPs(ep Endpoint) ([]netip.Addr, error) {
	in, err := l.Info(ep)
	return in.IPs, err
}

// NetnsPath returns /run/netns/<name> of an endpoint's namespace.
func (l *Lab) NetnsPath(ep Endpoint) (string, error) {
	in, err := l.Info(ep)
	return in.NetnsPath, err
}

// NodeNetnsPath returns /run/netns/<name> of a node's namespace, for code
// that wants to setns(2) into it itself (see also InNode).
func (l *Lab) NodeNetnsPath(node string) (string, error) { return l.NetnsPath(Node(node)) }

// handle returns the namespace handle of an endpoint.
func (l *Lab) handle(ep Endpoint) (*nsHandle, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	if ep.Kind == KindNode {
		if n := l.nodes[ep.Name]; n != nil {
			return n.h, nil
		}
		return nil, fmt.Errorf("netlab: unknown node %q", ep.Name)
	}
	if m := l.members[ep]; m != nil {
		return m.h, nil
	}
	return nil, fmt.Errorf("netlab: unknown endpoint %v", ep)
}

// Close stops all servers and deletes every namespace the lab created
// (which removes their interfaces, routes and nftables rulesets). It is
// idempotent; later calls return nil.
func (l *Lab) Close() error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	members := l.members
	l.members = map[Endpoint]*member{}
	l.mu.Unlock()

	var wg sync.WaitGroup
	stop := func(s *servers, h *nsHandle) {
		defer wg.Done()
		s.stop()
		if h != nil {
			h.close()
		}
	}
	for _, m := range members {
		wg.Add(1)
		go stop(m.srv, m.h)
	}
	for _, n := range l.nodes {
		wg.Add(1)
		go stop(n.srv, n.h)
	}
	wg.Wait()
	if l.sw != nil {
		l.sw.close()
	}
	return deleteNetns(l.created)
}
