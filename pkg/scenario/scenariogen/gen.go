package scenariogen

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// Nodes are the nodes pods are placed on.
var Nodes = []string{"node-1", "node-2"}

// MaxPods bounds the pods of a scenario, so that one runs in seconds.
const MaxPods = 8

// Generate returns the scenario of a seed.
func Generate(seed uint64) *scenario.Scenario { return generate(seed, true) }

// generate is Generate with or without the domainNames stream (appended
// last; tests of older seeds leave it out).
func generate(seed uint64, domains bool) *scenario.Scenario {
	g := &gen{r: rand.New(rand.NewPCG(seed, 0x6e667470_6f6c6963))}
	s := g.scenario()
	g.clusterPart(seed)
	if domains {
		g.domainPart(seed)
	}
	g.stagedPart(seed)
	return s
}

// YAML marshals a scenario in the scenario format.
func YAML(s *scenario.Scenario) ([]byte, error) { return yaml.Marshal(s) }

type gen struct {
	r     *rand.Rand
	s     *scenario.Scenario
	dual  bool
	ports []int32 // numbers the policies mention, for probes to hit
}

func (g *gen) intn(n int) int        { return g.r.IntN(n) }
func (g *gen) chance(p float64) bool { return g.r.Float64() < p }

func pick[T any](g *gen, xs []T) T { return xs[g.r.IntN(len(xs))] }

// Label vocabulary: keys some objects have and others lack.
var (
	nsLabelValues = map[string][]string{
		"env":  {"prod", "dev"},
		"team": {"a", "b"},
		"ns":   nil, // the namespace's name
	}
	podLabelValues = map[string][]string{
		"app":  {"web", "db", "api"},
		"tier": {"fe", "be"},
		"pod":  nil, // the pod's name
	}
	portNames   = []string{"http", "metrics", "dns", "grpc"}
	portNumbers = []int32{53, 80, 81, 443, 5353, 8080, 9090}
	protocols   = []string{"TCP", "UDP", "SCTP"}
	externalV4  = []string{"192.0.2.10", "192.0.2.200", "198.51.100.20", "203.0.113.5", "10.244.3.9"}
	externalV6  = []string{"2001:db8::10", "2001:db8:1::20", "fd00:10:244:3::9"}
)

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (g *gen) scenario() *scenario.Scenario {
	g.s = &scenario.Scenario{}
	g.dual = g.chance(0.4)
	g.namespaces()
	g.pods()
	n := 1 + g.intn(5)
	for i := 0; i < n; i++ {
		g.s.Policies = append(g.s.Policies, g.policy(i))
	}
	g.probes()
	return g.s
}

func (g *gen) namespaces() {
	names := []string{"x", "y", "z"}[:2+g.intn(2)]
	for _, name := range names {
		ns := scenario.Namespace{Name: name, Labels: map[string]string{}}
		for _, k := range sortedKeys(nsLabelValues) {
			if !g.chance(0.6) {
				continue
			}
			if vals := nsLabelValues[k]; vals != nil {
				ns.Labels[k] = pick(g, vals)
			} else {
				ns.Labels[k] = name
			}
		}
		if len(ns.Labels) == 0 {
			ns.Labels = nil
		}
		g.s.Namespaces = append(g.s.Namespaces, ns)
	}
}

func (g *gen) pods() {
	n := 3 + g.intn(MaxPods-2)
	perNS := map[string]int{}
	v6only := 0
	for i := 0; i < n; i++ {
		ns := pick(g, g.s.Namespaces).Name
		name := string(rune('a' + perNS[ns]))
		perNS[ns]++
		node := 1 + g.intn(2)
		if i < 2 {
			node = 1 + i // both nodes always host pods
		}
		p := scenario.Pod{Namespace: ns, Name: name, Node: Nodes[node-1], Labels: map[string]string{}}
		for _, k := range sortedKeys(podLabelValues) {
			if !g.chance(0.65) {
				continue
			}
			if vals := podLabelValues[k]; vals != nil {
				p.Labels[k] = pick(g, vals)
			} else {
				p.Labels[k] = name
			}
		}
		if len(p.Labels) == 0 {
			p.Labels = nil
		}
		v4 := fmt.Sprintf("10.244.%d.%d", node, 10+i)
		v6 := fmt.Sprintf("fd00:10:244:%d::%x", node, 0x10+i)
		switch {
		case !g.dual:
			p.IP = v4
		case i >= 2 && v6only < 2 && g.chance(0.25):
			p.IPs = []string{v6}
			v6only++
		default:
			p.IPs = []string{v4, v6}
		}
		used := map[string]bool{}
		for j, k := 0, g.intn(4); j < k; j++ {
			name := pick(g, portNames)
			if used[name] {
				continue
			}
			used[name] = true
			cp := scenario.Port{Name: name, Port: pick(g, portNumbers)}
			switch x := g.intn(10); {
			case x < 6:
			case x < 7:
				cp.Protocol = "TCP"
			case x < 9:
				cp.Protocol = "UDP"
			default:
				cp.Protocol = "SCTP"
			}
			p.Ports = append(p.Ports, cp)
		}
		g.s.Pods = append(g.s.Pods, p)
	}
}

