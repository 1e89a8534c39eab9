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
// ClusterNetworkPolicy that admits x/a only to www.example.com: the agent
// trusts the endpoints of the cluster-dns/kube-dns EndpointSlice (--dns-service) (created
// through the API, as the EndpointSlice controller would), learns the
// answer of a real DNS server running in the cluster-dns/dns pod, and
// x/a reaches the address once it has looked the name up, not before.
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
		cluster.Pod{Namespace: "x", Name: "a", Node: "node-1"},
		cluster.Pod{Namespace: "cluster-dns", Name: "dns", Node: "node-2"},
	)
	ext := netip.MustParseAddr("192.0.2.10")
	if err := c.Lab.AddExternal(netlab.ExternalSpec{Name: "web", Node: "node-1", IPs: []netip.Addr{ext}, TCPPorts: []uint16{80}}); err != nil {
		t.Fatal(err)
	}
	dnsIP := c.PodIPs("cluster-dns/dns")[0]
	dnsEP, err := c.PodEndpoint("cluster-dns/dns")
	if err != nil {
		t.Fatal(err)
	}
	var srv *dnsserver.Server
	if err := c.Lab.InNetns(dnsEP, func() error {
		var err error
		srv, err = dnsserver.Listen(netip.IPv6Unspecified(), 53, []dnsserver.Record{{Name: "www.example.com", Addrs: []netip.Addr{ext}, TTL: 300}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if _, err := c.Client.DiscoveryV1().EndpointSlices("cluster-dns").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kube-dns-x1", Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{dnsIP.String()}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallClusterPolicyCRD(ctx, "experimental"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyClusterPolicy(ctx, ct.CNP("names", "Admin", 10, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")), ct.CNPEgress(
		ct.CNPRule("dns", "Accept", ct.ToNamespaces(ct.Sel("kubernetes.io/metadata.name", "cluster-dns"))),
		ct.CNPRule("web", "Accept", ct.ToDomains("www.example.com")),
		ct.CNPRule("rest", "Deny", ct.ToNetworks("0.0.0.0/0")),
	))); err != nil {
		t.Fatal(err)
	}
	// The CRD appears at the agents' next discovery check.
	deadline := time.Now().Add(time.Minute)
	podEP, err := c.PodEndpoint("x/a")
	if err != nil {
		t.Fatal(err)
	}
	probe := func() bool {
		ok, err := c.Lab.Probe(ctx, podEP, ext, 80, netlab.TCP, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for probe() {
		if time.Now().After(deadline) {
			t.Fatalf("x/a still reaches %s a minute after the policy was created\n%s", ext, c.ListTable("node-1"))
		}
		time.Sleep(time.Second)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	if err := c.Lab.InNetns(podEP, func() error {
		var err error
		got, err = dnsserver.Lookup(netip.AddrPortFrom(dnsIP, 53), "www.example.com", false, false, 3*time.Second)
		return err
	}); err != nil || len(got) != 1 || got[0] != ext {
		t.Fatalf("lookup from x/a = %v, %v\n%s", got, err, c.ListTable("node-1"))
	}
	if !probe() {
		t.Errorf("x/a cannot reach %s after resolving www.example.com\n%s\n%s", ext, c.ListTable("node-1"), c.Agent("node-1").LogTail(30))
	}
	m, err := c.Agent("node-1").Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m["nftpolicy_dns_replies_learned_total"] < 1 {
		var dns []string
		for k, v := range m {
			if strings.HasPrefix(k, "nftpolicy_dns_replies") {
				dns = append(dns, fmt.Sprintf("%s %v", k, v))
			}
		}
		sort.Strings(dns)
		t.Errorf("no DNS reply learned:\n%s", strings.Join(dns, "\n"))
	}
}
