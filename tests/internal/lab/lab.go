package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/inproc"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// DefaultNodes are the nodes every lab has, and those pods are spread over
// when a scenario names none, as `nftpolicy compile` and the end-to-end
// runner do.
var DefaultNodes = []string{"node-1", "node-2"}

// ExternalNode is the node external hosts are attached to.
const ExternalNode = "node-1"

// DefaultProbeTimeout bounds one probe. Allowed probes answer in
// milliseconds; a denied one always takes the whole timeout.
const DefaultProbeTimeout = 1500 * time.Millisecond

// Config configures a Lab.
type Config struct {
	// Mode is the enforcement mode; empty means hybrid.
	Mode compile.Mode
	// QueueVariant is the queue rule of queue mode; empty means what
	// queuerule.ProbeQueueVariant finds on this kernel.
	QueueVariant compile.QueueVariant
	// Prefix of the lab's namespaces; empty means a random "npk-xxxxxx".
	Prefix string
	// ProbeTimeout bounds each probe of a scenario; zero means
	// DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Parallelism is the number of a scenario's probes in flight; <= 0
	// means all.
	Parallelism int
	// MutateRuleset, when set, changes every rendered ruleset before it is
	// synced. Tests use it to inject compiler bugs; nothing else should.
	MutateRuleset func(node string, rs *compile.Ruleset)
	// DenyLogGroup and DenyLogRate turn the kernel path's deny log on
	// (compile.RenderConfig); the tests read the group themselves.
	DenyLogGroup uint16
	DenyLogRate  uint32
	// StagedLogGroup and StagedLogRate turn the staged log on
	// (compile.RenderConfig; the rate per source, and overall unless
	// StagedLogTotalRate is set); the tests read the group themselves.
	StagedLogGroup     uint16
	StagedLogRate      uint32
	StagedLogTotalRate uint32
	// FailOpen runs the agents with --fail-open: the queue rules' bypass,
	// DNS replies delivered unlearned with no agent, and an unknown pod's
	// connection allowed at the wait's bound.
	FailOpen bool
	// NoSourceValidation renders no source-address validation
	// (--source-validation=false): tests use it to show what spoofing
	// does without it.
	NoSourceValidation bool
	// UnknownPodWait is the evaluators' bound on holding a connection of
	// an unknown pod (0: the default).
	UnknownPodWait time.Duration
	// Revoke runs a conntrack revoker on every node after each
	// publication, as the agent does.
	Revoke bool
	// UnknownPods and Revoked, if set, observe every node's evaluator and
	// revoker.
	UnknownPods evaluate.UnknownPodObserver
	Revoked     conntrack.Observer
	// QueueSourceRate and QueueSourceBurst are queue mode's per-source
	// share of the queue (compile.RenderConfig; 0: the defaults).
	QueueSourceRate, QueueSourceBurst uint32
	// Verify samples the kernel's verdicts (compile.RenderConfig.Verify);
	// the tests read the group themselves (RunVerify).
	Verify compile.VerifyConfig
}

