package kernel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// DefaultNodes are the nodes pods are spread over when a scenario names
// none, as `nftpolicy compile` and the end-to-end runner do.
var DefaultNodes = []string{"node-1", "node-2"}

// ExternalNode is the node external hosts are attached to.
const ExternalNode = "node-1"

// DefaultProbeTimeout bounds one probe. Allowed probes answer in
// milliseconds; a denied one always takes the whole timeout.
const DefaultProbeTimeout = 1500 * time.Millisecond

// Config configures a Cluster.
type Config struct {
	// Mode is the enforcement mode; empty means hybrid.
	Mode compile.Mode
	// QueueVariant is the queue rule of queue mode; empty means what
	// queuerule.ProbeQueueVariant finds on this kernel.
	QueueVariant compile.QueueVariant
	// Prefix of the lab's namespaces; empty means a random "npk-xxxxxx".
	Prefix string
	// ProbeTimeout bounds each probe; zero means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Parallelism is the number of probes in flight; <= 0 means all.
	Parallelism int
	// MutateRuleset, when set, changes every rendered ruleset before it is
	// synced. Tests use it to inject compiler bugs; nothing else should.
	MutateRuleset func(node string, rs *compile.Ruleset)
	// DenyLogGroup and DenyLogRate turn the kernel path's deny log on
	// (compile.RenderConfig); the tests read the group themselves.
	DenyLogGroup uint16
	DenyLogRate  uint32
	// FailOpen renders the queue rules with the bypass flag (--fail-open).
	FailOpen bool
	// NoSourceValidation renders no source-address validation
	// (--source-validation=false): tests use it to show what spoofing
	// does without it.
	NoSourceValidation bool
}

// Cluster is a lab whose nodes enforce a scenario's policies. Its topology
// (pods, their IPs and served ports, external hosts) grows to fit every
// scenario applied to it, so variants of one scenario (a minimizer's, or an
// edited policy) reuse the same namespaces. Not safe for concurrent use.
//
// It is not tests/internal/cluster.Cluster, on purpose: that one runs the
// real agent binary against a real API server, so a change takes an API
// write and a watch, and tests there check the agent as shipped. This one
// has no API server and runs the agent's parts in process
// (tests/internal/inproc), so that hack/diff.sh and the minimizer can apply
// thousands of generated scenarios, and deliberately broken rulesets
// (Config.MutateRuleset), in seconds.
type Cluster struct {
	cfg    Config
	rcfg   compile.RenderConfig
	lab    *netlab.Lab
	nodes  []string // lab nodes, sorted
	agents map[string]*inproc.Agent

	pods map[string]*labPod          // by scenario key
	exts map[netip.Addr]*labExternal // by address
	// nodeIPs are the lab nodes' addresses, fixed when the lab is created;
	// nodePorts the ports their host-network servers serve.
	nodeIPs   map[string][]netip.Addr
	nodePorts map[string][2][]uint16
	next      int
}

type labPod struct {
	name     string // netlab name
	node     string
	ips      []netip.Addr
	tcp, udp []uint16
}

type labExternal struct {
	name     string
	tcp, udp []uint16
}