func (g *gen) policy(i int) networkingv1.NetworkPolicy {
	np := networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: pick(g, g.s.Namespaces).Name},
	}
	switch x := g.intn(10); {
	case x < 3:
		// {}: every pod of the namespace.
	case x < 7:
		np.Spec.PodSelector = g.matchLabels(podLabelValues, np.Namespace)
	default:
		np.Spec.PodSelector = *g.selector(podLabelValues)
	}
	var ingress, egress bool
	switch g.intn(5) {
	case 0: // omitted: Ingress, plus Egress when there are egress rules
		ingress, egress = true, g.chance(0.5)
	case 1:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		ingress = true
	case 2:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		egress = true
	case 3:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		ingress, egress = true, true
	default:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}
		ingress, egress = true, true
	}
	// Rules of a direction policyTypes leaves out are stored and ignored.
	if ingress || g.chance(0.1) {
		for j, n := 0, g.intn(4); j < n; j++ {
			r := networkingv1.NetworkPolicyIngressRule{}
			r.From, r.Ports = g.rule()
			np.Spec.Ingress = append(np.Spec.Ingress, r)
		}
	}
	if egress || (np.Spec.PolicyTypes != nil && g.chance(0.1)) {
		n := g.intn(4)
		if np.Spec.PolicyTypes == nil && n == 0 {
			n = 1 // omitted policyTypes: egress rules are what make it Egress
		}
		for j := 0; j < n; j++ {
			r := networkingv1.NetworkPolicyEgressRule{}
			r.To, r.Ports = g.rule()
			np.Spec.Egress = append(np.Spec.Egress, r)
		}
	}
	return np
}

func (g *gen) rule() ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort) {
	if g.chance(0.1) {
		return nil, nil // {}: everything
	}
	var peers []networkingv1.NetworkPolicyPeer
	if !g.chance(0.35) {
		for j, n := 0, 1+g.intn(3); j < n; j++ {
			peers = append(peers, g.peer())
		}
	}
	var ports []networkingv1.NetworkPolicyPort
	if !g.chance(0.35) {
		for j, n := 0, 1+g.intn(3); j < n; j++ {
			ports = append(ports, g.port())
		}
	}
	return peers, ports
}

func (g *gen) peer() networkingv1.NetworkPolicyPeer {
	switch g.intn(7) {
	case 0, 1:
		return networkingv1.NetworkPolicyPeer{PodSelector: g.anySelector(podLabelValues)}
	case 2, 3:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: g.anySelector(nsLabelValues)}
	case 4:
		return networkingv1.NetworkPolicyPeer{PodSelector: g.anySelector(podLabelValues), NamespaceSelector: g.anySelector(nsLabelValues)}
	default:
		return networkingv1.NetworkPolicyPeer{IPBlock: g.ipBlock()}
	}
}

// anySelector is empty, matchLabels or expressions.
func (g *gen) anySelector(vocab map[string][]string) *metav1.LabelSelector {
	switch g.intn(4) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		sel := g.matchLabels(vocab, "")
		return &sel
	default:
		return g.selector(vocab)
	}
}

// labelValue picks a value for key: from the vocabulary, or for the
// name-valued keys a namespace or pod name (self when given).
func (g *gen) labelValue(vocab map[string][]string, key, self string) string {
	if vals := vocab[key]; vals != nil {
		return pick(g, vals)
	}
	if self != "" && g.chance(0.5) {
		return self
	}
	if _, ok := vocab["ns"]; ok {
		return pick(g, g.s.Namespaces).Name
	}
	return pick(g, g.s.Pods).Name
}

