package scenario

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
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Scenario is a small cluster, its NetworkPolicies and
// ClusterNetworkPolicies and connections to try, in the format of
// docs/scenario-format.md (shared with the e2e runner).
type Scenario struct {
	Namespaces []Namespace `json:"namespaces,omitempty"`
	// Nodes are the cluster's nodes as policies see them: `nodes` peers
	// select them by label and match their IPs. Optional.
	Nodes    []Node                       `json:"nodes,omitempty"`
	Pods     []Pod                        `json:"pods,omitempty"`
	Policies []networkingv1.NetworkPolicy `json:"policies,omitempty"`
	// ClusterNetworkPolicies are decoded into the v1beta1 type whether
	// written as v1beta1 or v1alpha2 (the same schema).
	ClusterNetworkPolicies []npav1beta1.ClusterNetworkPolicy `json:"clusterNetworkPolicies,omitempty"`
	// DNSAnswers record what pods resolved: a domainNames peer matches
	// the addresses a pod got for a matching name.
	DNSAnswers []DNSAnswer `json:"dnsAnswers,omitempty"`
	Probes     []Probe     `json:"probes,omitempty"`
}

// Node is a node: its name, labels and addresses (the InternalIP
// entries of its status.addresses).
type Node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	IPs    []string          `json:"ips,omitempty"`
	// PodCIDRs is the node's spec.podCIDRs.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

// Addrs returns the node's addresses in the order written.
func (n *Node) Addrs() []netip.Addr { return parseAddrs(n.IPs) }

// parseAddrs parses addresses, an IPv4-mapped one as IPv4, leaving out
// repeats and what does not parse (validate reports it).
func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
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

// Namespace is a namespace, its labels and annotations (of which
// compile.StagedAnnotation stages its NetworkPolicies).
type Namespace struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Pod is a pod as the scenario describes it.
type Pod struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	IP          string            `json:"ip,omitempty"`
	IPs         []string          `json:"ips,omitempty"`
	Node        string            `json:"node,omitempty"`
	HostNetwork bool              `json:"hostNetwork,omitempty"`
	Ports       []Port            `json:"ports,omitempty"`
}

// Key returns "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Addrs returns the pod's addresses, IPv4 first.
func (p *Pod) Addrs() []netip.Addr {
	out := parseAddrs(append([]string{p.IP}, p.IPs...))
	sort.SliceStable(out, func(i, j int) bool { return out[i].Is4() && !out[j].Is4() })
	return out
}