// NewCluster creates a lab fitting s: the default nodes plus any node s
// names or lists, s's pods and external hosts. A node s lists with
// addresses gets them on its underlay (the others, and the family s does
// not give, get netlab's defaults); they stay for the cluster's lifetime.
// Nothing is enforced until Apply or Check. Close it.
func NewCluster(ctx context.Context, s *scenario.Scenario, cfg Config) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("kernel: needs root to create network namespaces and nftables rulesets")
	}
	if cfg.Mode == "" {
		cfg.Mode = compile.ModeHybrid
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cfg.Prefix == "" {
		cfg.Prefix = netlab.RandomPrefix("npk")
	}
	rcfg := compile.RenderConfig{Mode: cfg.Mode, QueueVariant: cfg.QueueVariant,
		DenyLogGroup: cfg.DenyLogGroup, DenyLogRate: cfg.DenyLogRate, DenyLogBurst: cfg.DenyLogRate, FailOpen: cfg.FailOpen,
		NoSourceValidation: cfg.NoSourceValidation}
	if (rcfg.UsesQueue() || rcfg.LearnsDNS()) && rcfg.QueueVariant == "" {
		v, err := queuerule.ProbeQueueVariant(ctx)
		if err != nil {
			return nil, fmt.Errorf("probing the queue variant: %w", err)
		}
		rcfg.QueueVariant = compile.QueueVariant(v.String())
	}
	rcfg.Defaults()
	if err := rcfg.Validate(); err != nil {
		return nil, err
	}
	cfg.QueueVariant = rcfg.QueueVariant

	nodes := append([]string(nil), DefaultNodes...)
	for _, n := range s.NodeNames(nil) {
		if !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	sort.Strings(nodes)
	var specs []netlab.NodeSpec
	for _, n := range nodes {
		var ips []netip.Addr
		if sn := s.Node(n); sn != nil {
			ips = sn.Addrs()
		}
		specs = append(specs, netlab.NodeWithIPs(n, ips))
	}
	lab, err := netlab.New(netlab.Config{Prefix: cfg.Prefix, Nodes: specs})
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, rcfg: rcfg, lab: lab, nodes: nodes, agents: map[string]*inproc.Agent{},
		pods: map[string]*labPod{}, exts: map[netip.Addr]*labExternal{},
		nodeIPs: map[string][]netip.Addr{}, nodePorts: map[string][2][]uint16{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	for _, n := range nodes {
		if c.nodeIPs[n], err = lab.IPs(netlab.Node(n)); err != nil {
			return nil, err
		}
	}
	for _, n := range nodes {
		a, err := inproc.New(lab, n, rcfg, logr.Logger{})
		if err != nil {
			return nil, err
		}
		c.agents[n] = a
	}
	if err := c.fit(s); err != nil {
		return nil, err
	}
	return c, nil
}

// Lab returns the underlying lab.
func (c *Cluster) Lab() *netlab.Lab { return c.lab }

// Nodes returns the lab's nodes.
func (c *Cluster) Nodes() []string { return append([]string(nil), c.nodes...) }

// SetMutateRuleset replaces Config.MutateRuleset for later syncs.
func (c *Cluster) SetMutateRuleset(f func(node string, rs *compile.Ruleset)) { c.cfg.MutateRuleset = f }

// PodEndpoint returns the lab endpoint of a scenario pod ("namespace/name").
func (c *Cluster) PodEndpoint(key string) (netlab.Endpoint, bool) {
	p := c.pods[key]
	if p == nil {
		return netlab.Endpoint{}, false
	}
	return netlab.Pod(p.name), true
}

// RenderConfig returns the configuration rulesets are rendered with.
func (c *Cluster) RenderConfig() compile.RenderConfig { return c.rcfg }

// QueueStats returns the NFQUEUE runtime statistics of a node (queue mode).
func (c *Cluster) QueueStats(node string) (queue.Stats, bool) {
	a := c.agents[node]
	if a == nil || a.Runtime == nil {
		return queue.Stats{}, false
	}
	return a.Runtime.Stats(), true
}

// CompatQueueRuleInstalled reports whether the node's queue chain holds the
// xt-compat NFQUEUE rule.
func (c *Cluster) CompatQueueRuleInstalled(node string) (bool, error) {
	a := c.agents[node]
	if a == nil {
		return false, fmt.Errorf("unknown node %q", node)
	}
	return a.CompatQueueRuleInstalled()
}

// Close stops the runtimes and deletes the lab.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.nodes {
		if a := c.agents[n]; a != nil {
			errs = append(errs, a.Close())
		}
	}
	errs = append(errs, c.lab.Close())
	return errors.Join(errs...)
}

// placement returns the node list pods are spread over and each pod's node,
// exactly as the compiler input places them.
func placement(s *scenario.Scenario) ([]string, map[string]string) {
	nodes := s.NodeNames(DefaultNodes)
	out := map[string]string{}
	for i := range s.Pods {
		k := s.Pods[i].Key()
		out[k] = s.PodNode(k, nodes)
	}
	return nodes, out
}

// podForIP returns the key of the scenario pod owning ip, or "": an ip
// endpoint equal to a pod's address is that pod.
func podForIP(s *scenario.Scenario, ip netip.Addr) string {
	for i := range s.Pods {
		if slices.Contains(s.Pods[i].Addrs(), ip) {
			return s.Pods[i].Key()
		}
	}
	return ""
}

// nodeForIP returns the name of the listed node owning ip, or "": an ip
// endpoint equal to a node's address is that node.
func nodeForIP(s *scenario.Scenario, ip netip.Addr) string {
	for i := range s.Nodes {
		if slices.Contains(s.Nodes[i].Addrs(), ip) {
			return s.Nodes[i].Name
		}
	}
	return ""
}

