package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// RunConfig configures RunScenario.
type RunConfig struct {
	// Enforcer run as the agents; empty means nftpolicy. The peer
	// (cluster.EnforcerKNP) runs only NetworkPolicy v1 scenarios.
	Enforcer cluster.Enforcer
	// Mode of the agents; empty means hybrid.
	Mode compile.Mode
	// Timeout and RetryTimeout of the probes (see Prober); zero means the
	// defaults.
	Timeout, RetryTimeout time.Duration
	// Logf receives progress lines; nil means tb.Logf.
	Logf func(format string, args ...any)
}

// Outcome is one probe of a scenario on real packets.
type Outcome struct {
	Probe int
	Spec  ProbeSpec
	ProbeResult
}

// UnsupportedError is a valid scenario that the runner cannot simulate.
type UnsupportedError struct{ Err error }

func (e *UnsupportedError) Error() string {
	return "scenario not supported by the end-to-end runner: " + e.Err.Error()
}
func (e *UnsupportedError) Unwrap() error { return e.Err }

// Supported reports why the runner cannot run s, or nil.
//
// Host-network pods are not simulated: the lab runs every pod in a
// namespace of its own, while a host-network pod shares its node's address
// and servers. A probe to a node on a TCP port the node's agent listens on
// (the API relay and the agent's metrics and health ports, see
// tests/internal/cluster) cannot be served there either.
func Supported(s *scenario.Scenario) error {
	var errs []error
	for i := range s.Pods {
		if p := &s.Pods[i]; p.HostNetwork {
			errs = append(errs, fmt.Errorf("pods[%d] (%s): hostNetwork pods are not supported (the lab cannot make a pod share its node's address)", i, p.Key()))
		}
	}
	taken := agentPorts()
	for i, pr := range s.Probes {
		if pr.ProbeProtocol() != compile.ProtoTCP {
			continue
		}
		if _, dst, err := s.ProbeAddrs(i); err == nil && nodeForAddr(s, dst) != "" && slices.Contains(taken, uint16(pr.Port)) {
			errs = append(errs, fmt.Errorf("probes[%d]: TCP port %d of node %s is the node agent's own (ports %v are taken on every node)", i, pr.Port, nodeForAddr(s, dst), taken))
		}
	}
	if len(errs) > 0 {
		return &UnsupportedError{errors.Join(errs...)}
	}
	return nil
}

// NetworkPolicyOnly reports why s is more than NetworkPolicy v1 (what
// nftpolicy adds: ClusterNetworkPolicies, dnsAnswers for domainNames,
// staged policies), or nil.
func NetworkPolicyOnly(s *scenario.Scenario) error {
	var errs []error
	if n := len(s.ClusterNetworkPolicies); n > 0 {
		errs = append(errs, fmt.Errorf("%d ClusterNetworkPolicies", n))
	}
	if len(s.DNSAnswers) > 0 {
		errs = append(errs, errors.New("dnsAnswers (domainNames)"))
	}
	for i := range s.Policies {
		if _, ok := s.Policies[i].Annotations[compile.StagedAnnotation]; ok {
			errs = append(errs, fmt.Errorf("policies[%d] (%s/%s) is staged", i, s.Policies[i].Namespace, s.Policies[i].Name))
		}
	}
	return errors.Join(errs...)
}

// agentPorts are the TCP ports the harness' agent and relay listen on in
// every node namespace.
func agentPorts() []uint16 {
	var out []uint16
	for _, a := range []string{cluster.RelayAddr, cluster.MetricsAddr, cluster.HealthAddr} {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			out = append(out, ap.Port())
		}
	}
	return out
}

// nodeForAddr returns the listed node that owns a, or "": an endpoint at a
// node's address is that node.
func nodeForAddr(s *scenario.Scenario, a netip.Addr) string {
	for i := range s.Nodes {
		if slices.Contains(s.Nodes[i].Addrs(), a) {
			return s.Nodes[i].Name
		}
	}
	return ""
}

// externalNode is the node external hosts (ip endpoints) are attached to:
// the first node of the cluster. Traffic between them and pods on other
// nodes crosses the underlay like pod-to-pod traffic.
func externalNode(c *cluster.Cluster) string { return c.Nodes()[0] }

