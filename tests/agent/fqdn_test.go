package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/dnsserver"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// TestAgentLearnsDNS runs the real agents in hybrid mode with a
// ClusterNetworkPolicy that admits the dual-stack x/a only to
// www.example.com: the agent trusts the endpoints of the
// cluster-dns/kube-dns EndpointSlices (--dns-service; one per family,
// created through the API, as the EndpointSlice controller would), learns
// the answers of a real DNS server running in the dual-stack
// cluster-dns/dns pod, and x/a reaches an address of the name once it has
// looked it up, not before, and never an address it did not resolve. Per
// family: an A answer asked at the server's IPv4 address, then an AAAA
// answer asked at its IPv6 address (an A lookup teaches no IPv6 address).
func TestAgentLearnsDNS(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{AgentArgs: []string{"--cluster-policy-check-period", "1s", "--dns-service", "cluster-dns/kube-dns"}})
	ctx := testContext(t, 3*time.Minute)
	for _, ns := range []string{"x", "cluster-dns"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	mustCreatePods(t, ctx, c,
		cluster.Pod{Namespace: "x", Name: "a", Node: "node-1", IPs: addrs("10.244.1.10", "fd00:10:244:1::10")},
		cluster.Pod{Namespace: "cluster-dns", Name: "dns", Node: "node-2", IPs: addrs("10.244.2.53", "fd00:10:244:2::53")},
	)
	// The families: the DNS server's address, the name's answer, and an
	// address of the same host that no lookup returns.
	families := []struct {
		name               string
		v6                 bool
		server             netip.Addr
		answer, unresolved netip.Addr
		sliceType          discoveryv1.AddressType
	}{
		{"IPv4", false, netip.MustParseAddr("10.244.2.53"), netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), discoveryv1.AddressTypeIPv4},
		{"IPv6", true, netip.MustParseAddr("fd00:10:244:2::53"), netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("2001:db8::11"), discoveryv1.AddressTypeIPv6},
	}
	var answers []netip.Addr
	for _, f := range families {
		answers = append(answers, f.answer)
	}
	if err := c.Lab.AddExternal(netlab.ExternalSpec{Name: "web", Node: "node-1", IPs: addrs("192.0.2.10", "192.0.2.11", "2001:db8::10", "2001:db8::11"), TCPPorts: []uint16{80}}); err != nil {
		t.Fatal(err)
	}
	dnsEP, err := c.PodEndpoint("cluster-dns/dns")
	if err != nil {
		t.Fatal(err)
	}
	var srv *dnsserver.Server
	if err := c.Lab.InNetns(dnsEP, func() error {
		var err error
		srv, err = dnsserver.Listen(netip.IPv6Unspecified(), 53, []dnsserver.Record{{Name: "www.example.com", Addrs: answers, TTL: 300}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for _, f := range families {
		if _, err := c.Client.DiscoveryV1().EndpointSlices("cluster-dns").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-" + strings.ToLower(f.name), Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
			AddressType: f.sliceType,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{f.server.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.InstallClusterPolicyCRD(ctx, "experimental"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyClusterPolicy(ctx, ct.CNP("names", "Admin", 10, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")), ct.CNPEgress(
		ct.CNPRule("dns", "Accept", ct.ToNamespaces(ct.Sel("kubernetes.io/metadata.name", "cluster-dns"))),
		ct.CNPRule("web", "Accept", ct.ToDomains("www.example.com")),
		ct.CNPRule("rest", "Deny", ct.ToNetworks("0.0.0.0/0", "::/0")),
	))); err != nil {
		t.Fatal(err)
	}
	// The CRD appears at the agents' next discovery check.
	deadline := time.Now().Add(time.Minute)
	podEP, err := c.PodEndpoint("x/a")
	if err != nil {
		t.Fatal(err)
	}
	probe := func(to netip.Addr) bool {
		ok, err := c.Lab.Probe(ctx, podEP, to, 80, netlab.TCP, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for probe(families[0].answer) {
		if time.Now().After(deadline) {
			t.Fatalf("x/a still reaches %s a minute after the policy was created\n%s", families[0].answer, c.ListTable("node-1"))
		}
		time.Sleep(time.Second)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if probe(f.answer) {
			t.Errorf("%s: x/a reaches %s before resolving www.example.com over %s", f.name, f.answer, f.name)
		}
		var got []netip.Addr
		if err := c.Lab.InNetns(podEP, func() error {
			var err error
			got, err = dnsserver.Lookup(netip.AddrPortFrom(f.server, 53), "www.example.com", f.v6, false, 3*time.Second)
			return err
		}); err != nil || len(got) != 1 || got[0] != f.answer {
			t.Fatalf("%s: lookup from x/a through %s = %v, %v\n%s", f.name, f.server, got, err, c.ListTable("node-1"))
		}
		if !probe(f.answer) {
			t.Errorf("%s: x/a cannot reach %s after resolving www.example.com\n%s\n%s", f.name, f.answer, c.ListTable("node-1"), c.Agent("node-1").LogTail(30))
		}
		if probe(f.unresolved) {
			t.Errorf("%s: x/a reaches %s, which it never resolved", f.name, f.unresolved)
		}
	}
	m, err := c.Agent("node-1").Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m["nftpolicy_dns_replies_learned_total"] < float64(len(families)) {
		var dns []string
		for k, v := range m {
			if strings.HasPrefix(k, "nftpolicy_dns_replies") {
				dns = append(dns, fmt.Sprintf("%s %v", k, v))
			}
		}
		sort.Strings(dns)
		t.Errorf("fewer DNS replies learned than lookups made (%d):\n%s", len(families), strings.Join(dns, "\n"))
	}
}
