package scenario_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// clusterScenario uses every section the ClusterNetworkPolicy work added:
// nodes, clusterNetworkPolicies (both API versions), dnsAnswers and node
// probe endpoints, next to a host-network pod that takes its node's IP.
const clusterScenario = `
namespaces:
  - {name: x, labels: {ns: x}}
  - {name: y, labels: {ns: y}}
nodes:
  - name: node-1
    labels: {zone: a, kubernetes.io/hostname: node-1}
    ips: [192.168.0.1, "fd00:192:168::1"]
  - {name: node-2, labels: {zone: b}, ips: [192.168.0.2]}
  - {name: node-3}
pods:
  - {namespace: x, name: a, labels: {pod: a}, ip: 10.244.1.10, node: node-1, ports: [{name: http, port: 80}]}
  - {namespace: y, name: b, labels: {pod: b}, ip: 10.244.2.10, node: node-2}
  - {namespace: y, name: host, hostNetwork: true, node: node-2}
  - {namespace: y, name: c, ip: 10.244.9.10, node: node-9}
clusterNetworkPolicies:
  - apiVersion: policy.networking.k8s.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: admin-deny-y}
    spec:
      tier: Admin
      priority: 10
      subject: {namespaces: {matchLabels: {ns: x}}}
      egress:
        - name: no-y
          action: Deny
          to: [{namespaces: {matchLabels: {ns: y}}}]
        - name: kubelet
          action: Accept
          to: [{nodes: {matchLabels: {zone: a}}}]
          protocols: [{tcp: {destinationPort: {number: 10250}}}]
  - apiVersion: policy.networking.k8s.io/v1alpha2
    kind: ClusterNetworkPolicy
    metadata: {name: baseline-nodes}
    spec:
      tier: Baseline
      priority: 5
      subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: a}}}}
      egress:
        - {action: Deny, to: [{nodes: {}}]}
dnsAnswers:
  - {pod: x/a, name: www.example.com, ips: [198.51.100.20], ttl: 300}
probes:
  - {from: {pod: x/a}, to: {node: node-1}, port: 10250}
  - {from: {node: node-2}, to: {pod: x/a}, port: 80}
  - {from: {pod: x/a}, to: {pod: y/host}, port: 80}
  - {from: {ip: "fd00::1"}, to: {node: node-1}, port: 80}
`

func TestParseClusterSections(t *testing.T) {
	s, err := scenario.Parse([]byte(clusterScenario))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(s.Nodes) != 3 || s.Nodes[0].Labels["zone"] != "a" || len(s.Node("node-1").Addrs()) != 2 {
		t.Errorf("nodes: %+v", s.Nodes)
	}
	if len(s.ClusterNetworkPolicies) != 2 || s.ClusterNetworkPolicies[1].Spec.Tier != "Baseline" {
		t.Errorf("clusterNetworkPolicies: %+v", s.ClusterNetworkPolicies)
	}
	if len(s.DNSAnswers) != 1 || s.DNSAnswers[0].TTL != 300 || s.DNSAnswers[0].IPs[0] != "198.51.100.20" {
		t.Errorf("dnsAnswers: %+v", s.DNSAnswers)
	}
	// Listed nodes and the nodes pods name, sorted.
	if got, want := s.NodeNames(nil), []string{"node-1", "node-2", "node-3", "node-9"}; !slices.Equal(got, want) {
		t.Errorf("NodeNames = %v, want %v", got, want)
	}

	for i, want := range []struct{ src, dst string }{
		{"10.244.1.10", "192.168.0.1"},
		{"192.168.0.2", "10.244.1.10"},
		{"10.244.1.10", "192.168.0.2"}, // y/host has node-2's address
		{"fd00::1", "fd00:192:168::1"}, // the node's address of the probe's family
	} {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil || src.String() != want.src || dst.String() != want.dst {
			t.Errorf("probes[%d]: ProbeAddrs = %v, %v, %v; want %s -> %s", i, src, dst, err, want.src, want.dst)
		}
	}

	in := s.Input("", nil, nil)
	if len(in.ClusterPolicies) != 2 || in.ClusterPolicies[0].Name != "admin-deny-y" {
		t.Errorf("Input.ClusterPolicies: %v", in.ClusterPolicies)
	}
	// Only listed nodes are Node objects; node-9, which only a pod names,
	// has no labels or addresses a policy could match.
	var names []string
	for _, n := range in.Nodes {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{"node-1", "node-2", "node-3"}) {
		t.Errorf("Input.Nodes = %v", names)
	}
	n1 := in.Nodes[0]
	if n1.Labels["kubernetes.io/hostname"] != "node-1" || len(n1.Status.Addresses) != 2 ||
		n1.Status.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}) {
		t.Errorf("node-1 object: %+v", n1)
	}
	for _, p := range in.Pods {
		if p.Name == "host" && (p.Status.PodIP != "192.168.0.2" || !p.Spec.HostNetwork) {
			t.Errorf("host-network pod y/host: %+v", p.Status)
		}
	}

	prog := compile.Build(in)
	if len(prog.Problems) > 0 {
		t.Errorf("problems: %v", prog.Problems)
	}
	if got := prog.NodeAddrs["node-1"]; len(got) != 2 {
		t.Errorf("program's node-1 addresses: %v", got)
	}
	a, _ := prog.PodByKey("x/a")
	if !prog.IsOwnNode(&prog.Pods[a], netip.MustParseAddr("192.168.0.1")) {
		t.Errorf("x/a does not see node-1 as its own node")
	}
	if len(prog.Pods[a].AdminEgress) != 1 || len(prog.Pods[a].BaselineEgress) != 1 {
		t.Errorf("x/a: admin egress %v, baseline egress %v", prog.Pods[a].AdminEgress, prog.Pods[a].BaselineEgress)
	}
}

