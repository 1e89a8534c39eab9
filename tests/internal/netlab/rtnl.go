package netlab

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A minimal rtnetlink client: just the requests the lab needs (veth/bridge
// links, addresses, routes, static neighbours). Doing this in-process instead
// of running `ip` keeps AddPod in the low milliseconds even on machines where
// spawning a process costs tens of milliseconds.

const vethInfoPeer = 1 // VETH_INFO_PEER

var ne = binary.NativeEndian

type rtnl struct {
	fd  int
	ns  string
	seq uint32
	buf []byte
}

// rtnl opens a NETLINK_ROUTE socket bound to the namespace.
func (h *nsHandle) rtnl() (*rtnl, error) {
	fd := -1
	err := h.run(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket in %s: %w", h.name, err)
	}
	// Best effort: error strings from the kernel, no echo of the request.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &rtnl{fd: fd, ns: h.name, buf: make([]byte, 64<<10)}, nil
}

func (r *rtnl) close() { unix.Close(r.fd) }

// msg builds a netlink message body: a fixed header followed by attributes.
type msg struct{ b []byte }

func (m *msg) align() {
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

func (m *msg) attr(typ uint16, data []byte) {
	m.align()
	m.b = ne.AppendUint16(m.b, uint16(4+len(data)))
	m.b = ne.AppendUint16(m.b, typ)
	m.b = append(m.b, data...)
	m.align()
}

func (m *msg) str(typ uint16, s string) { m.attr(typ, append([]byte(s), 0)) }

func (m *msg) u32(typ uint16, v uint32) { m.attr(typ, ne.AppendUint32(nil, v)) }

func (m *msg) ip(typ uint16, a netip.Addr) { m.attr(typ, a.AsSlice()) }

func (m *msg) nest(typ uint16, fn func()) {
	m.align()
	start := len(m.b)
	m.b = append(m.b, 0, 0, 0, 0)
	fn()
	ne.PutUint16(m.b[start:], uint16(len(m.b)-start))
	ne.PutUint16(m.b[start+2:], typ|unix.NLA_F_NESTED)
}

func ifinfomsg(m *msg, family uint8, index int32, flags, change uint32) {
	m.b = append(m.b, family, 0, 0, 0)
	m.b = ne.AppendUint32(m.b, uint32(index))
	m.b = ne.AppendUint32(m.b, flags)
	m.b = ne.AppendUint32(m.b, change)
}

func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// do sends one request and waits for the kernel's acknowledgement, returning
// the payloads of any replies (e.g. for RTM_GETLINK).
func (r *rtnl) do(typ, flags uint16, body []byte) ([][]byte, error) {
	r.seq++
	req := make([]byte, 0, unix.NLMSG_HDRLEN+len(body))
	req = ne.AppendUint32(req, uint32(unix.NLMSG_HDRLEN+len(body)))
	req = ne.AppendUint16(req, typ)
	req = ne.AppendUint16(req, flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	req = ne.AppendUint32(req, r.seq)
	req = ne.AppendUint32(req, 0)
	req = append(req, body...)
	if err := unix.Sendto(r.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var replies [][]byte
	for {
		n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != r.seq {
				continue
			}
			if m.Header.Type == unix.NLMSG_DONE { // the end of a dump
				return replies, nil
			}
			if m.Header.Type != unix.NLMSG_ERROR {
				replies = append(replies, append([]byte(nil), m.Data...))
				continue
			}
			if len(m.Data) < 4 {
				return nil, fmt.Errorf("short netlink error message")
			}
			errno := int32(ne.Uint32(m.Data))
			if errno == 0 {
				return replies, nil
			}
			err := error(unix.Errno(-errno))
			if text := extAckMsg(m.Header.Flags, m.Data); text != "" {
				err = fmt.Errorf("%w (%s)", err, text)
			}
			return nil, err
		}
	}
}

// extAckMsg extracts NLMSGERR_ATTR_MSG from an NLMSG_ERROR payload.
func extAckMsg(flags uint16, data []byte) string {
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(data) < 4+unix.NLMSG_HDRLEN {
		return ""
	}
	off := 4 + unix.NLMSG_HDRLEN
	if flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(ne.Uint32(data[4:]))
	}
	for off+4 <= len(data) {
		l, t := int(ne.Uint16(data[off:])), ne.Uint16(data[off+2:])
		if l < 4 || off+l > len(data) {
			break
		}
		if t == unix.NLMSGERR_ATTR_MSG {
			s := data[off+4 : off+l]
			for len(s) > 0 && s[len(s)-1] == 0 {
				s = s[:len(s)-1]
			}
			return string(s)
		}
		off += (l + 3) &^ 3
	}
	return ""
}

func (r *rtnl) wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %s: %w", r.ns, fmt.Sprintf(format, args...), err)
}

// linkIndex returns the ifindex of the named interface.
func (r *rtnl) linkIndex(name string) (int32, error) {
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, 0, 0, 0)
	m.str(unix.IFLA_IFNAME, name)
	replies, err := r.do(unix.RTM_GETLINK, 0, m.b)
	if err != nil {
		return 0, r.wrap(err, "get link %s", name)
	}
	for _, p := range replies {
		if len(p) >= unix.SizeofIfInfomsg {
			return int32(ne.Uint32(p[4:])), nil
		}
	}
	return 0, fmt.Errorf("%s: get link %s: no reply", r.ns, name)
}

