package scenariogen

import (
	"fmt"
	"math/rand/v2"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// ClusterFraction is the share of seeds that add ClusterNetworkPolicies.
const ClusterFraction = 0.5

// NodeFraction is the share of those seeds that also list the nodes (with
// addresses and labels) and probe to and from them.
const NodeFraction = 0.8

// Node addresses of generated scenarios: node-i has NodeIPv4(i) and, in
// dual-stack scenarios, NodeIPv6(i).
func nodeIPv4(i int) string { return fmt.Sprintf("192.168.1.%d", i) }
func nodeIPv6(i int) string { return fmt.Sprintf("fd00:192:168:1::%d", i) }

var (
	nodeLabelValues = map[string][]string{
		"zone": {"a", "b"},
		"role": {"worker", "infra"},
	}
	cnpPriorities = []int32{0, 5, 10, 10, 20, 1000} // 10 twice: ties
	cnpActions    = []npav1beta1.ClusterNetworkPolicyRuleAction{
		npav1beta1.ClusterNetworkPolicyRuleActionAccept,
		npav1beta1.ClusterNetworkPolicyRuleActionDeny,
		npav1beta1.ClusterNetworkPolicyRuleActionPass,
	}
	nodePorts = []int32{22, 80, 10250}
)

// clusterPart adds, for a fraction of seeds, nodes, ClusterNetworkPolicies
// and probes involving nodes to a generated scenario. It draws from its own
// stream of the seed, so the rest of the scenario is what the seed gave
// before ClusterNetworkPolicies existed, and seeds that draw none are
// unchanged byte for byte.
func (g *gen) clusterPart(seed uint64) {
	c := &gen{r: rand.New(rand.NewPCG(seed, 0x636e705f_6e6f6465)), s: g.s, dual: g.dual}
	if !c.chance(ClusterFraction) {
		return
	}
	withNodes := c.chance(NodeFraction)
	if withNodes {
		for i, name := range Nodes {
			n := scenario.Node{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}
			for _, k := range sortedKeys(nodeLabelValues) {
				if c.chance(0.7) {
					n.Labels[k] = pick(c, nodeLabelValues[k])
				}
			}
			n.IPs = []string{nodeIPv4(i + 1)}
			if c.dual {
				n.IPs = append(n.IPs, nodeIPv6(i+1))
			}
			c.s.Nodes = append(c.s.Nodes, n)
		}
	}
	for i, n := 0, 1+c.intn(4); i < n; i++ {
		c.s.ClusterNetworkPolicies = append(c.s.ClusterNetworkPolicies, c.cnp(i))
	}
	if withNodes {
		c.nodeProbes()
	}
}

func (g *gen) cnp(i int) npav1beta1.ClusterNetworkPolicy {
	tier := npav1beta1.AdminTier
	if g.chance(0.4) {
		tier = npav1beta1.BaselineTier
	}
	p := npav1beta1.ClusterNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i)},
		Spec:       npav1beta1.ClusterNetworkPolicySpec{Tier: tier, Priority: pick(g, cnpPriorities)},
	}
	if g.chance(0.2) {
		p.APIVersion = "policy.networking.k8s.io/v1alpha2"
	}
	if g.chance(0.5) {
		p.Spec.Subject.Namespaces = g.anySelector(nsLabelValues)
	} else {
		p.Spec.Subject.Pods = &npav1beta1.NamespacedPod{NamespaceSelector: *g.anySelector(nsLabelValues), PodSelector: *g.anySelector(podLabelValues)}
	}
	nIn, nEg := g.intn(3), g.intn(4)
	if nIn+nEg == 0 {
		nEg = 1
	}
	for j := 0; j < nIn; j++ {
		r := npav1beta1.ClusterNetworkPolicyIngressRule{Name: g.ruleName(j), Action: pick(g, cnpActions)}
		for k, n := 0, 1+g.intn(2); k < n; k++ {
			if g.chance(0.5) {
				r.From = append(r.From, npav1beta1.ClusterNetworkPolicyIngressPeer{Namespaces: g.anySelector(nsLabelValues)})
			} else {
				r.From = append(r.From, npav1beta1.ClusterNetworkPolicyIngressPeer{Pods: g.namespacedPod()})
			}
		}
		r.Protocols = g.cnpProtocols(true)
		p.Spec.Ingress = append(p.Spec.Ingress, r)
	}
	for j := 0; j < nEg; j++ {
		r := npav1beta1.ClusterNetworkPolicyEgressRule{Name: g.ruleName(j), Action: pick(g, cnpActions)}
		podsOnly := true
		for k, n := 0, 1+g.intn(3); k < n; k++ {
			peer := g.egressPeer()
			podsOnly = podsOnly && (peer.Namespaces != nil || peer.Pods != nil)
			r.To = append(r.To, peer)
		}
		// The API forbids destinationNamedPort next to networks and nodes peers.
		r.Protocols = g.cnpProtocols(podsOnly)
		p.Spec.Egress = append(p.Spec.Egress, r)
	}
	return p
}

