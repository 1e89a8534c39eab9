package lab

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// FQDNScenario: x/a (node-1) may reach kube-system and, on TCP 80 and
// 8080, the names of rule "web"; everything else is denied. The DNS
// servers run in kube-system pods on node-2, so replies cross node-1's
// forward hook. The probes only make the lab create the external hosts.
const FQDNScenario = `
pods:
  - {namespace: x, name: a, labels: {app: a}, ips: [10.244.1.10, "fd00:10:244:1::10"], node: node-1}
  - {namespace: kube-system, name: dns, labels: {app: dns}, ips: [10.244.2.53, "fd00:10:244:2::53"], node: node-2}
  - {namespace: kube-system, name: rogue, labels: {app: rogue}, ip: 10.244.2.54, node: node-2}
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: fqdn}
    spec:
      tier: Admin
      priority: 10
      subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
      egress:
        - name: dns
          action: Accept
          to: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: kube-system}}}]
        - name: web
          action: Accept
          to: [{domainNames: [www.example.com, "*.example.org", api.example.com]}]
          protocols: [{tcp: {destinationPort: {number: 80}}}, {tcp: {destinationPort: {number: 8080}}}]
        - name: rest
          action: Deny
          to: [{networks: [0.0.0.0/0, "::/0"]}]
probes:
  - {from: {pod: x/a}, to: {ip: 192.0.2.10}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.11}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.12}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.13}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.14}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.15}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.16}, port: 80}
  - {from: {pod: x/a}, to: {ip: 192.0.2.17}, port: 80}
  - {from: {pod: x/a}, to: {ip: "2001:db8::10"}, port: 80}
  - {from: {pod: x/a}, to: {ip: "2001:db8::11"}, port: 80}
  - {from: {pod: x/a}, to: {ip: "2001:db8::12"}, port: 80}
`

// The DNS servers of the FQDN lab: the cluster DNS, whose replies are
// learned, at its IPv4 and IPv6 addresses, and a rogue one, whose replies
// are not.
var (
	FQDNServer      = netip.MustParseAddr("10.244.2.53")
	FQDNServerV6    = netip.MustParseAddr("fd00:10:244:2::53")
	FQDNRogueServer = netip.MustParseAddr("10.244.2.54")
)

// FQDNRecords are the cluster DNS's names.
var FQDNRecords = []dnsserver.Record{
	{Name: "www.example.com", Addrs: addrs("192.0.2.10", "2001:db8::10"), TTL: 300},
	{Name: "a.b.example.org", Addrs: addrs("192.0.2.11"), TTL: 300},
	{Name: "example.org", Addrs: addrs("192.0.2.12"), TTL: 300},
	{Name: "api.example.com", CNAME: "lb.cdn.test", TTL: 300},
	{Name: "lb.cdn.test", Addrs: addrs("192.0.2.13"), TTL: 300},
	{Name: "tcp.example.org", Addrs: addrs("192.0.2.15"), TTL: 300},
	{Name: "trunc.example.org", Addrs: addrs("192.0.2.16"), TTL: 300, Truncated: true},
	{Name: "short.example.org", Addrs: addrs("192.0.2.17"), TTL: 2},
	{Name: "v6.example.org", Addrs: addrs("2001:db8::11"), TTL: 300},
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// FQDNLab is FQDNScenario enforced, with both DNS servers running and the
// cluster DNS trusted by every node's learner.
type FQDNLab struct {
	*Lab
	// Pod is x/a, the policy's subject.
	Pod     netlab.Endpoint
	servers []*dnsserver.Server
	// cluster is the cluster DNS's server (also in servers).
	cluster *dnsserver.Server
}

// NewFQDNLab builds the lab. Close it.
func NewFQDNLab(ctx context.Context, cfg Config) (_ *FQDNLab, err error) {
	s, err := scenario.Parse([]byte(FQDNScenario))
	if err != nil {
		return nil, err
	}
	c, err := New(ctx, s, cfg)
	if err != nil {
		return nil, err
	}
	l := &FQDNLab{Lab: c}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	if _, err := c.Apply(ctx, s, false); err != nil {
		return nil, err
	}
	l.Pod, _ = c.PodEndpoint("x/a")
	for key, recs := range map[string][]dnsserver.Record{
		"kube-system/dns":   FQDNRecords,
		"kube-system/rogue": {{Name: "www.example.com", Addrs: addrs("192.0.2.14"), TTL: 300}},
	} {
		ep, _ := c.PodEndpoint(key)
		if err := c.Net().InNetns(ep, func() error {
			srv, err := dnsserver.Listen(netip.IPv6Unspecified(), 53, recs)
			if err == nil {
				l.servers = append(l.servers, srv)
				if key == "kube-system/dns" {
					l.cluster = srv
				}
			}
			return err
		}); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes() {
		if d := c.Agent(n).DNS(); d.Sources != nil {
			d.Sources.SetEndpoints([]netip.Addr{FQDNServer, FQDNServerV6})
		}
	}
	return l, nil
}

// Lookup resolves name from x/a through server.
func (l *FQDNLab) Lookup(server netip.Addr, name string, v6, tcp bool) ([]netip.Addr, error) {
	var out []netip.Addr
	err := l.Net().InNetns(l.Pod, func() error {
		var err error
		out, err = dnsserver.Lookup(netip.AddrPortFrom(server, 53), name, v6, tcp, 2*time.Second)
		return err
	})
	return out, err
}

// Close stops the DNS servers and the lab.
func (l *FQDNLab) Close() error {
	var errs []error
	for _, s := range l.servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(append(errs, l.Lab.Close())...)
}

// SetClusterDNS replaces the cluster DNS server's records (FQDNRecords
// at first).
func (l *FQDNLab) SetClusterDNS(records []dnsserver.Record) { l.cluster.Set(records) }

// FQDNCounter reads one counter of a learner's metrics: the series whose
// only label has the value label, or the first series when label is "";
// 0 when there is none.
func FQDNCounter(m *fqdn.Metrics, name, label string) (float64, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		return 0, err
	}
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if label == "" || (len(s.GetLabel()) == 1 && s.GetLabel()[0].GetValue() == label) {
				if s.GetCounter() != nil {
					return s.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}