// addVeth creates name (in r's namespace) paired with peer, which is created
// directly in the namespace referred to by peerNS (an open netns fd).
func (r *rtnl) addVeth(name, mac, peer, peerMAC string, peerNS int) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	peerHW, err := net.ParseMAC(peerMAC)
	if err != nil {
		return err
	}
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, 0, 0, 0)
	m.str(unix.IFLA_IFNAME, name)
	m.attr(unix.IFLA_ADDRESS, hw)
	m.nest(unix.IFLA_LINKINFO, func() {
		m.str(unix.IFLA_INFO_KIND, "veth")
		m.nest(unix.IFLA_INFO_DATA, func() {
			m.nest(vethInfoPeer, func() {
				ifinfomsg(m, unix.AF_UNSPEC, 0, 0, 0)
				m.str(unix.IFLA_IFNAME, peer)
				m.attr(unix.IFLA_ADDRESS, peerHW)
				m.u32(unix.IFLA_NET_NS_FD, uint32(peerNS))
			})
		})
	})
	_, err = r.do(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, m.b)
	return r.wrap(err, "add veth %s/%s", name, peer)
}

func (r *rtnl) addBridge(name string) error {
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, 0, 0, 0)
	m.str(unix.IFLA_IFNAME, name)
	m.nest(unix.IFLA_LINKINFO, func() { m.str(unix.IFLA_INFO_KIND, "bridge") })
	_, err := r.do(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, m.b)
	return r.wrap(err, "add bridge %s", name)
}

// setUp brings the link up and, if master > 0, enslaves it.
func (r *rtnl) setUp(index, master int32) error {
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, index, unix.IFF_UP, unix.IFF_UP)
	if master > 0 {
		m.u32(unix.IFLA_MASTER, uint32(master))
	}
	_, err := r.do(unix.RTM_NEWLINK, 0, m.b)
	return r.wrap(err, "set link %d up", index)
}

func (r *rtnl) delLink(name string) error {
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, 0, 0, 0)
	m.str(unix.IFLA_IFNAME, name)
	_, err := r.do(unix.RTM_DELLINK, 0, m.b)
	return r.wrap(err, "del link %s", name)
}