// A scenario without the new sections reads and compiles as before: no
// nodes, no cluster policies.
func TestParseWithoutClusterSections(t *testing.T) {
	s, err := scenario.Parse([]byte(baseScenario))
	if err != nil {
		t.Fatal(err)
	}
	in := s.Input("", nil, nil)
	if len(in.Nodes) != 0 || len(in.ClusterPolicies) != 0 {
		t.Errorf("nodes %v, cluster policies %v", in.Nodes, in.ClusterPolicies)
	}
	if got := s.NodeNames([]string{"d"}); !slices.Equal(got, []string{"d"}) {
		t.Errorf("NodeNames = %v, want the defaults", got)
	}
}

func TestParseClusterRejects(t *testing.T) {
	checkRejects(t, clusterScenario, []rejectCase{
		{"unknown CNP field", "      priority: 10\n", "      priority: 10\n      prio: 1\n", `unknown field "clusterNetworkPolicies[0].spec.prio"`},
		{"unknown node field", "{name: node-3}", "{name: node-3, ip: 192.168.0.3}", `unknown field "nodes[2].ip"`},
		{"unknown dns answer field", "ttl: 300}", "ttl: 300, class: IN}", `unknown field "dnsAnswers[0].class"`},
		{"wrong CNP version", "policy.networking.k8s.io/v1alpha2", "policy.networking.k8s.io/v1", "must be apiVersion policy.networking.k8s.io/v1beta1 or policy.networking.k8s.io/v1alpha2"},
		{"wrong CNP kind", "kind: ClusterNetworkPolicy\n    metadata: {name: admin", "kind: AdminNetworkPolicy\n    metadata: {name: admin", "kind ClusterNetworkPolicy"},
		{"duplicate CNP", "{name: baseline-nodes}", "{name: admin-deny-y}", "clusterNetworkPolicies[1] (admin-deny-y): duplicate ClusterNetworkPolicy"},
		{"namespaced CNP", "{name: baseline-nodes}", "{name: baseline-nodes, namespace: x}", "cluster-scoped"},
		{"bad CNP name", "{name: baseline-nodes}", "{name: Baseline_Nodes}", "metadata.name"},
		{"priority out of range", "priority: 10", "priority: 1001", "spec.priority: 1001 out of range"},
		{"unknown tier", "tier: Admin", "tier: Developer", "spec.tier"},
		{"unknown action", "action: Deny\n          to: [{namespaces", "action: Drop\n          to: [{namespaces", "spec.egress[0].action"},
		{"no peers", "to: [{namespaces: {matchLabels: {ns: y}}}]", "to: []", "spec.egress[0].to"},
		{"two peer fields", "to: [{namespaces: {matchLabels: {ns: y}}}]", "to: [{namespaces: {}, nodes: {}}]", "spec.egress[0].to[0]"},
		{"bad network", "to: [{namespaces: {matchLabels: {ns: y}}}]", "to: [{networks: [10.0.0.0/33]}]", "spec.egress[0].to[0].networks[0]"},
		{"port out of range", "number: 10250", "number: 70000", "spec.egress[1].protocols[0].tcp.destinationPort.number"},
		{"empty range", "{number: 10250}", "{range: {start: 90, end: 90}}", "start 90 must be less than end 90"},
		{"two subject fields", "subject: {namespaces: {matchLabels: {ns: x}}}", "subject: {namespaces: {}, pods: {namespaceSelector: {}, podSelector: {}}}", "spec.subject"},
		{"duplicate node", "{name: node-3}", "{name: node-2}", "nodes[2] (node-2): duplicate node"},
		{"bad node name", "{name: node-3}", "{name: Node_3}", "nodes[2] (Node_3): name"},
		{"bad node label", "labels: {zone: b}", "labels: {zone: b c}", `nodes[1] (node-2).labels: value "b c"`},
		{"bad node IP", "ips: [192.168.0.2]", "ips: [192.168.0.300]", `bad IP "192.168.0.300"`},
		{"two IPv4 on a node", "ips: [192.168.0.2]", "ips: [192.168.0.2, 192.168.0.22]", "nodes[1] (node-2): at most one IP per family"},
		{"node IP of another node", "ips: [192.168.0.2]", "ips: [192.168.0.1]", "already belongs to node node-1"},
		{"pod IP of a node", "ip: 10.244.2.10", "ip: 192.168.0.1", "IP 192.168.0.1 belongs to node node-1"},
		{"host-network pod with another IP", "name: host, hostNetwork: true", "name: host, ip: 10.0.0.1, hostNetwork: true", "not an IP of its node node-2"},
		{"host-network pod without an IP on an unlisted node", "name: host, hostNetwork: true, node: node-2", "name: host, hostNetwork: true, node: node-7", "pods[2] (y/host): needs ip or ips"},
		{"probe to unknown node", "to: {node: node-1}, port: 10250", "to: {node: node-7}, port: 10250", `probes[0].to: unknown node "node-7"`},
		{"probe to node without IPs", "to: {node: node-1}, port: 10250", "to: {node: node-3}, port: 10250", `probes[0].to: node "node-3" has no ips`},
		{"probe to a node and a pod", "to: {node: node-1}, port: 10250", "to: {node: node-1, pod: x/a}, port: 10250", "probes[0].to: give one of pod, node and ip"},
		{"probe family the node lacks", "from: {ip: \"fd00::1\"}, to: {node: node-1}", "from: {ip: \"fd00::1\"}, to: {node: node-2}", "probes[3]: fd00::1 and node:node-2 share no address family"},
		{"DNS answer for unknown pod", "{pod: x/a, name: www", "{pod: x/z, name: www", `dnsAnswers[0]: unknown pod "x/z"`},
		{"bad DNS name", "name: www.example.com", "name: www..example.com", `dnsAnswers[0]: name "www..example.com" is not a DNS name`},
		{"bad DNS IP", "ips: [198.51.100.20]", "ips: [198.51.100.256]", `dnsAnswers[0]: bad IP "198.51.100.256"`},
		{"DNS answer without IPs", "ips: [198.51.100.20]", "ips: []", "dnsAnswers[0]: needs at least one IP"},
		{"negative TTL", "ttl: 300", "ttl: -1", "dnsAnswers[0]: ttl -1 is negative"},
	})
}

// A trailing dot (a fully qualified name) is a DNS name too.
func TestParseDNSAnswerTrailingDot(t *testing.T) {
	if _, err := scenario.Parse([]byte(strings.Replace(clusterScenario, "name: www.example.com", "name: www.example.com.", 1))); err != nil {
		t.Error(err)
	}
}

// The CRD rejects a networks CIDR with bits set beyond its prefix length
// (cidr(self) == cidr(self).masked()), as the API server does for ipBlock.
func TestParseRejectsNetworkHostBits(t *testing.T) {
	_, err := scenario.Parse([]byte(strings.Replace(clusterScenario,
		"to: [{namespaces: {matchLabels: {ns: y}}}]", "to: [{networks: [10.0.0.1/8]}]", 1)))
	if err == nil {
		t.Fatal("a networks CIDR with host bits was accepted")
	}
	if !strings.Contains(err.Error(), "spec.egress[0].to[0].networks[0]") {
		t.Errorf("error %q does not name the CIDR", err)
	}
}