// Port is a container port.
type Port struct {
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

// Error is a malformed scenario; `nftpolicy eval` exits 2 on it.
type Error struct{ Err error }

func (e *Error) Error() string { return "invalid scenario: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Parse decodes a scenario (YAML or JSON; unknown fields are errors)
// and validates it, including every policy as the API server would.
func Parse(data []byte) (*Scenario, error) {
	var s Scenario
	// YAML 1.2 (yaml.v3): a namespace called "y" or "n" stays a string.
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{fmt.Errorf("parsing: %w", err)}
	}
	jsonData, err := json.Marshal(doc)
	if err != nil {
		return nil, &Error{fmt.Errorf("parsing: %w", err)}
	}
	// Strict and case-sensitive, as kubectl decodes: "podselector" is an
	// unknown field, not podSelector.
	strictErrs, err := kjson.UnmarshalStrict(jsonData, &s)
	if err != nil {
		return nil, &Error{fmt.Errorf("decoding: %w", err)}
	}
	if len(strictErrs) > 0 {
		return nil, &Error{fmt.Errorf("decoding: %w", errors.Join(strictErrs...))}
	}
	if err := s.validate(); err != nil {
		return nil, &Error{err}
	}
	return &s, nil
}

// validator collects a scenario's errors, section by section; the maps
// hold what earlier sections define for later ones to refer to.
type validator struct {
	s       *Scenario
	errs    []error
	nodes   map[string]*Node
	nodeIPs map[netip.Addr]string
	pods    map[string]bool
}

func (v *validator) add(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

func (s *Scenario) validate() error {
	v := &validator{s: s, nodes: map[string]*Node{}, nodeIPs: map[netip.Addr]string{}, pods: map[string]bool{}}
	for i := range s.Nodes {
		v.node(i, &s.Nodes[i])
	}
	v.namespaces()
	podIPs := map[netip.Addr]string{}
	for i := range s.Pods {
		v.pod(i, &s.Pods[i], podIPs)
	}
	v.policies()
	cnps := map[string]bool{}
	for i := range s.ClusterNetworkPolicies {
		v.errs = append(v.errs, validateCNP(i, &s.ClusterNetworkPolicies[i], cnps)...)
	}
	v.dnsAnswers()
	for i := range s.Probes {
		v.probe(i)
	}
	return errors.Join(v.errs...)
}

func (v *validator) node(i int, n *Node) {
	where := fmt.Sprintf("nodes[%d] (%s)", i, n.Name)
	if msgs := validation.IsDNS1123Subdomain(n.Name); len(msgs) > 0 {
		v.add("%s: name: %s", where, strings.Join(msgs, "; "))
	}
	if v.nodes[n.Name] != nil {
		v.add("%s: duplicate node", where)
	}
	v.nodes[n.Name] = n
	v.errs = append(v.errs, validateLabels(where+".labels", n.Labels)...)
	for _, c := range n.PodCIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			v.add("%s: bad podCIDR %q: %v", where, c, err)
		}
	}
	fams := map[bool]bool{}
	for _, a := range n.IPs {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			v.add("%s: bad IP %q", where, a)
			continue
		}
		addr = addr.Unmap()
		if other, ok := v.nodeIPs[addr]; ok {
			v.add("%s: IP %s already belongs to node %s", where, addr, other)
		}
		v.nodeIPs[addr] = n.Name
		// Runners give each node one address per family.
		if fams[addr.Is4()] {
			v.add("%s: at most one IP per family", where)
		}
		fams[addr.Is4()] = true
	}
}

func (v *validator) namespaces() {
	seen := map[string]bool{}
	for i, ns := range v.s.Namespaces {
		if msgs := validation.IsDNS1123Label(ns.Name); len(msgs) > 0 {
			v.add("namespaces[%d].name %q: %s", i, ns.Name, strings.Join(msgs, "; "))
		}
		if seen[ns.Name] {
			v.add("namespaces[%d]: duplicate namespace %q", i, ns.Name)
		}
		seen[ns.Name] = true
		v.errs = append(v.errs, validateLabels(fmt.Sprintf("namespaces[%d].labels", i), ns.Labels)...)
		v.errs = append(v.errs, validateAnnotations(fmt.Sprintf("namespaces[%d]", i), "annotations", ns.Annotations)...)
		if l, ok := ns.Labels[compile.NamespaceNameLabel]; ok && l != ns.Name {
			v.add("namespaces[%d].labels: %s must equal the namespace name", i, compile.NamespaceNameLabel)
		}
	}
}