// Lab is a netlab lab whose nodes run the agent's parts in process. What
// they enforce comes from a scenario (Apply, Check) or from API objects
// the caller edits (objects.go: Know, SetPolicy, Publish). Its topology
// grows to fit every scenario applied to it, so variants of one scenario
// (a minimizer's, or an edited policy) reuse the same namespaces. The
// scenario methods are not safe for concurrent use; the object methods
// are.
//
// It is not tests/internal/cluster.Cluster, on purpose: that one runs the
// real agent binary against a real API server, so a change takes an API
// write and a watch, and tests there check the agent as shipped. This one
// has no API server, so that hack/diff.sh and the minimizer can apply
// thousands of generated scenarios, and deliberately broken rulesets
// (Config.MutateRuleset), in seconds, and a test can let a pod send before
// the agents know it.
type Lab struct {
	cfg    Config
	rcfg   compile.RenderConfig
	net    *netlab.Lab
	nodes  []string // lab nodes, sorted
	agents map[string]*inproc.Agent

	mu   sync.Mutex
	pods map[string]*labPod          // by "namespace/name"
	exts map[netip.Addr]*labExternal // by address
	// nodeIPs are the lab nodes' addresses, fixed when the lab is created;
	// nodePorts the ports their host-network servers serve.
	nodeIPs   map[string][]netip.Addr
	nodePorts map[string][2][]uint16
	next      int

	objects objects
	pubMu   sync.Mutex
	// tables are the revokers' conntrack connections, by node.
	tables map[string]*conntrack.KernelTable
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

// New creates a lab: DefaultNodes, each running an agent, plus what s,
// when not nil, needs: any node s names or lists, s's pods and external
// hosts. A node s lists with addresses gets them on its underlay (the
// others, and the family s does not give, get netlab's defaults); they
// stay for the lab's lifetime. Nothing is enforced until Apply, Check or
// Publish. Close it.
func New(ctx context.Context, s *scenario.Scenario, cfg Config) (_ *Lab, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("lab: needs root to create network namespaces and nftables rulesets")
	}
	rcfg, err := cfg.render(ctx)
	if err != nil {
		return nil, err
	}
	cfg.QueueVariant = rcfg.QueueVariant
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cfg.Prefix == "" {
		cfg.Prefix = netlab.RandomPrefix("npk")
	}
	if s == nil {
		s = &scenario.Scenario{}
	}
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
	nl, err := netlab.New(netlab.Config{Prefix: cfg.Prefix, Nodes: specs})
	if err != nil {
		return nil, err
	}
	l := &Lab{cfg: cfg, rcfg: rcfg, net: nl, nodes: nodes, agents: map[string]*inproc.Agent{},
		pods: map[string]*labPod{}, exts: map[netip.Addr]*labExternal{},
		nodeIPs: map[string][]netip.Addr{}, nodePorts: map[string][2][]uint16{},
		objects: newObjects(), tables: map[string]*conntrack.KernelTable{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	for i, n := range nodes {
		if l.nodeIPs[n], err = nl.IPs(netlab.Node(n)); err != nil {
			return nil, err
		}
		l.objects.addNode(n, []netip.Prefix{PodCIDR(i), PodCIDRv6(i)}, l.nodeIPs[n])
		if err := l.startAgent(n); err != nil {
			return nil, err
		}
	}
	if err := l.fit(s); err != nil {
		return nil, err
	}
	return l, nil
}

// render is the configuration the agents render with.
func (cfg Config) render(ctx context.Context) (compile.RenderConfig, error) {
	mode := cfg.Mode
	if mode == "" {
		mode = compile.ModeHybrid
	}
	rcfg := compile.RenderConfig{Mode: mode, QueueVariant: cfg.QueueVariant,
		DenyLogGroup: cfg.DenyLogGroup, DenyLogRate: cfg.DenyLogRate, DenyLogBurst: cfg.DenyLogRate, FailOpen: cfg.FailOpen,
		StagedLogGroup: cfg.StagedLogGroup, StagedLogRate: cfg.StagedLogRate, StagedLogBurst: cfg.StagedLogRate,
		StagedLogTotalRate: cmp.Or(cfg.StagedLogTotalRate, cfg.StagedLogRate), StagedLogTotalBurst: cmp.Or(cfg.StagedLogTotalRate, cfg.StagedLogRate),
		NoSourceValidation: cfg.NoSourceValidation, Verify: cfg.Verify,
		QueueSourceRate: cfg.QueueSourceRate, QueueSourceBurst: cfg.QueueSourceBurst,
		// The nodes' underlay (a veth) and the external hosts' veths are
		// no pod interfaces: outside addresses come in on them.
		UplinkIfaces: []string{"eth0", "ext*"}}
	if (rcfg.UsesQueue() || rcfg.LearnsDNS()) && rcfg.QueueVariant == "" {
		v, err := queuerule.ProbeQueueVariant(ctx)
		if err != nil {
			return rcfg, fmt.Errorf("probing the queue variant: %w", err)
		}
		rcfg.QueueVariant = compile.QueueVariant(v.String())
	}
	rcfg.Defaults()
	return rcfg, rcfg.Validate()
}

// startAgent starts node's agent, its evaluator set as Config says, and
// its revoker with Config.Revoke.
func (l *Lab) startAgent(node string) error {
	a, err := inproc.New(l.net, node, l.rcfg, logr.Logger{})
	if err != nil {
		return err
	}
	l.agents[node] = a
	a.Evaluator().UnknownPodWait = l.cfg.UnknownPodWait
	a.Evaluator().OpenWithoutProgram = l.cfg.FailOpen
	a.Evaluator().UnknownPods = l.cfg.UnknownPods
	if !l.cfg.Revoke {
		return nil
	}
	table, err := conntrack.Dial(a.NetnsFD())
	if err != nil {
		return err
	}
	l.tables[node] = table
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: a.Evaluator().DecideSides, DecideBefore: a.Evaluator().DecideSidesBefore,
		Table: table, Observer: l.cfg.Revoked, Logger: inproc.Quiet})
	if err != nil {
		return err
	}
	// Synchronous here: a publication returns once flows are revoked, so
	// callers can time the whole path. The agent runs Revoker.Run instead.
	a.OnProgram = func(old, cur *compile.Program) {
		if old != nil {
			_, _ = r.Revoke([]*compile.Program{old}, cur)
		}
	}
	return nil
}