// ruleName is empty for some rules: the reason then names the rule's position.
func (g *gen) ruleName(j int) string {
	if g.chance(0.2) {
		return ""
	}
	return fmt.Sprintf("r%d", j)
}

func (g *gen) namespacedPod() *npav1beta1.NamespacedPod {
	return &npav1beta1.NamespacedPod{NamespaceSelector: *g.anySelector(nsLabelValues), PodSelector: *g.anySelector(podLabelValues)}
}

func (g *gen) egressPeer() npav1beta1.ClusterNetworkPolicyEgressPeer {
	switch g.intn(8) {
	case 0, 1:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Namespaces: g.anySelector(nsLabelValues)}
	case 2, 3:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Pods: g.namespacedPod()}
	case 4, 5:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Nodes: g.anySelector(nodeLabelValues)}
	default:
		return npav1beta1.ClusterNetworkPolicyEgressPeer{Networks: g.networks()}
	}
}

// networks picks CIDRs over pods, nodes and external hosts, and the whole
// address space.
func (g *gen) networks() []npav1beta1.CIDR {
	v4 := []string{"0.0.0.0/0", "10.244.0.0/16", "10.244.1.0/24", "192.168.1.0/24", nodeIPv4(1+g.intn(2)) + "/32", "192.0.2.0/24", "198.51.100.0/24"}
	v6 := []string{"::/0", "fd00:10:244::/48", "fd00:192:168:1::/64", "2001:db8::/32"}
	pod := pick(g, g.s.Pods)
	a := pick(g, pod.Addrs())
	var out []npav1beta1.CIDR
	for k, n := 0, 1+g.intn(2); k < n; k++ {
		var c string
		switch {
		case g.chance(0.15):
			c = fmt.Sprintf("%s/%d", a, a.BitLen())
		case g.dual && g.chance(0.4):
			c = pick(g, v6)
		default:
			c = pick(g, v4)
		}
		out = append(out, npav1beta1.CIDR(c))
	}
	return out
}

// cnpProtocols is absent (every protocol) for some rules, else one to three
// entries: tcp, udp or sctp with a port, a range or no port, or (namedOK) a
// destinationNamedPort.
func (g *gen) cnpProtocols(namedOK bool) []npav1beta1.ClusterNetworkPolicyProtocol {
	if g.chance(0.3) {
		return nil
	}
	var out []npav1beta1.ClusterNetworkPolicyProtocol
	for k, n := 0, 1+g.intn(3); k < n; k++ {
		if namedOK && g.chance(0.2) {
			name := pick(g, portNames)
			if g.chance(0.1) {
				name = "missing"
			}
			out = append(out, npav1beta1.ClusterNetworkPolicyProtocol{DestinationNamedPort: name})
			continue
		}
		var port *npav1beta1.Port
		switch x := g.intn(10); {
		case x < 5:
			num := pick(g, slices.Concat(portNumbers, nodePorts))
			port = &npav1beta1.Port{Number: num}
			g.ports = append(g.ports, num)
		case x < 8:
			start := pick(g, portNumbers)
			end := start + 1 + int32(g.intn(12))
			port = &npav1beta1.Port{Range: &npav1beta1.PortRange{Start: start, End: end}}
			g.ports = append(g.ports, start, end, end+1)
		}
		var e npav1beta1.ClusterNetworkPolicyProtocol
		switch x := g.intn(10); {
		case x < 5:
			e.TCP = &npav1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port}
		case x < 9:
			e.UDP = &npav1beta1.ClusterNetworkPolicyProtocolUDP{DestinationPort: port}
		default:
			e.SCTP = &npav1beta1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: port}
		}
		out = append(out, e)
	}
	return out
}

// nodeProbes adds probes from pods to their own node and to the other node,
// and from both nodes to pods, on node ports and the ports policies name.
func (g *gen) nodeProbes() {
	pods := g.s.Pods
	port := func() (int32, string) {
		proto := "TCP"
		if g.chance(0.3) {
			proto = "UDP"
		}
		if len(g.ports) > 0 && g.chance(0.5) {
			return pick(g, g.ports), proto
		}
		return pick(g, nodePorts), proto
	}
	for k, n := 0, 3+g.intn(4); k < n; k++ {
		p := &pods[g.intn(len(pods))]
		node := p.Node
		if g.chance(0.4) {
			node = pick(g, Nodes)
		}
		pr := scenario.Probe{}
		pr.Port, pr.Protocol = port()
		if g.chance(0.6) {
			pr.From, pr.To = scenario.Endpoint{Pod: p.Key()}, scenario.Endpoint{Node: node}
		} else {
			pr.From, pr.To = scenario.Endpoint{Node: node}, scenario.Endpoint{Pod: p.Key()}
		}
		g.s.Probes = append(g.s.Probes, pr)
	}
}