// served lists, per pod key, node name or external address, the TCP and
// UDP ports s needs served: probed ports plus the pods' container ports.
func served(s *scenario.Scenario) (pods, nodes map[string][2][]uint16, exts map[netip.Addr][2][]uint16, err error) {
	pods, nodes, exts = map[string][2][]uint16{}, map[string][2][]uint16{}, map[netip.Addr][2][]uint16{}
	add := func(l [2][]uint16, proto compile.Protocol, port uint16) [2][]uint16 {
		i := 0
		switch proto {
		case compile.ProtoTCP:
		case compile.ProtoUDP:
			i = 1
		default:
			return l // SCTP: no sockets for it in the lab
		}
		if !slices.Contains(l[i], port) {
			l[i] = append(l[i], port)
		}
		return l
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.HostNetwork {
			return nil, nil, nil, fmt.Errorf("pod %s: hostNetwork pods are not supported by the kernel harness", p.Key())
		}
		l := pods[p.Key()]
		for _, cp := range p.Ports {
			proto := compile.ProtoTCP
			if cp.Protocol != "" {
				proto, _ = compile.ParseProtocol(cp.Protocol)
			}
			l = add(l, proto, uint16(cp.Port))
		}
		pods[p.Key()] = l
	}
	for i, pr := range s.Probes {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("probes[%d]: %w", i, err)
		}
		proto := pr.ProbeProtocol()
		if proto != compile.ProtoTCP && proto != compile.ProtoUDP {
			return nil, nil, nil, fmt.Errorf("probes[%d]: only TCP and UDP can be probed", i)
		}
		if k := podForIP(s, dst); k != "" {
			pods[k] = add(pods[k], proto, uint16(pr.Port))
		} else if n := nodeForIP(s, dst); n != "" {
			nodes[n] = add(nodes[n], proto, uint16(pr.Port))
		} else {
			exts[dst] = add(exts[dst], proto, uint16(pr.Port))
		}
		if podForIP(s, src) == "" && nodeForIP(s, src) == "" {
			if _, ok := exts[src]; !ok {
				exts[src] = [2][]uint16{}
			}
		}
	}
	return pods, nodes, exts, nil
}

func covers(have, want []uint16) bool {
	for _, p := range want {
		if !slices.Contains(have, p) {
			return false
		}
	}
	return true
}