// RunScenario brings up a cluster (tests/internal/cluster: a real API
// server, the nodes the scenario lists or names or node-1 and node-2, with
// the addresses the scenario lists for them, one real agent per node in
// cfg.Mode, or cfg.Enforcer's), creates the scenario's namespaces, pods (servers on their
// container ports and on every port probed on them) and external hosts (one
// namespace per ip endpoint that is neither a pod's nor a node's address,
// attached to the first node and serving the ports probed on it), serves
// the ports probed on nodes in the nodes' namespaces, gives the listed
// nodes' Node objects the scenario's labels, applies its policies and, when
// it has any, installs the experimental ClusterNetworkPolicy CRD and applies
// its ClusterNetworkPolicies, all through the API; then it waits until every
// agent has programmed them (WaitProgrammed) and runs every probe at once
// on real packets (a node endpoint sends from, or is served in, its node's
// namespace). Before the probes, each pod with dnsAnswers resolves its
// names through a real DNS server (see resolveAnswers), so that the agents
// learn them as they would in a cluster. The cluster is torn down by tb's
// cleanups.
//
// An object the API server rejects is a *scenario.Error; a scenario
// the runner cannot simulate an *UnsupportedError.
func RunScenario(ctx context.Context, tb testing.TB, s *scenario.Scenario, cfg RunConfig) ([]Outcome, error) {
	if err := Supported(s); err != nil {
		return nil, err
	}
	if cfg.Enforcer == cluster.EnforcerKNP {
		if err := NetworkPolicyOnly(s); err != nil {
			return nil, &UnsupportedError{fmt.Errorf("%s runs NetworkPolicy v1 only: %w", cfg.Enforcer, err)}
		}
	}
	if cfg.Logf == nil {
		cfg.Logf = tb.Logf
	}
	began := time.Now()
	nodes := s.NodeNames(cluster.DefaultNodes)
	nodeIPs := map[string][]netip.Addr{}
	for i := range s.Nodes {
		nodeIPs[s.Nodes[i].Name] = s.Nodes[i].Addrs()
	}
	var agentArgs []string
	if len(s.ClusterNetworkPolicies) > 0 {
		// The CRD is installed once the agents run; they find its API at
		// their next discovery check, which by default is 30s away.
		agentArgs = []string{"--cluster-policy-check-period", "1s"}
	}
	agentArgs = append(agentArgs, dnsAgentArgs(s)...)
	if cfg.Enforcer == cluster.EnforcerKNP {
		agentArgs = nil // nftpolicy's flags; NetworkPolicyOnly leaves nothing they serve
	}
	c := cluster.Start(tb, cluster.Config{Enforcer: cfg.Enforcer, Mode: cfg.Mode, Nodes: nodes, NodeIPs: nodeIPs, AgentArgs: agentArgs, Logf: cfg.Logf})
	p := NewProber(c.Lab)
	p.Timeout, p.RetryTimeout = cfg.Timeout, cfg.RetryTimeout
	tb.Cleanup(p.Close) // before the lab goes (cleanups run last-in first-out)
	up := time.Now()

	specs, err := setUp(ctx, c, s)
	if err != nil {
		return nil, err
	}
	created := time.Now()
	waited, err := c.WaitProgrammed(ctx)
	if err != nil {
		return nil, err
	}
	if err := resolveAnswers(ctx, c, s); err != nil {
		return nil, err
	}
	probing := time.Now()
	res := p.Run(ctx, specs)
	out := make([]Outcome, len(specs))
	allowed := 0
	for i := range specs {
		out[i] = Outcome{Probe: i, Spec: specs[i], ProbeResult: res[i]}
		if res[i].Allowed {
			allowed++
		}
	}
	cfg.Logf("run-scenario: cluster up %v, objects created %v, programmed after %v, %d probes (%d allowed) in %v",
		up.Sub(began).Round(time.Millisecond), created.Sub(up).Round(time.Millisecond), waited.Round(time.Millisecond),
		len(specs), allowed, time.Since(probing).Round(time.Millisecond))
	return out, ctx.Err()
}

