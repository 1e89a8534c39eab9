// Package podlab is a two-node lab (tests/internal/netlab) with in-process
// agents (tests/internal/inproc) in hybrid mode whose API objects the
// caller edits directly: a pod's network namespace can come up before the
// agents know the pod, as when a CNI wires a pod faster than the informer
// delivers it, and each Publish plays one sync (compile, commit, publish,
// connection revocation) on every node. The unknown-pod and revocation
// tests (tests/kernel) and benchmarks (tests/bench) use it.
package podlab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Nodes are the lab's nodes; node-N's pods get addresses from PodCIDR(N).
var Nodes = []string{"node-1", "node-2"}

// PodCIDR is node-(i+1)'s pod range, 10.244.(i+1).0/24.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
}

// PodIP is the n-th address (n < 250) of node-(i+1)'s pod range.
func PodIP(i, n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), byte(n + 2)}) }

// Config configures a lab.
type Config struct {
	// UnknownPodWait is the evaluators' bound (0: the default).
	UnknownPodWait time.Duration
	// FailOpen runs the agents with --fail-open: the queue rules' bypass,
	// and an unknown pod's connection allowed at the wait's bound.
	FailOpen bool
	// Revoke runs a conntrack revoker on every node.
	Revoke bool
	// UnknownPods and Revoked, if set, observe every node's evaluator and
	// revoker.
	UnknownPods evaluate.UnknownPodObserver
	Revoked     conntrack.Observer
}

// Lab is the running lab. Its object methods are safe for concurrent use;
// Publish calls are serialized.
type Lab struct {
	Net    *netlab.Lab
	Agents map[string]*inproc.Agent

	mu         sync.Mutex
	namespaces map[string]*corev1.Namespace
	pods       map[string]*corev1.Pod
	policies   map[string]*networkingv1.NetworkPolicy
	nodes      []*corev1.Node

	pubMu    sync.Mutex
	tables   map[string]*conntrack.KernelTable
	revokers map[string]*conntrack.Revoker
}

// New creates the lab: nodes, agents (hybrid mode, the queue variant this
// kernel supports) and an empty first program. Close it.
func New(ctx context.Context, cfg Config) (_ *Lab, err error) {
	variant, err := queuerule.ProbeQueueVariant(ctx)
	if err != nil {
		return nil, fmt.Errorf("probing the queue variant: %w", err)
	}
	var specs []netlab.NodeSpec
	for _, n := range Nodes {
		specs = append(specs, netlab.NodeSpec{Name: n})
	}
	nl, err := netlab.New(netlab.Config{Prefix: netlab.RandomPrefix("npl"), Nodes: specs})
	if err != nil {
		return nil, err
	}
	l := &Lab{Net: nl, Agents: map[string]*inproc.Agent{}, namespaces: map[string]*corev1.Namespace{},
		pods: map[string]*corev1.Pod{}, policies: map[string]*networkingv1.NetworkPolicy{},
		tables: map[string]*conntrack.KernelTable{}, revokers: map[string]*conntrack.Revoker{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	for i, n := range Nodes {
		ips, err := nl.IPs(netlab.Node(n))
		if err != nil {
			return nil, err
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: corev1.NodeSpec{PodCIDRs: []string{PodCIDR(i).String()}}}
		for _, ip := range ips {
			node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
		}
		l.nodes = append(l.nodes, node)
		rcfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: variant, FailOpen: cfg.FailOpen}
		rcfg.Defaults()
		a, err := inproc.New(nl, n, rcfg, logr.Logger{})
		if err != nil {
			return nil, err
		}
		l.Agents[n] = a
		a.Evaluator().UnknownPodWait = cfg.UnknownPodWait
		a.Evaluator().OpenWithoutProgram = cfg.FailOpen
		a.Evaluator().UnknownPods = cfg.UnknownPods
		if cfg.Revoke {
			if err := l.startRevoker(n, a, cfg.Revoked); err != nil {
				return nil, err
			}
		}
	}
	return l, l.Publish(ctx)
}

func (l *Lab) startRevoker(node string, a *inproc.Agent, obs conntrack.Observer) error {
	table, err := conntrack.Dial(a.NetnsFD())
	if err != nil {
		return err
	}
	l.tables[node] = table
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: a.Evaluator().DecideSides, DecideBefore: a.Evaluator().DecideSidesBefore, Table: table, Observer: obs, Logger: inproc.Quiet})
	if err != nil {
		return err
	}
	l.revokers[node] = r
	// Synchronous here: Publish returns once flows are revoked, so callers
	// can time the whole path. The agent runs Revoker.Run instead.
	a.OnProgram = func(old, cur *compile.Program) {
		if old != nil {
			_, _ = r.Revoke([]*compile.Program{old}, cur)
		}
	}
	return nil
}