func union(a, b []uint16) []uint16 {
	out := append([]uint16(nil), a...)
	for _, p := range b {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// fit grows the lab to hold s: missing pods and external hosts are created,
// pods that moved, changed addresses or need more ports are re-created.
// Pods the lab has and s lacks stay: nothing addresses them.
func (c *Cluster) fit(s *scenario.Scenario) error {
	nodes, where := placement(s)
	for _, n := range nodes {
		if !slices.Contains(c.nodes, n) {
			return fmt.Errorf("scenario names node %q, which the lab lacks (it has %s)", n, strings.Join(c.nodes, ", "))
		}
	}
	podPorts, nodePorts, extPorts, err := served(s)
	if err != nil {
		return err
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		have, ok := c.nodeIPs[n.Name]
		if !ok {
			return fmt.Errorf("scenario lists node %q, which the lab lacks (it has %s)", n.Name, strings.Join(c.nodes, ", "))
		}
		for _, a := range n.Addrs() {
			if !slices.Contains(have, a) {
				return fmt.Errorf("node %s: the scenario gives it %s, the lab %v (node addresses are fixed when the cluster is created)", n.Name, a, have)
			}
		}
	}
	for _, n := range c.nodes {
		want, have := nodePorts[n], c.nodePorts[n]
		if covers(have[0], want[0]) && covers(have[1], want[1]) {
			continue
		}
		ports := [2][]uint16{union(have[0], want[0]), union(have[1], want[1])}
		if err := c.lab.ServeNode(n, ports[0], ports[1]); err != nil {
			return err
		}
		c.nodePorts[n] = ports
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		k := p.Key()
		want := podPorts[k]
		have := c.pods[k]
		if have != nil && have.node == where[k] && slices.Equal(have.ips, p.Addrs()) && covers(have.tcp, want[0]) && covers(have.udp, want[1]) {
			continue
		}
		if have != nil {
			if err := c.lab.RemovePod(have.name); err != nil {
				return err
			}
			if have.node == where[k] && slices.Equal(have.ips, p.Addrs()) {
				want[0], want[1] = union(want[0], have.tcp), union(want[1], have.udp)
			}
			delete(c.pods, k)
		}
		for _, o := range c.pods {
			for _, ip := range p.Addrs() {
				if slices.Contains(o.ips, ip) {
					return fmt.Errorf("pod %s: address %s is held by another pod of the lab", k, ip)
				}
			}
		}
		lp := &labPod{name: fmt.Sprintf("p%d", c.next), node: where[k], ips: p.Addrs(), tcp: union(nil, want[0]), udp: union(nil, want[1])}
		c.next++
		if err := c.lab.AddPod(netlab.PodSpec{Name: lp.name, Node: lp.node, IPs: lp.ips, TCPPorts: lp.tcp, UDPPorts: lp.udp}); err != nil {
			return fmt.Errorf("pod %s: %w", k, err)
		}
		c.pods[k] = lp
	}
	addrs := make([]netip.Addr, 0, len(extPorts))
	for a := range extPorts {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		want := extPorts[a]
		have := c.exts[a]
		if have != nil && covers(have.tcp, want[0]) && covers(have.udp, want[1]) {
			continue
		}
		if have != nil {
			if err := c.lab.RemoveExternal(have.name); err != nil {
				return err
			}
			want[0], want[1] = union(want[0], have.tcp), union(want[1], have.udp)
		}
		le := &labExternal{name: fmt.Sprintf("x%d", c.next), tcp: union(nil, want[0]), udp: union(nil, want[1])}
		c.next++
		if err := c.lab.AddExternal(netlab.ExternalSpec{Name: le.name, Node: ExternalNode, IPs: []netip.Addr{a}, TCPPorts: le.tcp, UDPPorts: le.udp}); err != nil {
			return fmt.Errorf("external host %s: %w", a, err)
		}
		c.exts[a] = le
	}
	return nil
}

// SyncResult is what applying a scenario did on each node.
type SyncResult map[string]sets.Result

// Apply makes every node enforce s: the lab is fitted to s, then each node
// gets compile.Build(s.Input(node, nodes, nil)) rendered and synced
// (incrementally after the first sync). With full, every node's table is
// rewritten as on a first sync.
func (c *Cluster) Apply(ctx context.Context, s *scenario.Scenario, full bool) (SyncResult, error) {
	if err := c.fit(s); err != nil {
		return nil, err
	}
	nodes, _ := placement(s)
	out := SyncResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(c.nodes))
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prog := compile.Build(s.Input(n, nodes, nil))
			res, err := c.agents[n].Apply(ctx, prog, c.cfg.MutateRuleset, full)
			if err == nil {
				// What the scenario's pods resolved (dnsAnswers), as if
				// they had looked their names up.
				err = c.agents[n].Seed(ctx, s)
			}
			errs[i] = err
			mu.Lock()
			out[n] = res
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Outcome is one probe on the real kernel next to the evaluator's verdict.
type Outcome struct {
	Index int
	Probe scenario.Probe
	// Src and Dst are the addresses used; SrcNode and DstNode the nodes
	// the endpoints sit on (external hosts: ExternalNode).
	Src, Dst         netip.Addr
	SrcNode, DstNode string
	// Kernel is true when the connection succeeded; KernelDetail says how
	// it failed ("timeout" for a drop).
	Kernel       bool
	KernelDetail string
	Responder    string
	// Eval is the evaluator's verdict on the cluster-wide program.
	Eval       bool
	EvalReason string
	// Err is a harness problem: the probe failed in a way no policy causes
	// (refused, unreachable, wrong responder...).
	Err error
}

// Disagrees reports whether the kernel and the evaluator differ.
func (o *Outcome) Disagrees() bool { return o.Err == nil && o.Kernel != o.Eval }

// Report is the result of probing a scenario.
type Report struct {
	Mode     compile.Mode
	Variant  compile.QueueVariant
	Outcomes []Outcome
	// Rulesets holds `nft list table inet nftpolicy` of the nodes involved
	// in a disagreement or error, by node.
	Rulesets map[string]string
	Sync     SyncResult
	Duration time.Duration
	// PodEvents and PodRebuilds count, over the nodes, the pod,
	// NetworkPolicy and ClusterNetworkPolicy changes CheckPodEvents applied
	// through the tracker and those that needed a rebuild.
	PodEvents, PodRebuilds int
}

// Disagreements returns the outcomes where kernel and evaluator differ.
func (r *Report) Disagreements() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Disagrees() {
			out = append(out, o)
		}
	}
	return out
}

