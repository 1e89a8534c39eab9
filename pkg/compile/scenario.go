package compile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Scenario is a small cluster, its NetworkPolicies and
// ClusterNetworkPolicies and connections to try, in the format of
// docs/scenario-format.md (shared with the e2e runner).
type Scenario struct {
	Namespaces []ScenarioNamespace `json:"namespaces,omitempty"`
	// Nodes are the cluster's nodes as policies see them: `nodes` peers
	// select them by label and match their IPs. Optional.
	Nodes    []ScenarioNode               `json:"nodes,omitempty"`
	Pods     []ScenarioPod                `json:"pods,omitempty"`
	Policies []networkingv1.NetworkPolicy `json:"policies,omitempty"`
	// ClusterNetworkPolicies are decoded into the v1beta1 type whether
	// written as v1beta1 or v1alpha2 (the same schema).
	ClusterNetworkPolicies []npav1beta1.ClusterNetworkPolicy `json:"clusterNetworkPolicies,omitempty"`
	// DNSAnswers record what pods resolved, for domainNames peers; they do
	// not change verdicts while domainNames is unsupported.
	DNSAnswers []DNSAnswer `json:"dnsAnswers,omitempty"`
	Probes     []Probe     `json:"probes,omitempty"`
}

// ScenarioNode is a node: its name, labels and addresses (the InternalIP
// entries of its status.addresses).
type ScenarioNode struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	IPs    []string          `json:"ips,omitempty"`
	// PodCIDRs is the node's spec.podCIDRs.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

// Addrs returns the node's addresses in the order written.
func (n *ScenarioNode) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, s := range n.IPs {
		if a, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// DNSAnswer is a name a pod resolved and the addresses it got.
type DNSAnswer struct {
	// Pod is "namespace/name".
	Pod  string   `json:"pod"`
	Name string   `json:"name"`
	IPs  []string `json:"ips"`
	// TTL is in seconds.
	TTL int32 `json:"ttl"`
}

// ScenarioNamespace is a namespace and its labels.
type ScenarioNamespace struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

// ScenarioPod is a pod as the scenario describes it.
type ScenarioPod struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	IP          string            `json:"ip,omitempty"`
	IPs         []string          `json:"ips,omitempty"`
	Node        string            `json:"node,omitempty"`
	HostNetwork bool              `json:"hostNetwork,omitempty"`
	Ports       []ScenarioPort    `json:"ports,omitempty"`
}

// Key returns "namespace/name".
func (p *ScenarioPod) Key() string { return p.Namespace + "/" + p.Name }

// Addrs returns the pod's addresses, IPv4 first.
func (p *ScenarioPod) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, s := range append([]string{p.IP}, p.IPs...) {
		out = appendAddr(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Is4() && !out[j].Is4() })
	return out
}