// setUp creates the scenario's objects and lab endpoints and returns the
// probes.
func setUp(ctx context.Context, c *cluster.Cluster, s *scenario.Scenario) ([]ProbeSpec, error) {
	// What every destination must serve: container ports plus probed ports.
	type ports struct{ tcp, udp []uint16 }
	add := func(l *ports, proto compile.Protocol, port uint16) {
		switch proto {
		case compile.ProtoTCP:
			if !slices.Contains(l.tcp, port) {
				l.tcp = append(l.tcp, port)
			}
		case compile.ProtoUDP:
			if !slices.Contains(l.udp, port) {
				l.udp = append(l.udp, port)
			}
		} // SCTP: a raw socket receives every port
	}
	podByIP := map[netip.Addr]string{}
	for i := range s.Pods {
		for _, a := range s.Pods[i].Addrs() {
			podByIP[a] = s.Pods[i].Key()
		}
	}
	podServe := map[string]*ports{}
	nodeServe := map[string]*ports{}
	extServe := map[netip.Addr]*ports{}
	var extOrder []netip.Addr
	// end is one side of a probe: a pod, a listed node or an external host
	// (only addr set).
	type end struct {
		pod, node string
		addr      netip.Addr
	}
	endpoint := func(e scenario.Endpoint, a netip.Addr) end {
		switch {
		case e.Pod != "":
			return end{pod: e.Pod, addr: a}
		case e.Node != "":
			return end{node: e.Node, addr: a}
		}
		if k, ok := podByIP[a]; ok {
			return end{pod: k, addr: a}
		}
		if n := nodeForAddr(s, a); n != "" {
			return end{node: n, addr: a}
		}
		if extServe[a] == nil {
			extServe[a] = &ports{}
			extOrder = append(extOrder, a)
		}
		return end{addr: a}
	}
	type probeEnds struct{ from, to end }
	ends := make([]probeEnds, len(s.Probes))
	for i, pr := range s.Probes {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, &scenario.Error{Err: fmt.Errorf("probes[%d]: %w", i, err)}
		}
		e := probeEnds{from: endpoint(pr.From, src), to: endpoint(pr.To, dst)}
		ends[i] = e
		serve := extServe[dst]
		switch {
		case e.to.pod != "":
			if podServe[e.to.pod] == nil {
				podServe[e.to.pod] = &ports{}
			}
			serve = podServe[e.to.pod]
		case e.to.node != "":
			if nodeServe[e.to.node] == nil {
				nodeServe[e.to.node] = &ports{}
			}
			serve = nodeServe[e.to.node]
		}
		add(serve, pr.ProbeProtocol(), uint16(pr.Port))
	}

	// Namespaces: listed ones with their labels and annotations, then
	// those only used.
	listed := map[string]bool{}
	for _, ns := range s.Namespaces {
		listed[ns.Name] = true
		if err := c.EnsureNamespace(ctx, ns.Name, ns.Labels); err != nil {
			return nil, apiError(err)
		}
		if len(ns.Annotations) > 0 {
			if err := c.AnnotateNamespace(ctx, ns.Name, ns.Annotations); err != nil {
				return nil, apiError(err)
			}
		}
	}
	for _, name := range usedNamespaces(s) {
		if !listed[name] {
			listed[name] = true
			if err := c.EnsureNamespace(ctx, name, nil); err != nil {
				return nil, apiError(err)
			}
		}
	}

	nodes := c.Nodes()
	for i := range s.Pods {
		sp := &s.Pods[i]
		p := cluster.Pod{Namespace: sp.Namespace, Name: sp.Name, Labels: sp.Labels, Node: s.PodNode(sp.Key(), nodes), IPs: sp.Addrs()}
		for _, port := range sp.Ports {
			proto := corev1.ProtocolTCP
			if port.Protocol != "" {
				proto = corev1.Protocol(strings.ToUpper(port.Protocol))
			}
			p.Ports = append(p.Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.Port, Protocol: proto})
		}
		if len(p.Ports) == 0 {
			// CreatePod would declare serve-80-tcp, a named port the
			// scenario's pod does not have; an unnamed port changes no
			// policy decision.
			p.Ports = []corev1.ContainerPort{{ContainerPort: 80, Protocol: corev1.ProtocolTCP}}
		}
		if sv := podServe[sp.Key()]; sv != nil {
			p.ServeTCP = append(p.ServeTCP, sv.tcp...)
			p.ServeUDP = append(p.ServeUDP, sv.udp...)
		}
		if _, err := c.CreatePod(ctx, p); err != nil {
			return nil, apiError(err)
		}
	}

	extEP := map[netip.Addr]netlab.Endpoint{}
	for i, a := range extOrder {
		name := fmt.Sprintf("ext%d", i)
		sv := extServe[a]
		if err := c.Lab.AddExternal(netlab.ExternalSpec{Name: name, Node: externalNode(c), IPs: []netip.Addr{a}, TCPPorts: sv.tcp, UDPPorts: sv.udp}); err != nil {
			return nil, fmt.Errorf("external host %v: %w", a, err)
		}
		extEP[a] = netlab.Ext(name)
	}

	// Probes to a node reach servers in its namespace, on its address
	// (host-network servers, as a node's own daemons are).
	for _, n := range c.Nodes() {
		if sv := nodeServe[n]; sv != nil {
			if err := c.Lab.ServeNode(n, sv.tcp, sv.udp); err != nil {
				return nil, fmt.Errorf("serving on node %s: %w", n, err)
			}
		}
	}
	if err := labelNodes(ctx, c, s); err != nil {
		return nil, err
	}

	for i := range s.Policies {
		if _, err := c.ApplyPolicy(ctx, &s.Policies[i]); err != nil {
			return nil, apiError(err)
		}
	}
	if len(s.ClusterNetworkPolicies) > 0 {
		// The experimental channel: `nodes` peers exist only there, and it
		// accepts whatever the standard one does.
		if err := c.InstallClusterPolicyCRD(ctx, "experimental"); err != nil {
			return nil, err
		}
		for i := range s.ClusterNetworkPolicies {
			if _, err := c.ApplyClusterPolicy(ctx, &s.ClusterNetworkPolicies[i]); err != nil {
				return nil, apiError(err)
			}
		}
	}

	specs := make([]ProbeSpec, len(s.Probes))
	for i, pr := range s.Probes {
		e := ends[i]
		resolve := func(e end) (netlab.Endpoint, error) {
			switch {
			case e.pod != "":
				return c.PodEndpoint(e.pod)
			case e.node != "":
				// A node's servers answer with its name, and a client
				// in its namespace sends from its address.
				return netlab.Node(e.node), nil
			}
			return extEP[e.addr], nil
		}
		from, err := resolve(e.from)
		if err != nil {
			return nil, err
		}
		to, err := resolve(e.to)
		if err != nil {
			return nil, err
		}
		specs[i] = ProbeSpec{From: from, To: to, Src: e.from.addr, Dst: e.to.addr, Port: uint16(pr.Port), Proto: pr.ProbeProtocol()}
	}
	return specs, nil
}