// Errors returns the outcomes with harness problems.
func (r *Report) Errors() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.Err != nil {
			out = append(out, o)
		}
	}
	return out
}

// Check applies s (see Apply), runs its probes concurrently and compares
// each with the evaluator. only, when not nil, restricts the probes run to
// those indices.
func (c *Cluster) Check(ctx context.Context, s *scenario.Scenario, full bool, only []int) (*Report, error) {
	start := time.Now()
	res, err := c.Apply(ctx, s, full)
	if err != nil {
		return nil, err
	}
	rep, err := c.Probe(ctx, s, only)
	if err != nil {
		return nil, err
	}
	rep.Sync = res
	rep.Duration = time.Since(start)
	return rep, nil
}

// CheckAfter syncs before fully, then s incrementally on top of it, and
// probes s (see Check): what a controller does when the cluster changes
// from before to s.
func (c *Cluster) CheckAfter(ctx context.Context, before, s *scenario.Scenario, only []int) (*Report, error) {
	// Fit s first: re-creating a pod for s must not happen between the syncs.
	if err := c.fit(s); err != nil {
		return nil, err
	}
	if _, err := c.Apply(ctx, before, true); err != nil {
		return nil, fmt.Errorf("syncing the earlier state: %w", err)
	}
	return c.Check(ctx, s, false, only)
}

// CheckPodEvents syncs before fully, then takes each node to s as the
// agent's controller does in hybrid mode (compile.Tracker: the changes
// that are neither pods' nor policies' rebuilt, then every changed
// NetworkPolicy, ClusterNetworkPolicy and pod on its own), and probes s.
// In queue mode, where the agent rebuilds on every change, it is
// CheckAfter.
func (c *Cluster) CheckPodEvents(ctx context.Context, before, s *scenario.Scenario, only []int) (*Report, error) {
	if c.rcfg.Mode == compile.ModeQueue {
		return c.CheckAfter(ctx, before, s, only)
	}
	start := time.Now()
	if err := c.fit(s); err != nil {
		return nil, err
	}
	if _, err := c.Apply(ctx, before, true); err != nil {
		return nil, fmt.Errorf("syncing the earlier state: %w", err)
	}
	nodes, _ := placement(s)
	var tracked, rebuilt int
	for _, n := range c.nodes {
		after := s.Input(n, nodes, nil)
		t, r, err := c.agents[n].ApplyPodEvents(ctx, before.Input(n, nodes, nil), after, compile.Build(after))
		if err != nil {
			return nil, err
		}
		// What s's pods resolved, into the learned sets of the program now
		// in force (a rule whose set was recreated starts empty), as Apply
		// does.
		if err := c.agents[n].Seed(ctx, s); err != nil {
			return nil, err
		}
		tracked += t
		rebuilt += r
	}
	rep, err := c.Probe(ctx, s, only)
	if err != nil {
		return nil, err
	}
	rep.PodEvents, rep.PodRebuilds = tracked, rebuilt
	rep.Duration = time.Since(start)
	return rep, nil
}