// addAddr adds a/bits to the link, without IPv6 duplicate address detection.
func (r *rtnl) addAddr(index int32, p netip.Prefix) error {
	a := p.Addr()
	m := &msg{}
	m.b = append(m.b, family(a), uint8(p.Bits()), unix.IFA_F_NODAD, unix.RT_SCOPE_UNIVERSE)
	if a.IsLinkLocalUnicast() {
		m.b[3] = unix.RT_SCOPE_LINK
	}
	m.b = ne.AppendUint32(m.b, uint32(index))
	m.ip(unix.IFA_LOCAL, a)
	m.ip(unix.IFA_ADDRESS, a)
	_, err := r.do(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, m.b)
	return r.wrap(err, "add addr %v dev %d", p, index)
}

// route describes a main-table unicast route.
type route struct {
	dst    netip.Prefix
	oif    int32
	gw     netip.Addr // optional
	src    netip.Addr // optional preferred source
	onlink bool
}

func (r *rtnl) addRoute(rt route) error {
	m := &msg{}
	scope := uint8(unix.RT_SCOPE_UNIVERSE)
	if !rt.gw.IsValid() && rt.dst.Addr().Is4() {
		scope = unix.RT_SCOPE_LINK
	}
	var flags uint32
	if rt.onlink {
		flags = unix.RTNH_F_ONLINK
	}
	m.b = append(m.b, family(rt.dst.Addr()), uint8(rt.dst.Bits()), 0, 0,
		unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, scope, unix.RTN_UNICAST)
	m.b = ne.AppendUint32(m.b, flags)
	if rt.dst.Bits() > 0 {
		m.ip(unix.RTA_DST, rt.dst.Addr())
	}
	m.u32(unix.RTA_OIF, uint32(rt.oif))
	if rt.gw.IsValid() {
		m.ip(unix.RTA_GATEWAY, rt.gw)
	}
	if rt.src.IsValid() {
		m.ip(unix.RTA_PREFSRC, rt.src)
	}
	_, err := r.do(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, m.b)
	return r.wrap(err, "add route %v", rt.dst)
}

func (r *rtnl) delRoute(dst netip.Prefix) error {
	m := &msg{}
	m.b = append(m.b, family(dst.Addr()), uint8(dst.Bits()), 0, 0,
		unix.RT_TABLE_MAIN, 0, unix.RT_SCOPE_NOWHERE, 0)
	m.b = ne.AppendUint32(m.b, 0)
	m.ip(unix.RTA_DST, dst.Addr())
	_, err := r.do(unix.RTM_DELROUTE, 0, m.b)
	return r.wrap(err, "del route %v", dst)
}

// addNeigh installs a permanent neighbour entry.
func (r *rtnl) addNeigh(index int32, a netip.Addr, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	m := &msg{}
	m.b = append(m.b, family(a), 0, 0, 0)
	m.b = ne.AppendUint32(m.b, uint32(index))
	m.b = ne.AppendUint16(m.b, unix.NUD_PERMANENT)
	m.b = append(m.b, 0, 0) // flags, type
	m.ip(unix.NDA_DST, a)
	m.attr(unix.NDA_LLADDR, hw)
	_, err = r.do(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, m.b)
	return r.wrap(err, "add neigh %v", a)
}

// parseAttrs splits a sequence of netlink attributes by type.
func parseAttrs(b []byte) map[uint16][]byte {
	out := map[uint16][]byte{}
	for len(b) >= 4 {
		l := int(ne.Uint16(b))
		if l < 4 || l > len(b) {
			break
		}
		out[ne.Uint16(b[2:])&0x3fff] = b[4:l] // strip NLA_F_NESTED/NET_BYTEORDER
		b = b[min((l+3)&^3, len(b)):]
	}
	return out
}

const (
	ifOperUp          = 6 // IF_OPER_UP
	brStateForwarding = 3 // BR_STATE_FORWARDING
)