// hostnameLabel is the label the harness gives every Node object.
const hostnameLabel = "kubernetes.io/hostname"

// labelNodes gives the Node object of every listed node exactly the
// scenario's labels, as `nftpolicy eval` sees them: the harness' hostname
// label goes unless the scenario sets it. Their addresses are already the
// scenario's (cluster.Config.NodeIPs). Nodes the scenario does not list
// keep the harness' label and lab addresses; eval has no Node object for
// them, and no probe can name them.
func labelNodes(ctx context.Context, c *cluster.Cluster, s *scenario.Scenario) error {
	for i := range s.Nodes {
		n := &s.Nodes[i]
		var remove []string
		if _, ok := n.Labels[hostnameLabel]; !ok {
			remove = append(remove, hostnameLabel)
		}
		if err := c.LabelNode(ctx, n.Name, n.Labels, remove...); err != nil {
			return apiError(err)
		}
		if got := c.NodeIPs(n.Name); !addrsCover(got, n.Addrs()) {
			return fmt.Errorf("node %s: the lab gave it %v, the scenario lists %v", n.Name, got, n.Addrs())
		}
	}
	return nil
}

// addrsCover reports whether have holds every address of want.
func addrsCover(have, want []netip.Addr) bool {
	for _, a := range want {
		if !slices.Contains(have, a) {
			return false
		}
	}
	return true
}

// usedNamespaces lists the namespaces pods and policies use, in order.
func usedNamespaces(s *scenario.Scenario) []string {
	var out []string
	for i := range s.Pods {
		if !slices.Contains(out, s.Pods[i].Namespace) {
			out = append(out, s.Pods[i].Namespace)
		}
	}
	for i := range s.Policies {
		if ns := s.Policies[i].Namespace; !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// apiError turns the API server's rejection of an object into a scenario
// error: the scenario holds something the API server would not store.
func apiError(err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return &scenario.Error{Err: err}
	}
	return err
}
