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
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// RunConfig configures RunScenario.
type RunConfig struct {
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

// Supported reports why the runner cannot run s, or nil. Host-network pods
// are not simulated: their address is their node's, which the lab picks
// (172.31.0.x), and traffic between a node and its own pods is never
// filtered while `nftpolicy eval`'s cluster-wide view has no node addresses,
// so the runner could not give them the scenario's address nor its verdicts.
func Supported(s *compile.Scenario) error {
	var errs []error
	for i := range s.Pods {
		if p := &s.Pods[i]; p.HostNetwork {
			errs = append(errs, fmt.Errorf("pods[%d] (%s): hostNetwork pods are not supported (their address would have to be the node's)", i, p.Key()))
		}
	}
	if len(errs) > 0 {
		return &UnsupportedError{errors.Join(errs...)}
	}
	return nil
}

// externalNode is the node external hosts (ip endpoints) are attached to:
// the first node of the cluster. Traffic between them and pods on other
// nodes crosses the underlay like pod-to-pod traffic.
func externalNode(c *cluster.Cluster) string { return c.Nodes()[0] }

// RunScenario brings up a cluster (tests/internal/cluster: a real API
// server, the nodes the scenario names or node-1 and node-2, one real agent
// per node in cfg.Mode), creates the scenario's namespaces, pods (servers on
// their container ports and on every port probed on them) and external
// hosts (one namespace per ip endpoint that is not a pod's address, attached
// to the first node and serving the ports probed on it), applies its
// policies through the API, waits until every agent has programmed them
// (WaitProgrammed), and runs every probe at once on real packets. The
// cluster is torn down by tb's cleanups.
//
// A policy the API server rejects is a *compile.ScenarioError; a scenario
// the runner cannot simulate an *UnsupportedError.
func RunScenario(ctx context.Context, tb testing.TB, s *compile.Scenario, cfg RunConfig) ([]Outcome, error) {
	if err := Supported(s); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = tb.Logf
	}
	began := time.Now()
	nodes := s.NodeNames(cluster.DefaultNodes)
	c := cluster.Start(tb, cluster.Config{Mode: cfg.Mode, Nodes: nodes, Logf: cfg.Logf})
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
func setUp(ctx context.Context, c *cluster.Cluster, s *compile.Scenario) ([]ProbeSpec, error) {
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
	extServe := map[netip.Addr]*ports{}
	var extOrder []netip.Addr
	endpoint := func(e compile.Endpoint, a netip.Addr) (pod string) {
		if e.Pod != "" {
			return e.Pod
		}
		if k, ok := podByIP[a]; ok {
			return k
		}
		if extServe[a] == nil {
			extServe[a] = &ports{}
			extOrder = append(extOrder, a)
		}
		return ""
	}
	type probeEnds struct {
		fromPod, toPod string
		src, dst       netip.Addr
	}
	ends := make([]probeEnds, len(s.Probes))
	for i, pr := range s.Probes {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, &compile.ScenarioError{Err: fmt.Errorf("probes[%d]: %w", i, err)}
		}
		e := probeEnds{fromPod: endpoint(pr.From, src), toPod: endpoint(pr.To, dst), src: src, dst: dst}
		ends[i] = e
		if e.toPod != "" {
			if podServe[e.toPod] == nil {
				podServe[e.toPod] = &ports{}
			}
			add(podServe[e.toPod], pr.ProbeProtocol(), uint16(pr.Port))
		} else {
			add(extServe[dst], pr.ProbeProtocol(), uint16(pr.Port))
		}
	}

	// Namespaces: listed ones with their labels, then those only used.
	listed := map[string]bool{}
	for _, ns := range s.Namespaces {
		listed[ns.Name] = true
		if err := c.EnsureNamespace(ctx, ns.Name, ns.Labels); err != nil {
			return nil, apiError(err)
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

	for i := range s.Policies {
		if _, err := c.ApplyPolicy(ctx, &s.Policies[i]); err != nil {
			return nil, apiError(err)
		}
	}

	specs := make([]ProbeSpec, len(s.Probes))
	for i, pr := range s.Probes {
		e := ends[i]
		resolve := func(pod string, a netip.Addr) (netlab.Endpoint, error) {
			if pod != "" {
				return c.PodEndpoint(pod)
			}
			return extEP[a], nil
		}
		from, err := resolve(e.fromPod, e.src)
		if err != nil {
			return nil, err
		}
		to, err := resolve(e.toPod, e.dst)
		if err != nil {
			return nil, err
		}
		specs[i] = ProbeSpec{From: from, To: to, Src: e.src, Dst: e.dst, Port: uint16(pr.Port), Proto: pr.ProbeProtocol()}
	}
	return specs, nil
}

// usedNamespaces lists the namespaces pods and policies use, in order.
func usedNamespaces(s *compile.Scenario) []string {
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
		return &compile.ScenarioError{Err: err}
	}
	return err
}