func (g *gen) matchLabels(vocab map[string][]string, self string) metav1.LabelSelector {
	sel := metav1.LabelSelector{MatchLabels: map[string]string{}}
	keys := sortedKeys(vocab)
	if _, ok := vocab["ns"]; ok && g.chance(0.2) {
		// The label the API server adds to every namespace.
		sel.MatchLabels[compile.NamespaceNameLabel] = pick(g, g.s.Namespaces).Name
		return sel
	}
	for j, n := 0, 1+g.intn(2); j < n; j++ {
		k := pick(g, keys)
		sel.MatchLabels[k] = g.labelValue(vocab, k, "")
	}
	return sel
}

var operators = []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}

func (g *gen) selector(vocab map[string][]string) *metav1.LabelSelector {
	sel := &metav1.LabelSelector{}
	keys := sortedKeys(vocab)
	if g.chance(0.3) {
		k := pick(g, keys)
		sel.MatchLabels = map[string]string{k: g.labelValue(vocab, k, "")}
	}
	for j, n := 0, 1+g.intn(2); j < n; j++ {
		req := metav1.LabelSelectorRequirement{Key: pick(g, keys), Operator: pick(g, operators)}
		if req.Operator == metav1.LabelSelectorOpIn || req.Operator == metav1.LabelSelectorOpNotIn {
			for v, m := 0, 1+g.intn(2); v < m; v++ {
				val := g.labelValue(vocab, req.Key, "")
				if !slices.Contains(req.Values, val) {
					req.Values = append(req.Values, val)
				}
			}
		}
		sel.MatchExpressions = append(sel.MatchExpressions, req)
	}
	return sel
}

func (g *gen) ipBlock() *networkingv1.IPBlock {
	// Pod ranges: a node's /24 or the whole /16 with holes at pod IPs or a
	// node; external ranges of both families; the whole address space.
	pod := pick(g, g.s.Pods)
	addrs := pod.Addrs()
	a := pick(g, addrs)
	var choices []networkingv1.IPBlock
	if a.Is4() {
		node := a.As4()[2]
		choices = []networkingv1.IPBlock{
			{CIDR: "10.244.0.0/16", Except: []string{fmt.Sprintf("10.244.%d.0/24", 3-node)}},
			{CIDR: "10.244.0.0/16", Except: []string{a.String() + "/32"}},
			{CIDR: fmt.Sprintf("10.244.%d.0/24", node), Except: []string{a.String() + "/32"}},
			{CIDR: fmt.Sprintf("10.244.%d.0/24", node)},
			{CIDR: a.String() + "/32"},
			{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}},
			{CIDR: "198.51.100.0/24"},
			{CIDR: "0.0.0.0/0", Except: []string{"10.244.0.0/16"}},
			{CIDR: "0.0.0.0/0", Except: []string{"192.0.2.0/24", fmt.Sprintf("10.244.%d.0/24", node)}},
		}
	} else {
		node := a.As16()[7]
		choices = []networkingv1.IPBlock{
			{CIDR: "fd00:10:244::/48", Except: []string{fmt.Sprintf("fd00:10:244:%d::/64", 3-node)}},
			{CIDR: fmt.Sprintf("fd00:10:244:%d::/64", node), Except: []string{a.String() + "/128"}},
			{CIDR: a.String() + "/128"},
			{CIDR: "2001:db8::/32", Except: []string{"2001:db8:1::/48"}},
			{CIDR: "::/0", Except: []string{"fd00:10:244::/48"}},
		}
	}
	b := pick(g, choices)
	return &b
}