// linkReady reports whether the link can carry traffic: operationally up,
// its qdisc attached (until the kernel's linkwatch work runs after a carrier
// change, a device keeps the "noop" qdisc that drops every packet), for
// bridge ports in forwarding state, and its IPv6 addresses usable (see
// ipv6Tentative).
func (r *rtnl) linkReady(index int32) (bool, error) {
	if ok, err := r.linkUp(index); !ok || err != nil {
		return ok, err
	}
	pending, err := r.ipv6Pending(index)
	return !pending, err
}

// ipv6Pending reports whether an IPv6 address of the link has no local
// route yet. Even with IFA_F_NODAD the kernel adds that route from its
// DAD work, queued when the address is added or the link gets its
// carrier: until it runs a packet to the address is dropped
// (Ip6InAddrErrors), which lost the first IPv6 packet to a new pod or
// external host now and then.
func (r *rtnl) ipv6Pending(index int32) (bool, error) {
	m := &msg{}
	m.b = append(m.b, unix.AF_INET6, 0, 0, 0)
	m.b = ne.AppendUint32(m.b, 0)
	replies, err := r.do(unix.RTM_GETADDR, unix.NLM_F_DUMP, m.b)
	if err != nil {
		return false, r.wrap(err, "list IPv6 addresses")
	}
	for _, p := range replies {
		if len(p) < unix.SizeofIfAddrmsg || int32(ne.Uint32(p[4:8])) != index {
			continue
		}
		a, ok := netip.AddrFromSlice(parseAttrs(p[unix.SizeofIfAddrmsg:])[unix.IFA_ADDRESS])
		if !ok {
			continue
		}
		rt := &msg{}
		rt.b = append(rt.b, unix.AF_INET6, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
		rt.ip(unix.RTA_DST, a)
		if a.IsLinkLocalUnicast() {
			rt.u32(unix.RTA_OIF, uint32(index))
		}
		got, err := r.do(unix.RTM_GETROUTE, 0, rt.b)
		if err != nil {
			return false, r.wrap(err, "route to %v", a)
		}
		if len(got) == 0 || len(got[0]) < unix.SizeofRtMsg || got[0][7] != unix.RTN_LOCAL {
			return true, nil
		}
	}
	return false, nil
}

// linkUp is linkReady without the addresses.
func (r *rtnl) linkUp(index int32) (bool, error) {
	m := &msg{}
	ifinfomsg(m, unix.AF_UNSPEC, index, 0, 0)
	replies, err := r.do(unix.RTM_GETLINK, 0, m.b)
	if err != nil {
		return false, r.wrap(err, "get link %d", index)
	}
	for _, p := range replies {
		if len(p) < unix.SizeofIfInfomsg {
			continue
		}
		attrs := parseAttrs(p[unix.SizeofIfInfomsg:])
		if st := attrs[unix.IFLA_OPERSTATE]; len(st) < 1 || st[0] != ifOperUp {
			return false, nil
		}
		if q := attrs[unix.IFLA_QDISC]; len(q) == 0 || string(q[:len(q)-1]) == "noop" {
			return false, nil
		}
		if li := attrs[unix.IFLA_LINKINFO]; li != nil {
			if sd := parseAttrs(li)[unix.IFLA_INFO_SLAVE_DATA]; sd != nil {
				if st := parseAttrs(sd)[unix.IFLA_BRPORT_STATE]; len(st) > 0 && st[0] != brStateForwarding {
					return false, nil
				}
			}
		}
		return true, nil
	}
	return false, fmt.Errorf("%s: get link %d: no reply", r.ns, index)
}

// linkReadyTimeout bounds waitReady; linkwatch normally runs within
// milliseconds but is delayed while other work holds the RTNL lock.
const linkReadyTimeout = 10 * time.Second

// waitReady polls until all given links are ready (see linkReady).
func (r *rtnl) waitReady(indexes ...int32) error {
	deadline := time.Now().Add(linkReadyTimeout)
	for _, idx := range indexes {
		for {
			ok, err := r.linkReady(idx)
			if err != nil {
				return err
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: link %d not ready after %v", r.ns, idx, linkReadyTimeout)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}