// Probe runs s's probes (or those in only) against what the nodes enforce
// now and compares them with the evaluator's verdicts for s.
func (c *Cluster) Probe(ctx context.Context, s *scenario.Scenario, only []int) (*Report, error) {
	start := time.Now()
	_, where := placement(s)
	verdicts := s.Decide()
	idx := only
	if idx == nil {
		idx = make([]int, len(s.Probes))
		for i := range idx {
			idx[i] = i
		}
	}
	rep := &Report{Mode: c.rcfg.Mode, Outcomes: make([]Outcome, len(idx))}
	if c.rcfg.Mode == compile.ModeQueue {
		rep.Variant = c.rcfg.QueueVariant
	}
	reqs := make([]netlab.ProbeReq, len(idx))
	expect := make([]string, len(idx))
	for j, i := range idx {
		pr := s.Probes[i]
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, fmt.Errorf("probes[%d]: %w", i, err)
		}
		o := &rep.Outcomes[j]
		o.Index, o.Probe, o.Src, o.Dst = i, pr, src, dst
		o.Eval, o.EvalReason = verdicts[i].Allowed, verdicts[i].Reason()
		var from netlab.Endpoint
		if k := podForIP(s, src); k != "" {
			from, o.SrcNode = netlab.Pod(c.pods[k].name), where[k]
		} else if n := nodeForIP(s, src); n != "" {
			from, o.SrcNode = netlab.Node(n), n
		} else {
			from, o.SrcNode = netlab.Ext(c.exts[src].name), ExternalNode
		}
		if k := podForIP(s, dst); k != "" {
			expect[j], o.DstNode = c.pods[k].name, where[k]
		} else if n := nodeForIP(s, dst); n != "" {
			expect[j], o.DstNode = n, n // a node's servers answer with its name
		} else {
			expect[j], o.DstNode = c.exts[dst].name, ExternalNode
		}
		proto := netlab.TCP
		if pr.ProbeProtocol() == compile.ProtoUDP {
			proto = netlab.UDP
		}
		reqs[j] = netlab.ProbeReq{From: from, To: dst, Port: uint16(pr.Port), Proto: proto, Timeout: c.cfg.ProbeTimeout}
	}
	results := c.lab.ProbeMany(ctx, reqs, c.cfg.Parallelism)
	for j, r := range results {
		o := &rep.Outcomes[j]
		o.Kernel, o.KernelDetail, o.Responder = r.Connected, r.Reason, r.Responder
		switch {
		case r.Err != nil:
			o.Err = r.Err
		case r.Connected && r.Responder != expect[j]:
			o.Err = fmt.Errorf("answered by %q, want %q", r.Responder, expect[j])
		case !r.Connected && r.Reason != "timeout":
			// Rulesets drop; anything but silence is not a policy verdict.
			o.Err = fmt.Errorf("connection failed: %s", r.Reason)
		}
		if o.Kernel {
			o.KernelDetail = "connected"
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	involved := map[string]bool{}
	for _, o := range rep.Outcomes {
		if o.Disagrees() || o.Err != nil {
			involved[o.SrcNode], involved[o.DstNode] = true, true
		}
	}
	if len(involved) > 0 {
		rep.Rulesets = map[string]string{}
		for n := range involved {
			rep.Rulesets[n] = c.ListTable(n)
		}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// ListTable returns `nft list table inet nftpolicy` in a node (with nft's
// warnings, if any), or the error text.
func (c *Cluster) ListTable(node string) string {
	out, err := c.lab.NodeExec(node, "nft", "list", "table", "inet", compile.TableName)
	if err != nil {
		return fmt.Sprintf("(nft list failed: %v)\n%s", err, out)
	}
	return string(out)
}

func verdictWord(b bool) string {
	if b {
		return "allowed"
	}
	return "denied"
}

// Table formats the disagreements and harness errors: one row per probe,
// then the nftpolicy table of every node involved. Empty when the kernel
// and the evaluator agree on every probe.
func (r *Report) Table() string {
	var rows [][]string
	for _, o := range r.Outcomes {
		if !o.Disagrees() && o.Err == nil {
			continue
		}
		kernel := verdictWord(o.Kernel) + " (" + o.KernelDetail + ")"
		if o.Err != nil {
			kernel = "ERROR: " + o.Err.Error()
		}
		rows = append(rows, []string{
			fmt.Sprint(o.Index),
			fmt.Sprintf("%s %s@%s", o.Probe.From, o.Src, o.SrcNode),
			fmt.Sprintf("%s %s@%s", o.Probe.To, o.Dst, o.DstNode),
			fmt.Sprintf("%d/%s", o.Probe.Port, o.Probe.ProbeProtocol()),
			kernel, verdictWord(o.Eval), o.EvalReason,
		})
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	mode := string(r.Mode)
	if r.Variant != "" {
		mode += "/" + string(r.Variant)
	}
	fmt.Fprintf(&b, "kernel (mode %s) and evaluator disagree:\n", mode)
	writeTable(&b, append([][]string{{"probe", "from", "to", "port/proto", "kernel", "evaluator", "evaluator reason"}}, rows...))
	nodes := make([]string, 0, len(r.Rulesets))
	for n := range r.Rulesets {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		fmt.Fprintf(&b, "\n--- %s: nft list table inet %s ---\n%s", n, compile.TableName, r.Rulesets[n])
	}
	return b.String()
}

func writeTable(b *strings.Builder, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		for i, c := range r {
			if i == len(r)-1 {
				b.WriteString(c)
			} else {
				fmt.Fprintf(b, "%-*s  ", width[i], c)
			}
		}
		b.WriteString("\n")
	}
}
