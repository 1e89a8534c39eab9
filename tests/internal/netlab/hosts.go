package netlab

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Pod-side gateways: addresses of the node side of every pod veth.
var (
	gatewayV4 = netip.MustParseAddr("169.254.1.1")
	gatewayV6 = netip.MustParseAddr("fe80::1")
)

// AddPod creates a pod namespace on spec.Node, wires it up and starts its
// servers. The pod is reachable from everywhere in the lab when AddPod
// returns.
func (l *Lab) AddPod(spec PodSpec) error {
	return l.addMember(Pod(spec.Name), spec)
}

// AddExternal creates a host outside the cluster, attached to spec.Node and
// routed like a pod (other nodes reach it via spec.Node).
func (l *Lab) AddExternal(spec ExternalSpec) error {
	return l.addMember(Ext(spec.Name), PodSpec(spec))
}

// RemovePod stops the pod's servers and deletes its namespace, veth and
// routes.
func (l *Lab) RemovePod(name string) error { return l.removeMember(Pod(name)) }

// RemoveExternal is RemovePod for external hosts.
func (l *Lab) RemoveExternal(name string) error { return l.removeMember(Ext(name)) }

func (l *Lab) addMember(ep Endpoint, spec PodSpec) (err error) {
	if !nameRE.MatchString(spec.Name) {
		return fmt.Errorf("netlab: invalid name %q", spec.Name)
	}
	l.opMu.Lock()
	defer l.opMu.Unlock()

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.members[ep] != nil {
		l.mu.Unlock()
		return fmt.Errorf("netlab: %v already exists", ep)
	}
	n := l.nodes[spec.Node]
	if n == nil {
		l.mu.Unlock()
		return fmt.Errorf("netlab: %v: unknown node %q", ep, spec.Node)
	}
	used := map[netip.Addr]bool{gatewayV4: true}
	for _, o := range l.nodes {
		used[o.ipv4], used[o.ipv6] = true, true
	}
	for _, o := range l.members {
		for _, a := range o.ips {
			used[a] = true
		}
	}
	if len(spec.IPs) == 0 {
		l.mu.Unlock()
		return fmt.Errorf("netlab: %v: no IPs", ep)
	}
	var ips []netip.Addr
	hasV4, hasV6 := false, false
	for _, a := range spec.IPs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() ||
			a.IsLinkLocalUnicast() || a.Zone() != "" || used[a] {
			l.mu.Unlock()
			return fmt.Errorf("netlab: %v: unusable or duplicate IP %v", ep, a)
		}
		used[a] = true
		ips = append(ips, a)
		hasV4 = hasV4 || a.Is4()
		hasV6 = hasV6 || a.Is6()
	}
	idx := l.nextIf
	l.nextIf++
	nsName := l.nsName(ep.Kind, spec.Name)
	l.created = append(l.created, nsName)
	l.mu.Unlock()

	m := &member{
		ep:      ep,
		node:    n,
		ips:     ips,
		hostMAC: l.mac(1, idx),
		mac:     l.mac(2, idx),
	}
	if ep.Kind == KindPod {
		m.hostIface = fmt.Sprintf("veth%d", idx)
	} else {
		m.hostIface = fmt.Sprintf("ext%d", idx)
	}

	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			err = fmt.Errorf("netlab: add %v: %w", ep, err)
		}
	}()

	if m.h, err = createNetns(nsName); err != nil {
		return err
	}
	undo = append(undo, func() { m.h.close(); _ = deleteNetns([]string{nsName}) })
	// Before eth0 exists so that it inherits the defaults.
	if err := m.h.writeSysctls(
		"net/ipv6/conf/all/accept_dad", "0",
		"net/ipv6/conf/default/accept_dad", "0",
	); err != nil {
		return err
	}

	// Node side: veth, gateway addresses, /32 (/128) routes, neighbours.
	var hostIdx int32
	err = withRtnl(n.h, func(r *rtnl) error {
		if err := m.h.withFD(func(nsfd int) error {
			return r.addVeth(m.hostIface, m.hostMAC, "eth0", m.mac, nsfd)
		}); err != nil {
			return err
		}
		undo = append(undo, func() { _ = withRtnl(n.h, func(r *rtnl) error { return r.delLink(m.hostIface) }) })
		idx, err := r.linkIndex(m.hostIface)
		if err != nil {
			return err
		}
		hostIdx = idx
		if err := r.setUp(idx, 0); err != nil {
			return err
		}
		if hasV4 {
			if err := r.addAddr(idx, netip.PrefixFrom(gatewayV4, 32)); err != nil {
				return err
			}
		}
		if hasV6 {
			if err := r.addAddr(idx, netip.PrefixFrom(gatewayV6, 64)); err != nil {
				return err
			}
		}
		for _, a := range ips {
			src := n.ipv4
			if a.Is6() {
				src = n.ipv6
			}
			if err := r.addRoute(route{dst: netip.PrefixFrom(a, a.BitLen()), oif: idx, src: src}); err != nil {
				return err
			}
			if err := r.addNeigh(idx, a, m.mac); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if hasV4 {
		if err := n.h.writeSysctls("net/ipv4/conf/"+m.hostIface+"/proxy_arp", "1"); err != nil {
			return err
		}
	}

	// Pod side: addresses and default routes via the node.
	err = withRtnl(m.h, func(r *rtnl) error {
		eth0, err := r.linkIndex("eth0")
		if err != nil {
			return err
		}
		if err := r.setUp(1, 0); err != nil {
			return err
		}
		if err := r.setUp(eth0, 0); err != nil {
			return err
		}
		for _, a := range ips {
			if err := r.addAddr(eth0, netip.PrefixFrom(a, a.BitLen())); err != nil {
				return err
			}
		}
		if hasV4 {
			for _, e := range []error{
				r.addRoute(route{dst: netip.PrefixFrom(gatewayV4, 32), oif: eth0}),
				r.addRoute(route{dst: netip.PrefixFrom(netip.IPv4Unspecified(), 0), oif: eth0, gw: gatewayV4}),
				r.addNeigh(eth0, gatewayV4, m.hostMAC),
			} {
				if e != nil {
					return e
				}
			}
		}
		if hasV6 {
			for _, e := range []error{
				r.addRoute(route{dst: netip.PrefixFrom(netip.IPv6Unspecified(), 0), oif: eth0, gw: gatewayV6}),
				r.addNeigh(eth0, gatewayV6, m.hostMAC),
			} {
				if e != nil {
					return e
				}
			}
		}
		return r.waitReady(eth0)
	})
	if err != nil {
		return err
	}
	// The node side came up first, so its qdisc is attached asynchronously.
	if err := withRtnl(n.h, func(r *rtnl) error { return r.waitReady(hostIdx) }); err != nil {
		return err
	}

	// Other nodes route the IPs via the owning node.
	for _, oname := range l.order {
		o := l.nodes[oname]
		if o == n {
			continue
		}
		undo = append(undo, func() { _ = l.delRemoteRoutes(o, ips) })
		err := withRtnl(o.h, func(r *rtnl) error {
			eth0, err := r.linkIndex("eth0")
			if err != nil {
				return err
			}
			for _, a := range ips {
				gw := n.ipv4
				if a.Is6() {
					gw = n.ipv6
				}
				if err := r.addRoute(route{dst: netip.PrefixFrom(a, a.BitLen()), oif: eth0, gw: gw, onlink: true}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}

	if m.srv, err = startServers(m.h, spec.Name, ips, spec.TCPPorts, spec.UDPPorts); err != nil {
		return err
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed { // cannot happen: Close takes opMu
		m.srv.stop()
		return ErrClosed
	}
	l.members[ep] = m
	return nil
}

func (l *Lab) delRemoteRoutes(o *node, ips []netip.Addr) error {
	return withRtnl(o.h, func(r *rtnl) error {
		var errs []error
		for _, a := range ips {
			if err := r.delRoute(netip.PrefixFrom(a, a.BitLen())); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

func (l *Lab) removeMember(ep Endpoint) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	m := l.members[ep]
	if m == nil {
		l.mu.Unlock()
		return fmt.Errorf("netlab: unknown endpoint %v", ep)
	}
	delete(l.members, ep)
	l.mu.Unlock()

	m.srv.stop()
	m.h.close()
	var errs []error
	if err := withRtnl(m.node.h, func(r *rtnl) error { return r.delLink(m.hostIface) }); err != nil {
		errs = append(errs, err)
	}
	for _, oname := range l.order {
		if o := l.nodes[oname]; o != m.node {
			if err := l.delRemoteRoutes(o, m.ips); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := deleteNetns([]string{m.h.name}); err != nil {
		errs = append(errs, err)
	}
	l.mu.Lock()
	for i, n := range l.created {
		if n == m.h.name {
			l.created = append(l.created[:i], l.created[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	return errors.Join(errs...)
}

// ServeNode replaces the host-network servers of a node (see
// NodeSpec.TCPPorts) with servers on the given ports; no ports stops them.
// Connections being served are cut.
func (l *Lab) ServeNode(node string, tcpPorts, udpPorts []uint16) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	l.mu.RLock()
	n, closed := l.nodes[node], l.closed
	l.mu.RUnlock()
	switch {
	case closed:
		return ErrClosed
	case n == nil:
		return fmt.Errorf("netlab: unknown node %q", node)
	}
	n.srv.stop()
	n.srv = nil
	if len(tcpPorts)+len(udpPorts) == 0 {
		return nil
	}
	srv, err := startServers(n.h, n.name, []netip.Addr{n.ipv4, n.ipv6}, tcpPorts, udpPorts)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.name, err)
	}
	n.srv = srv
	return nil
}