// pod checks pods[i]; ips maps the addresses of the pods before it (host
// network ones excepted) to their keys.
func (v *validator) pod(i int, p *Pod, ips map[netip.Addr]string) {
	where := fmt.Sprintf("pods[%d] (%s)", i, p.Key())
	if msgs := validation.IsDNS1123Label(p.Namespace); len(msgs) > 0 {
		v.add("%s: namespace: %s", where, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(p.Name); len(msgs) > 0 {
		v.add("%s: name: %s", where, strings.Join(msgs, "; "))
	}
	if v.pods[p.Key()] {
		v.add("%s: duplicate pod", where)
	}
	v.pods[p.Key()] = true
	v.errs = append(v.errs, validateLabels(where+".labels", p.Labels)...)
	v.podAddrs(where, p, ips)
	names := map[string]bool{}
	for j, port := range p.Ports {
		if port.Port < 1 || port.Port > 65535 {
			v.add("%s.ports[%d]: port %d out of range", where, j, port.Port)
		}
		if port.Protocol != "" {
			if _, ok := compile.ParseProtocol(port.Protocol); !ok {
				v.add("%s.ports[%d]: unsupported protocol %q", where, j, port.Protocol)
			}
		}
		if port.Name != "" {
			if msgs := validation.IsValidPortName(port.Name); len(msgs) > 0 {
				v.add("%s.ports[%d]: name %q: %s", where, j, port.Name, strings.Join(msgs, "; "))
			}
			if names[port.Name] {
				v.add("%s.ports[%d]: duplicate port name %q", where, j, port.Name)
			}
			names[port.Name] = true
		}
	}
}

func (v *validator) podAddrs(where string, p *Pod, ips map[netip.Addr]string) {
	all := append([]string{}, p.IPs...)
	if p.IP != "" {
		all = append(all, p.IP)
	}
	// A host-network pod on a listed node has the node's addresses.
	onNode := v.nodes[p.Node]
	nodeAddrs := p.HostNetwork && onNode != nil && len(onNode.IPs) > 0
	if len(all) == 0 && !nodeAddrs {
		v.add("%s: needs ip or ips", where)
	}
	fams := map[bool]netip.Addr{}
	for _, a := range all {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			v.add("%s: bad IP %q", where, a)
			continue
		}
		addr = addr.Unmap()
		if nodeAddrs && !slices.Contains(onNode.Addrs(), addr) {
			v.add("%s: host-network pod has IP %s, which is not an IP of its node %s (omit ip to use the node's)", where, addr, p.Node)
		}
		if other, ok := ips[addr]; ok && other != p.Key() && !p.HostNetwork {
			v.add("%s: IP %s already belongs to %s", where, addr, other)
		}
		if n, ok := v.nodeIPs[addr]; ok && !p.HostNetwork {
			v.add("%s: IP %s belongs to node %s", where, addr, n)
		}
		if !p.HostNetwork {
			ips[addr] = p.Key()
		}
		if prev, ok := fams[addr.Is4()]; ok && prev != addr {
			v.add("%s: at most one IP per family", where)
		}
		fams[addr.Is4()] = addr
	}
}

func (v *validator) policies() {
	seen := map[string]bool{}
	for i := range v.s.Policies {
		np := &v.s.Policies[i]
		where := fmt.Sprintf("policies[%d] (%s/%s)", i, np.Namespace, np.Name)
		if np.APIVersion != "networking.k8s.io/v1" || np.Kind != "NetworkPolicy" {
			v.add("%s: must be apiVersion networking.k8s.io/v1, kind NetworkPolicy (got %q, %q)", where, np.APIVersion, np.Kind)
		}
		if np.Namespace == "" {
			v.add("%s: metadata.namespace is required", where)
		} else if msgs := validation.IsDNS1123Label(np.Namespace); len(msgs) > 0 {
			v.add("%s: metadata.namespace: %s", where, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsDNS1123Subdomain(np.Name); len(msgs) > 0 {
			v.add("%s: metadata.name: %s", where, strings.Join(msgs, "; "))
		}
		key := np.Namespace + "/" + np.Name
		if seen[key] {
			v.add("%s: duplicate policy", where)
		}
		seen[key] = true
		v.errs = append(v.errs, validateAnnotations(where, "metadata.annotations", np.Annotations)...)
		for _, pr := range compile.ValidatePolicy(np) {
			v.add("%s: %s: %s", where, pr.Field, pr.Message)
		}
	}
}

func (v *validator) dnsAnswers() {
	for i, a := range v.s.DNSAnswers {
		where := fmt.Sprintf("dnsAnswers[%d]", i)
		if !v.pods[a.Pod] {
			v.add("%s: unknown pod %q (write namespace/name)", where, a.Pod)
		}
		if msgs := validation.IsDNS1123Subdomain(strings.TrimSuffix(a.Name, ".")); len(msgs) > 0 {
			v.add("%s: name %q is not a DNS name: %s", where, a.Name, strings.Join(msgs, "; "))
		}
		if len(a.IPs) == 0 {
			v.add("%s: needs at least one IP", where)
		}
		for _, ip := range a.IPs {
			if _, err := netip.ParseAddr(ip); err != nil {
				v.add("%s: bad IP %q", where, ip)
			}
		}
		if a.TTL < 0 {
			v.add("%s: ttl %d is negative", where, a.TTL)
		}
	}
}

// probe checks probes[i]; its addresses only when nothing so far is wrong
// (ProbeAddrs trusts the rest of the scenario).
func (v *validator) probe(i int) {
	pr := v.s.Probes[i]
	where := fmt.Sprintf("probes[%d]", i)
	v.endpoint(where+".from", pr.From)
	v.endpoint(where+".to", pr.To)
	if pr.Port < 1 || pr.Port > 65535 {
		v.add("%s: port %d out of range 1-65535", where, pr.Port)
	}
	if pr.Protocol != "" {
		if _, ok := compile.ParseProtocol(pr.Protocol); !ok {
			v.add("%s: unsupported protocol %q", where, pr.Protocol)
		}
	}
	if len(v.errs) == 0 {
		if _, _, err := v.s.ProbeAddrs(i); err != nil {
			v.add("%s: %w", where, err)
		}
	}
}

func (v *validator) endpoint(where string, e Endpoint) {
	set := 0
	for _, f := range []string{e.Pod, e.Node, e.IP} {
		if f != "" {
			set++
		}
	}
	switch {
	case set > 1:
		v.add("%s: give one of pod, node and ip", where)
	case e.Pod != "":
		if !v.pods[e.Pod] {
			v.add("%s: unknown pod %q (write namespace/name)", where, e.Pod)
		}
	case e.Node != "":
		if n := v.nodes[e.Node]; n == nil {
			v.add("%s: unknown node %q (list it under nodes)", where, e.Node)
		} else if len(n.IPs) == 0 {
			v.add("%s: node %q has no ips", where, e.Node)
		}
	case e.IP != "":
		if _, err := netip.ParseAddr(e.IP); err != nil {
			v.add("%s: bad IP %q", where, e.IP)
		}
	default:
		v.add("%s: needs pod, node or ip", where)
	}
}

// The API versions a scenario's ClusterNetworkPolicies may be written in;
// both have the v1beta1 schema.
var cnpAPIVersions = []string{npav1beta1.GroupName + "/v1beta1", npav1beta1.GroupName + "/v1alpha2"}

// validateCNP checks one ClusterNetworkPolicy as the API server
// would (its CRD's schema and rules, plus what nftpolicy cannot enforce as
// written), and that its name is unique among seen.
func validateCNP(i int, cnp *npav1beta1.ClusterNetworkPolicy, seen map[string]bool) []error {
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
	errs = append(errs, validateAnnotations(where, "metadata.annotations", cnp.Annotations)...)
	for _, pr := range compile.ValidateClusterPolicy(cnp) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", where, pr.Field, pr.Message))
	}
	return errs
}

// validateAnnotations checks annotations as the API server does (keys,
// total size); path is their field.
func validateAnnotations(where, path string, a map[string]string) []error {
	var errs []error
	for _, e := range apivalidation.ValidateAnnotations(a, field.NewPath(path)) {
		errs = append(errs, fmt.Errorf("%s: %s", where, e.Error()))
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
func (s *Scenario) Pod(key string) *Pod {
	for i := range s.Pods {
		if s.Pods[i].Key() == key {
			return &s.Pods[i]
		}
	}
	return nil
}

// ProbeProtocol returns the probe's protocol, TCP when omitted.
func (p Probe) ProbeProtocol() compile.Protocol {
	if proto, ok := compile.ParseProtocol(p.Protocol); ok {
		return proto
	}
	return compile.ProtoTCP
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
func (s *Scenario) Node(name string) *Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// PodAddrs returns a pod's addresses, IPv4 first: for a host-network pod
// on a listed node with addresses, the node's.
func (s *Scenario) PodAddrs(p *Pod) []netip.Addr {
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
func (s *Scenario) Input(node string, nodes []string, nodeIPs []netip.Addr) compile.Input {
	in := compile.Input{NodeName: node, NodeIPs: nodeIPs}
	listed := map[string]bool{}
	for _, ns := range s.Namespaces {
		listed[ns.Name] = true
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name,
			Labels: withNameLabel(ns.Labels, ns.Name), Annotations: ns.Annotations}})
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

func (s *Scenario) nodeObject(n *Node) *corev1.Node {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
	node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, n.PodCIDRs...)
	for _, a := range n.Addrs() {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	return node
}

func withNameLabel(l map[string]string, name string) map[string]string {
	out := map[string]string{compile.NamespaceNameLabel: name}
	for k, v := range l {
		out[k] = v
	}
	return out
}

func (s *Scenario) podObject(p *Pod, node string) *corev1.Pod {
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
