package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// The runner's cluster DNS: a DNS server in a namespace of its own (an
// external host of the lab), which the agents trust (--dns-servers). A pod
// with dnsAnswers resolves its names through it before the probes, so the
// agents learn the answers from real replies.
var (
	ClusterDNSv4 = netip.MustParseAddr("198.18.0.53")
	ClusterDNSv6 = netip.MustParseAddr("2001:db8:ffff::53")
)

// dnsAgentArgs are the agent flags a scenario with dnsAnswers needs: trust
// the runner's DNS, and keep learned answers for the whole run (scenario
// answers do not expire for the evaluator either).
func dnsAgentArgs(s *scenario.Scenario) []string {
	if len(s.DNSAnswers) == 0 {
		return nil
	}
	return []string{"--dns-servers", ClusterDNSv4.String() + "," + ClusterDNSv6.String(), "--fqdn-min-ttl", "1h"}
}

// resolveAnswers starts the runner's DNS, answering each pod its own
// dnsAnswers, and makes every pod look its names up (A for IPv4 answers,
// AAAA for IPv6 ones). A failed lookup is an error: the scenario's
// policies must let the pod reach the DNS (UDP 53 to ClusterDNSv4, or v6).
func resolveAnswers(ctx context.Context, c *cluster.Cluster, s *scenario.Scenario) error {
	if len(s.DNSAnswers) == 0 {
		return nil
	}
	var recs []dnsserver.Record
	for _, a := range s.DNSAnswers {
		r := dnsserver.Record{Name: a.Name, TTL: uint32(a.TTL), Clients: c.PodIPs(a.Pod)}
		for _, ip := range a.IPs {
			r.Addrs = append(r.Addrs, netip.MustParseAddr(ip)) // validated by scenario.Parse
		}
		recs = append(recs, r)
	}
	if err := c.Lab.AddExternal(netlab.ExternalSpec{Name: "cluster-dns", Node: externalNode(c), IPs: []netip.Addr{ClusterDNSv4, ClusterDNSv6}}); err != nil {
		return err
	}
	var srv *dnsserver.Server
	if err := c.Lab.InNetns(netlab.Ext("cluster-dns"), func() error {
		var err error
		srv, err = dnsserver.Listen(netip.IPv6Unspecified(), 53, recs)
		return err
	}); err != nil {
		return fmt.Errorf("starting the cluster DNS: %w", err)
	}
	// The server goes with the lab's namespace; its sockets close when the
	// process ends.
	_ = srv
	for i, a := range s.DNSAnswers {
		ep, err := c.PodEndpoint(a.Pod)
		if err != nil {
			return err
		}
		ips := c.PodIPs(a.Pod)
		server := ClusterDNSv4
		if len(ips) > 0 && !ips[0].Is4() {
			server = ClusterDNSv6
		}
		for _, v6 := range []bool{false, true} {
			if !strings.Contains(strings.Join(a.IPs, " "), map[bool]string{false: ".", true: ":"}[v6]) {
				continue
			}
			if err := c.Lab.InNetns(ep, func() error {
				_, err := dnsserver.Lookup(netip.AddrPortFrom(server, 53), a.Name, v6, false, 3*time.Second)
				return err
			}); err != nil {
				return fmt.Errorf("dnsAnswers[%d]: %s could not resolve %s through the runner's cluster DNS %s (the scenario's policies must let it reach UDP port 53 there): %w",
					i, a.Pod, a.Name, server, err)
			}
		}
	}
	return ctx.Err()
}