// Conntrack dumps node's conntrack table.
func (l *Lab) Conntrack(node string) ([]ct.Flow, error) {
	c, err := ct.Dial(&netlink.Config{NetNS: l.Agents[node].NetnsFD()})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Dump(nil)
}

// Namespace adds or relabels a namespace (not published).
func (l *Lab) Namespace(name string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.namespaces[name] = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// PodSpec is a pod of the lab.
type PodSpec struct {
	Namespace, Name string
	// Node indexes Nodes.
	Node     int
	IP       netip.Addr
	Labels   map[string]string
	TCPPorts []uint16
	UDPPorts []uint16
}

// StartPod wires the pod's namespace and servers: from here on it sends
// and receives, while the agents do not know it until Know and Publish.
func (l *Lab) StartPod(p PodSpec) error {
	return l.Net.AddPod(netlab.PodSpec{Name: p.Namespace + "." + p.Name, Node: Nodes[p.Node], IPs: []netip.Addr{p.IP},
		TCPPorts: p.TCPPorts, UDPPorts: p.UDPPorts})
}

// PodEndpoint is the pod's netlab endpoint, for probes.
func PodEndpoint(p PodSpec) netlab.Endpoint { return netlab.Pod(p.Namespace + "." + p.Name) }

// Know adds (or updates) the pod's API object (not published).
func (l *Lab) Know(p PodSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods[p.Namespace+"/"+p.Name] = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: maps.Clone(p.Labels),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec:   corev1.PodSpec{NodeName: Nodes[p.Node]},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.IP.String(), PodIPs: []corev1.PodIP{{IP: p.IP.String()}}},
	}
}

// SetPolicy adds or replaces a NetworkPolicy (not published).
func (l *Lab) SetPolicy(np *networkingv1.NetworkPolicy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.policies[np.Namespace+"/"+np.Name] = np
}

// DeletePolicy removes a NetworkPolicy (not published).
func (l *Lab) DeletePolicy(namespace, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.policies, namespace+"/"+name)
}

// Input is the node's compile input from the current objects.
func (l *Lab) Input(node int) compile.Input {
	l.mu.Lock()
	defer l.mu.Unlock()
	ips, _ := l.Net.IPs(netlab.Node(Nodes[node]))
	in := compile.Input{NodeName: Nodes[node], NodeIPs: ips, Nodes: l.nodes}
	for _, k := range slices.Sorted(maps.Keys(l.namespaces)) {
		in.Namespaces = append(in.Namespaces, l.namespaces[k])
	}
	for _, k := range slices.Sorted(maps.Keys(l.pods)) {
		in.Pods = append(in.Pods, l.pods[k])
	}
	for _, k := range slices.Sorted(maps.Keys(l.policies)) {
		in.Policies = append(in.Policies, l.policies[k])
	}
	return in
}

// Publish plays one sync on every node: build, commit, publish, revoke.
func (l *Lab) Publish(ctx context.Context) error {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	for i, n := range Nodes {
		if _, err := l.Agents[n].Apply(ctx, compile.Build(l.Input(i)), nil, false); err != nil {
			return err
		}
	}
	return nil
}

// QueueReceived is the number of packets the node's runtime has read.
func (l *Lab) QueueReceived(node string) uint64 { return l.Agents[node].Runtime.Stats().Received }

// Close stops the agents and removes the lab.
func (l *Lab) Close() error {
	var errs []error
	for _, c := range l.tables {
		errs = append(errs, c.Close())
	}
	for _, a := range l.Agents {
		errs = append(errs, a.Close())
	}
	errs = append(errs, l.Net.Close())
	return errors.Join(errs...)
}
