// Package netlab builds a simulated Kubernetes cluster out of Linux network
// namespaces so that tests can send real packets through real nftables
// rulesets. It needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN); it never touches
// the caller's own network namespace. Namespaces, links, addresses, routes
// and neighbours are set up in-process (setns + rtnetlink, no child
// processes), so a pod costs a few milliseconds; `ip` is only needed for
// Exec/Command (`ip netns exec`). Namespaces are ordinary named namespaces
// under /run/netns, so `ip netns exec <Netns> nft list ruleset` works.
//
// Topology (all names are prefixed with Config.Prefix):
//
//	<prefix>-sw            underlay "switch": bridge br0, one port per node
//	<prefix>-n-<node>      node: eth0 on the underlay with the node IPs (/32, /128),
//	                       ip_forward=1, IPv6 forwarding=1, rp_filter=0
//	<prefix>-p-<pod>       pod: eth0 with its IPs (/32, /128), default routes via
//	                       169.254.1.1 / fe80::1 (the node side of the veth)
//	<prefix>-x-<name>      external host: routed exactly like a pod, but its
//	                       node-side interface is named ext<N> instead of veth<N>
//
// On its node, every pod/external has a veth (HostIface, veth<N>/ext<N>)
// holding 169.254.1.1/32 and fe80::1/64 (proxy_arp=1) and a /32 (/128) route
// to each of its IPs with the node IP as preferred source. Every other node
// routes those IPs via the owning node's underlay IP. Neighbour entries on all
// links are static (fixed MACs, nud permanent), so there is no ARP/ND and no
// IPv6 DAD (accept_dad=0 plus nodad) anywhere, and New/AddPod wait until the
// kernel has activated every new link (qdisc attached, bridge port
// forwarding, the local route of each IPv6 address installed): the lab is
// usable as soon as they return.
//
// Pods, externals and (optionally) nodes run in-process servers: every TCP
// port accepts, writes "<name>\n" and closes; every UDP port echoes each
// datagram (a datagram starting with "NETLAB-PROBE " is echoed followed by
// "\n<name>" so probes learn who answered). Servers are goroutines using
// sockets created inside the namespace; there are no child processes.
package netlab