// Net returns the underlying netlab lab.
func (l *Lab) Net() *netlab.Lab { return l.net }

// Nodes returns the lab's nodes, sorted.
func (l *Lab) Nodes() []string { return append([]string(nil), l.nodes...) }

// Agent returns a node's in-process agent (its program, evaluator, DNS
// learning, runtimes), nil for an unknown node.
func (l *Lab) Agent(node string) *inproc.Agent { return l.agents[node] }

// SetMutateRuleset replaces Config.MutateRuleset for later syncs.
func (l *Lab) SetMutateRuleset(f func(node string, rs *compile.Ruleset)) { l.cfg.MutateRuleset = f }

// ProbeTimeout returns the bound of a scenario's probes; SetProbeTimeout
// changes it for later probes.
func (l *Lab) ProbeTimeout() time.Duration     { return l.cfg.ProbeTimeout }
func (l *Lab) SetProbeTimeout(d time.Duration) { l.cfg.ProbeTimeout = d }

// PodEndpoint returns the lab endpoint of a pod ("namespace/name").
func (l *Lab) PodEndpoint(key string) (netlab.Endpoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[key]
	if p == nil {
		return netlab.Endpoint{}, false
	}
	return netlab.Pod(p.name), true
}

// ExternalEndpoint returns the lab endpoint of the external host with
// address a.
func (l *Lab) ExternalEndpoint(a netip.Addr) (netlab.Endpoint, bool) {
	x := l.exts[a]
	if x == nil {
		return netlab.Endpoint{}, false
	}
	return netlab.Ext(x.name), true
}

// RenderConfig returns the configuration rulesets are rendered with.
func (l *Lab) RenderConfig() compile.RenderConfig { return l.rcfg }

// QueueStats returns the NFQUEUE runtime statistics of a node (hybrid and
// queue mode).
func (l *Lab) QueueStats(node string) (queue.Stats, bool) {
	a := l.agents[node]
	if a == nil || a.Runtime == nil {
		return queue.Stats{}, false
	}
	return a.Runtime.Stats(), true
}

// CompatQueueRuleInstalled reports whether the node's queue chain holds the
// xt-compat NFQUEUE rule.
func (l *Lab) CompatQueueRuleInstalled(node string) (bool, error) {
	a := l.agents[node]
	if a == nil {
		return false, fmt.Errorf("unknown node %q", node)
	}
	return a.CompatQueueRuleInstalled()
}

// Conntrack dumps node's conntrack table.
func (l *Lab) Conntrack(node string) ([]ct.Flow, error) {
	a := l.agents[node]
	if a == nil {
		return nil, fmt.Errorf("unknown node %q", node)
	}
	c, err := ct.Dial(&netlink.Config{NetNS: a.NetnsFD()})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Dump(nil)
}

// ListTable returns `nft list table inet nftpolicy` in a node (with nft's
// warnings, if any), or the error text.
func (l *Lab) ListTable(node string) string {
	out, err := l.net.NodeExec(node, "nft", "list", "table", "inet", compile.TableName)
	if err != nil {
		return fmt.Sprintf("(nft list failed: %v)\n%s", err, out)
	}
	return string(out)
}

// Close stops the revokers' tables and the agents and deletes the lab.
func (l *Lab) Close() error {
	var errs []error
	for _, t := range l.tables {
		errs = append(errs, t.Close())
	}
	for _, n := range l.nodes {
		if a := l.agents[n]; a != nil {
			errs = append(errs, a.Close())
		}
	}
	errs = append(errs, l.net.Close())
	return errors.Join(errs...)
}