// ScenarioPort is a container port.
type ScenarioPort struct {
	Name     string `json:"name,omitempty"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// Probe is one new connection to try.
type Probe struct {
	From     Endpoint `json:"from"`
	To       Endpoint `json:"to"`
	Port     int32    `json:"port"`
	Protocol string   `json:"protocol,omitempty"`
}

// Endpoint is a pod ("namespace/name"), a listed node (its first address
// of the family the probe uses) or an address.
type Endpoint struct {
	Pod  string `json:"pod,omitempty"`
	Node string `json:"node,omitempty"`
	IP   string `json:"ip,omitempty"`
}

// String names the endpoint as written in the scenario ("node:NAME" for a node).
func (e Endpoint) String() string {
	switch {
	case e.Pod != "":
		return e.Pod
	case e.Node != "":
		return "node:" + e.Node
	}
	return e.IP
}

// ScenarioError is a malformed scenario; `nftpolicy eval` exits 2 on it.
type ScenarioError struct{ Err error }

func (e *ScenarioError) Error() string { return "invalid scenario: " + e.Err.Error() }
func (e *ScenarioError) Unwrap() error { return e.Err }

// ParseScenario decodes a scenario (YAML or JSON; unknown fields are errors)
// and validates it, including every policy as the API server would.
func ParseScenario(data []byte) (*Scenario, error) {
	var s Scenario
	// YAML 1.2 (yaml.v3): a namespace called "y" or "n" stays a string.
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ScenarioError{fmt.Errorf("parsing: %w", err)}
	}
	jsonData, err := json.Marshal(doc)
	if err != nil {
		return nil, &ScenarioError{fmt.Errorf("parsing: %w", err)}
	}
	// Strict and case-sensitive, as kubectl decodes: "podselector" is an
	// unknown field, not podSelector.
	strictErrs, err := kjson.UnmarshalStrict(jsonData, &s)
	if err != nil {
		return nil, &ScenarioError{fmt.Errorf("decoding: %w", err)}
	}
	if len(strictErrs) > 0 {
		return nil, &ScenarioError{fmt.Errorf("decoding: %w", errors.Join(strictErrs...))}
	}
	if err := s.validate(); err != nil {
		return nil, &ScenarioError{err}
	}
	return &s, nil
}

func (s *Scenario) validate() error {
	var errs []error
	nodeIPs := map[netip.Addr]string{}
	nodes := map[string]*ScenarioNode{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		where := fmt.Sprintf("nodes[%d] (%s)", i, n.Name)
		if msgs := validation.IsDNS1123Subdomain(n.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: name: %s", where, strings.Join(msgs, "; ")))
		}
		if nodes[n.Name] != nil {
			errs = append(errs, fmt.Errorf("%s: duplicate node", where))
		}
		nodes[n.Name] = n
		errs = append(errs, validateLabels(where+".labels", n.Labels)...)
		for _, c := range n.PodCIDRs {
			if _, err := netip.ParsePrefix(c); err != nil {
				errs = append(errs, fmt.Errorf("%s: bad podCIDR %q: %v", where, c, err))
			}
		}
		fams := map[bool]bool{}
		for _, a := range n.IPs {
			addr, err := netip.ParseAddr(a)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: bad IP %q", where, a))
				continue
			}
			addr = addr.Unmap()
			if other, ok := nodeIPs[addr]; ok {
				errs = append(errs, fmt.Errorf("%s: IP %s already belongs to node %s", where, addr, other))
			}
			nodeIPs[addr] = n.Name
			// Runners give each node one address per family.
			if fams[addr.Is4()] {
				errs = append(errs, fmt.Errorf("%s: at most one IP per family", where))
			}
			fams[addr.Is4()] = true
		}
	}
	nss := map[string]bool{}
	for i, ns := range s.Namespaces {
		if msgs := validation.IsDNS1123Label(ns.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("namespaces[%d].name %q: %s", i, ns.Name, strings.Join(msgs, "; ")))
		}
		if nss[ns.Name] {
			errs = append(errs, fmt.Errorf("namespaces[%d]: duplicate namespace %q", i, ns.Name))
		}
		nss[ns.Name] = true
		errs = append(errs, validateLabels(fmt.Sprintf("namespaces[%d].labels", i), ns.Labels)...)
		if v, ok := ns.Labels[NamespaceNameLabel]; ok && v != ns.Name {
			errs = append(errs, fmt.Errorf("namespaces[%d].labels: %s must equal the namespace name", i, NamespaceNameLabel))
		}
	}
	pods := map[string]bool{}
	ips := map[netip.Addr]string{}
	for i, p := range s.Pods {
		where := fmt.Sprintf("pods[%d] (%s)", i, p.Key())
		if msgs := validation.IsDNS1123Label(p.Namespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: namespace: %s", where, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsDNS1123Subdomain(p.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: name: %s", where, strings.Join(msgs, "; ")))
		}
		if pods[p.Key()] {
			errs = append(errs, fmt.Errorf("%s: duplicate pod", where))
		}
		pods[p.Key()] = true
		errs = append(errs, validateLabels(where+".labels", p.Labels)...)
		all := append([]string{}, p.IPs...)
		if p.IP != "" {
			all = append(all, p.IP)
		}
		// A host-network pod on a listed node has the node's addresses.
		onNode := nodes[p.Node]
		nodeAddrs := p.HostNetwork && onNode != nil && len(onNode.IPs) > 0
		if len(all) == 0 && !nodeAddrs {
			errs = append(errs, fmt.Errorf("%s: needs ip or ips", where))
		}
		fams := map[bool]netip.Addr{}
		for _, a := range all {
			addr, err := netip.ParseAddr(a)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: bad IP %q", where, a))
				continue
			}
			addr = addr.Unmap()
			if nodeAddrs && !slices.Contains(onNode.Addrs(), addr) {
				errs = append(errs, fmt.Errorf("%s: host-network pod has IP %s, which is not an IP of its node %s (omit ip to use the node's)", where, addr, p.Node))
			}
			if other, ok := ips[addr]; ok && other != p.Key() && !p.HostNetwork {
				errs = append(errs, fmt.Errorf("%s: IP %s already belongs to %s", where, addr, other))
			}
			if n, ok := nodeIPs[addr]; ok && !p.HostNetwork {
				errs = append(errs, fmt.Errorf("%s: IP %s belongs to node %s", where, addr, n))
			}
			if !p.HostNetwork {
				ips[addr] = p.Key()
			}
			if prev, ok := fams[addr.Is4()]; ok && prev != addr {
				errs = append(errs, fmt.Errorf("%s: at most one IP per family", where))
			}
			fams[addr.Is4()] = addr
		}
		names := map[string]bool{}
		for j, port := range p.Ports {
			if port.Port < 1 || port.Port > 65535 {
				errs = append(errs, fmt.Errorf("%s.ports[%d]: port %d out of range", where, j, port.Port))
			}
			if port.Protocol != "" {
				if _, ok := ParseProtocol(port.Protocol); !ok {
					errs = append(errs, fmt.Errorf("%s.ports[%d]: unsupported protocol %q", where, j, port.Protocol))
				}
			}
			if port.Name != "" {
				if msgs := validation.IsValidPortName(port.Name); len(msgs) > 0 {
					errs = append(errs, fmt.Errorf("%s.ports[%d]: name %q: %s", where, j, port.Name, strings.Join(msgs, "; ")))
				}
				if names[port.Name] {
					errs = append(errs, fmt.Errorf("%s.ports[%d]: duplicate port name %q", where, j, port.Name))
				}
				names[port.Name] = true
			}
		}
	}
	pols := map[string]bool{}
	for i := range s.Policies {
		np := &s.Policies[i]
		where := fmt.Sprintf("policies[%d] (%s/%s)", i, np.Namespace, np.Name)
		if np.APIVersion != "networking.k8s.io/v1" || np.Kind != "NetworkPolicy" {
			errs = append(errs, fmt.Errorf("%s: must be apiVersion networking.k8s.io/v1, kind NetworkPolicy (got %q, %q)", where, np.APIVersion, np.Kind))
		}
		if np.Namespace == "" {
			errs = append(errs, fmt.Errorf("%s: metadata.namespace is required", where))
		} else if msgs := validation.IsDNS1123Label(np.Namespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: metadata.namespace: %s", where, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsDNS1123Subdomain(np.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: metadata.name: %s", where, strings.Join(msgs, "; ")))
		}
		if pols[policyKey(np)] {
			errs = append(errs, fmt.Errorf("%s: duplicate policy", where))
		}
		pols[policyKey(np)] = true
		for _, pr := range ValidatePolicy(np) {
			errs = append(errs, fmt.Errorf("%s: %s: %s", where, pr.Field, pr.Message))
		}
	}
	cnps := map[string]bool{}
	for i := range s.ClusterNetworkPolicies {
		errs = append(errs, validateScenarioCNP(i, &s.ClusterNetworkPolicies[i], cnps)...)
	}
	for i, a := range s.DNSAnswers {
		where := fmt.Sprintf("dnsAnswers[%d]", i)
		if !pods[a.Pod] {
			errs = append(errs, fmt.Errorf("%s: unknown pod %q (write namespace/name)", where, a.Pod))
		}
		if msgs := validation.IsDNS1123Subdomain(strings.TrimSuffix(a.Name, ".")); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: name %q is not a DNS name: %s", where, a.Name, strings.Join(msgs, "; ")))
		}
		if len(a.IPs) == 0 {
			errs = append(errs, fmt.Errorf("%s: needs at least one IP", where))
		}
		for _, ip := range a.IPs {
			if _, err := netip.ParseAddr(ip); err != nil {
				errs = append(errs, fmt.Errorf("%s: bad IP %q", where, ip))
			}
		}
		if a.TTL < 0 {
			errs = append(errs, fmt.Errorf("%s: ttl %d is negative", where, a.TTL))
		}
	}
	for i, pr := range s.Probes {
		where := fmt.Sprintf("probes[%d]", i)
		for _, e := range []struct {
			name string
			ep   Endpoint
		}{{"from", pr.From}, {"to", pr.To}} {
			set := 0
			for _, f := range []string{e.ep.Pod, e.ep.Node, e.ep.IP} {
				if f != "" {
					set++
				}
			}
			switch {
			case set > 1:
				errs = append(errs, fmt.Errorf("%s.%s: give one of pod, node and ip", where, e.name))
			case e.ep.Pod != "":
				if !pods[e.ep.Pod] {
					errs = append(errs, fmt.Errorf("%s.%s: unknown pod %q (write namespace/name)", where, e.name, e.ep.Pod))
				}
			case e.ep.Node != "":
				if n := nodes[e.ep.Node]; n == nil {
					errs = append(errs, fmt.Errorf("%s.%s: unknown node %q (list it under nodes)", where, e.name, e.ep.Node))
				} else if len(n.IPs) == 0 {
					errs = append(errs, fmt.Errorf("%s.%s: node %q has no ips", where, e.name, e.ep.Node))
				}
			case e.ep.IP != "":
				if _, err := netip.ParseAddr(e.ep.IP); err != nil {
					errs = append(errs, fmt.Errorf("%s.%s: bad IP %q", where, e.name, e.ep.IP))
				}
			default:
				errs = append(errs, fmt.Errorf("%s.%s: needs pod, node or ip", where, e.name))
			}
		}
		if pr.Port < 1 || pr.Port > 65535 {
			errs = append(errs, fmt.Errorf("%s: port %d out of range 1-65535", where, pr.Port))
		}
		if pr.Protocol != "" {
			if _, ok := ParseProtocol(pr.Protocol); !ok {
				errs = append(errs, fmt.Errorf("%s: unsupported protocol %q", where, pr.Protocol))
			}
		}
		if len(errs) == 0 {
			if _, _, err := s.ProbeAddrs(i); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		}
	}
	return errors.Join(errs...)
}

// The API versions a scenario's ClusterNetworkPolicies may be written in;
// both have the v1beta1 schema.
var cnpAPIVersions = []string{npav1beta1.GroupName + "/v1beta1", npav1beta1.GroupName + "/v1alpha2"}

// validateScenarioCNP checks one ClusterNetworkPolicy as the API server
// would (its CRD's schema and rules, plus what nftpolicy cannot enforce as
// written), and that its name is unique among seen.
func validateScenarioCNP(i int, cnp *npav1beta1.ClusterNetworkPolicy, seen map[string]bool) []error {
	var errs []error
	where := fmt.Sprintf("clusterNetworkPolicies[%d] (%s)", i, cnp.Name)
	if !slices.Contains(cnpAPIVersions, cnp.APIVersion) || cnp.Kind != "ClusterNetworkPolicy" {
		errs = append(errs, fmt.Errorf("%s: must be apiVersion %s, kind ClusterNetworkPolicy (got %q, %q)", where, strings.Join(cnpAPIVersions, " or "), cnp.APIVersion, cnp.Kind))
	}
	if cnp.Namespace != "" {
		errs = append(errs, fmt.Errorf("%s: metadata.namespace must be empty: ClusterNetworkPolicies are cluster-scoped", where))
	}
	if msgs := validation.IsDNS1123Subdomain(cnp.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("%s: metadata.name: %s", where, strings.Join(msgs, "; ")))
	}
	if seen[cnp.Name] {
		errs = append(errs, fmt.Errorf("%s: duplicate ClusterNetworkPolicy", where))
	}
	seen[cnp.Name] = true
	for _, pr := range ValidateClusterPolicy(cnp) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", where, pr.Field, pr.Message))
	}
	return errs
}

func validateLabels(where string, l map[string]string) []error {
	var errs []error
	for k, v := range l {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: key %q: %s", where, k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: value %q: %s", where, v, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// Pod returns the scenario pod with the given key.
func (s *Scenario) Pod(key string) *ScenarioPod {
	for i := range s.Pods {
		if s.Pods[i].Key() == key {
			return &s.Pods[i]
		}
	}
	return nil
}

// ProbeProtocol returns the probe's protocol, TCP when omitted.
func (p Probe) ProbeProtocol() Protocol {
	if proto, ok := ParseProtocol(p.Protocol); ok {
		return proto
	}
	return ProtoTCP
}

// ProbeAddrs picks the addresses a probe uses: an ip endpoint fixes the
// family; between two pods IPv4 is used when both have it, else IPv6; a
// node endpoint is the node's first address of the family chosen.
func (s *Scenario) ProbeAddrs(i int) (src, dst netip.Addr, err error) {
	pr := s.Probes[i]
	cands := func(e Endpoint) []netip.Addr {
		if e.IP != "" {
			a, _ := netip.ParseAddr(e.IP)
			return []netip.Addr{a.Unmap()}
		}
		if n := s.Node(e.Node); e.Node != "" && n != nil {
			return n.Addrs()
		}
		if p := s.Pod(e.Pod); p != nil {
			return s.PodAddrs(p)
		}
		return nil
	}
	for _, a := range cands(pr.From) {
		for _, b := range cands(pr.To) {
			if a.Is4() == b.Is4() {
				return a, b, nil
			}
		}
	}
	return netip.Addr{}, netip.Addr{}, fmt.Errorf("%s and %s share no address family", pr.From, pr.To)
}

// Node returns the listed node with the given name.
func (s *Scenario) Node(name string) *ScenarioNode {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// PodAddrs returns a pod's addresses, IPv4 first: for a host-network pod
// on a listed node with addresses, the node's.
func (s *Scenario) PodAddrs(p *ScenarioPod) []netip.Addr {
	if n := s.Node(p.Node); p.HostNetwork && n != nil && len(n.IPs) > 0 {
		out := n.Addrs()
		sort.SliceStable(out, func(i, j int) bool { return out[i].Is4() && !out[j].Is4() })
		return out
	}
	return p.Addrs()
}

// NodeNames returns the names of the listed nodes and of the nodes pods
// name, sorted; when there are none, the given defaults.
func (s *Scenario) NodeNames(defaults []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range s.Nodes {
		if !seen[n.Name] {
			seen[n.Name] = true
			out = append(out, n.Name)
		}
	}
	for _, p := range s.Pods {
		if p.Node != "" && !seen[p.Node] {
			seen[p.Node] = true
			out = append(out, p.Node)
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return defaults
	}
	return out
}

// PodNode returns the node a pod runs on: its own node field, or, when
// absent, nodes[i % len(nodes)] for the pod's position i among the pods
// without a node. Runners and the compiler place pods the same way.
func (s *Scenario) PodNode(key string, nodes []string) string {
	i := 0
	for _, p := range s.Pods {
		if p.Key() == key {
			if p.Node != "" || len(nodes) == 0 {
				return p.Node
			}
			return nodes[i%len(nodes)]
		}
		if p.Node == "" {
			i++
		}
	}
	return ""
}

// Input turns the scenario into compiler input for one node ("" for the
// cluster-wide view), with pods lacking a node spread over nodes.
func (s *Scenario) Input(node string, nodes []string, nodeIPs []netip.Addr) Input {
	in := Input{NodeName: node, NodeIPs: nodeIPs}
	listed := map[string]bool{}
	for _, ns := range s.Namespaces {
		listed[ns.Name] = true
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: withNameLabel(ns.Labels, ns.Name)}})
	}
	for _, p := range s.Pods {
		if !listed[p.Namespace] {
			listed[p.Namespace] = true
			in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace, Labels: withNameLabel(nil, p.Namespace)}})
		}
		in.Pods = append(in.Pods, s.podObject(&p, s.PodNode(p.Key(), nodes)))
	}
	for i := range s.Policies {
		in.Policies = append(in.Policies, &s.Policies[i])
	}
	for i := range s.ClusterNetworkPolicies {
		in.ClusterPolicies = append(in.ClusterPolicies, &s.ClusterNetworkPolicies[i])
	}
	// Only listed nodes become Node objects: a node that only pods name has
	// no labels and no addresses policies could match.
	for i := range s.Nodes {
		in.Nodes = append(in.Nodes, s.nodeObject(&s.Nodes[i]))
	}
	return in
}

func (s *Scenario) nodeObject(n *ScenarioNode) *corev1.Node {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
	node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, n.PodCIDRs...)
	for _, a := range n.Addrs() {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	return node
}

func withNameLabel(l map[string]string, name string) map[string]string {
	out := map[string]string{NamespaceNameLabel: name}
	for k, v := range l {
		out[k] = v
	}
	return out
}

func (s *Scenario) podObject(p *ScenarioPod, node string) *corev1.Pod {
	c := corev1.Container{Name: "main"}
	for _, port := range p.Ports {
		proto := corev1.ProtocolTCP
		if port.Protocol != "" {
			proto = corev1.Protocol(port.Protocol)
		}
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: proto})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
		Spec:       corev1.PodSpec{NodeName: node, HostNetwork: p.HostNetwork, Containers: []corev1.Container{c}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, a := range s.PodAddrs(p) {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: a.String()})
	}
	if len(pod.Status.PodIPs) > 0 {
		pod.Status.PodIP = pod.Status.PodIPs[0].IP
	}
	return pod
}