func (g *gen) port() networkingv1.NetworkPolicyPort {
	var p networkingv1.NetworkPolicyPort
	if x := g.intn(10); x >= 4 {
		proto := pick(g, protocols)
		if x >= 8 {
			proto = "TCP"
		}
		pr := corev1.Protocol(proto)
		p.Protocol = &pr
	}
	switch x := g.intn(10); {
	case x < 4:
		n := pick(g, portNumbers)
		p.Port = ptr(intstr.FromInt32(n))
		g.ports = append(g.ports, n)
	case x < 7:
		name := pick(g, portNames)
		if g.chance(0.1) {
			name = "missing" // resolves on no pod
		}
		p.Port = ptr(intstr.FromString(name))
	case x < 9:
		n := pick(g, portNumbers)
		end := n + int32(g.intn(12))
		p.Port, p.EndPort = ptr(intstr.FromInt32(n)), &end
		g.ports = append(g.ports, n, end, end+1)
	default:
		// protocol only: every port of it
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func (g *gen) probes() {
	pods := g.s.Pods
	for i := range pods {
		for j := range pods {
			if i == j {
				continue
			}
			g.s.Probes = append(g.s.Probes, g.podProbe(&pods[i], &pods[j]))
			if g.chance(0.25) {
				pr := g.podProbe(&pods[i], &pods[j])
				pr.Protocol = map[string]string{"TCP": "UDP", "UDP": "TCP"}[pr.Protocol]
				g.s.Probes = append(g.s.Probes, pr)
			}
		}
	}
	// IPv6 between dual-stack pods: name the address.
	if g.dual {
		for k := 0; k < 4; k++ {
			a, b := &pods[g.intn(len(pods))], &pods[g.intn(len(pods))]
			if a == b {
				continue
			}
			pr := g.podProbe(a, b)
			pr.From = scenario.Endpoint{IP: last(a.Addrs()).String()}
			pr.To = scenario.Endpoint{IP: last(b.Addrs()).String()}
			g.s.Probes = append(g.s.Probes, pr)
		}
	}
	for k, n := 0, 2+g.intn(4); k < n; k++ {
		p := &pods[g.intn(len(pods))]
		ext := g.external(p)
		pr := g.podProbe(p, nil)
		if g.chance(0.5) {
			pr.From, pr.To = scenario.Endpoint{Pod: p.Key()}, scenario.Endpoint{IP: ext}
		} else {
			pr.From, pr.To = scenario.Endpoint{IP: ext}, scenario.Endpoint{Pod: p.Key()}
		}
		g.s.Probes = append(g.s.Probes, pr)
	}
}

func last(xs []netip.Addr) netip.Addr { return xs[len(xs)-1] }

// external picks an external address of a family the pod has.
func (g *gen) external(p *scenario.Pod) string {
	addrs := p.Addrs()
	if pick(g, addrs).Is4() {
		return pick(g, externalV4)
	}
	return pick(g, externalV6)
}

// podProbe is a probe from a to b (b nil: an external destination; the
// caller fixes the endpoints) on a port likely to matter: one of b's
// container ports, a port the policies name, or a common one.
func (g *gen) podProbe(a, b *scenario.Pod) scenario.Probe {
	pr := scenario.Probe{Protocol: "TCP"}
	if g.chance(0.35) {
		pr.Protocol = "UDP"
	}
	if a != nil && b != nil {
		pr.From, pr.To = scenario.Endpoint{Pod: a.Key()}, scenario.Endpoint{Pod: b.Key()}
	}
	var cands []scenario.Port
	if b != nil {
		for _, cp := range b.Ports {
			if cp.Protocol == "TCP" || cp.Protocol == "" || cp.Protocol == "UDP" {
				cands = append(cands, cp)
			}
		}
	}
	switch x := g.intn(10); {
	case x < 5 && len(cands) > 0:
		cp := pick(g, cands)
		pr.Port = cp.Port
		pr.Protocol = cp.Protocol
		if pr.Protocol == "" {
			pr.Protocol = "TCP"
		}
	case x < 8 && len(g.ports) > 0:
		pr.Port = pick(g, g.ports)
	default:
		pr.Port = pick(g, portNumbers)
	}
	return pr
}

// Predecessor returns an earlier state of the cluster of Generate(seed), for
// testing incremental syncs: the same namespaces and pods (same keys, nodes
// and addresses), but other policies (those of another seed), some pods and
// namespaces labelled differently, some pods with other container ports and
// some namespaces staged differently.
// Syncing it first and then the scenario itself changes sets, maps and
// chains the way controller events do.
func Predecessor(seed uint64) *scenario.Scenario {
	s := Generate(seed)
	other := Generate(seed ^ 0x5eed_0000_0000)
	g := &gen{r: rand.New(rand.NewPCG(seed, 0x70726564_65636573))}
	g.s = s
	s.Policies = other.Policies
	s.ClusterNetworkPolicies = other.ClusterNetworkPolicies
	for i := range s.Namespaces {
		if g.chance(0.3) {
			s.Namespaces[i].Labels = pick(g, other.Namespaces).Labels
		}
	}
	for i := range s.Pods {
		if g.chance(0.4) {
			s.Pods[i].Labels = pick(g, other.Pods).Labels
		}
		if g.chance(0.3) {
			s.Pods[i].Ports = pick(g, other.Pods).Ports
		}
	}
	for i := range s.Namespaces {
		if g.chance(0.2) {
			s.Namespaces[i].Annotations = pick(g, other.Namespaces).Annotations
		}
	}
	s.Probes = nil
	return s
}
