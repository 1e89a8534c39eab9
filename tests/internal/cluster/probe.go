package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	ct "github.com/ti-mo/conntrack"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// FingerprintMetric is the agent metric WaitProgrammed compares.
const FingerprintMetric = "nftpolicy_last_synced_inputs_fingerprint"

// DefaultWaitTimeout bounds WaitProgrammed unless ctx ends sooner.
const DefaultWaitTimeout = time.Minute

// podSourceSlicesMetric is 1 while an agent reads other nodes' pods from
// PodAddressSlices (--pod-source slices, the publisher's synced Lease
// fresh).
const podSourceSlicesMetric = `nftpolicy_pod_source{source="slices"}`

// slicesFingerprint returns, for a node, the inputs fingerprint of an
// agent there that reads other nodes' pods from the slices: in with its
// own node's Pods only, and the pods the slices hold that are not of its
// node, each with the version the agent gives it
// (podstore.SliceEntryVersion). A pod two slices hold (moving, for a
// moment) counts once.
func (c *Cluster) slicesFingerprint(ctx context.Context, in compile.Input) (func(node string) uint64, error) {
	list, err := dynamic.NewForConfigOrDie(c.Env.RESTConfig()).Resource(podslice.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pod slices: %w", err)
	}
	var held []*compile.PodInfo
	for i := range list.Items {
		b, err := list.Items[i].MarshalJSON()
		if err != nil {
			return nil, err
		}
		var sl podslice.PodAddressSlice
		if err := json.Unmarshal(b, &sl); err != nil {
			return nil, err
		}
		pods, _ := podslice.PodInfos(&sl)
		held = append(held, pods...)
	}
	return func(node string) uint64 {
		own := in
		own.Pods, own.PodInfos = nil, nil
		for _, p := range in.Pods {
			if p.Spec.NodeName == node {
				own.Pods = append(own.Pods, p)
			}
		}
		seen := map[string]bool{}
		for _, p := range held {
			if p.Node == node || seen[p.Key] {
				continue
			}
			seen[p.Key] = true
			q := *p
			q.ResourceVersion = podstore.SliceEntryVersion(p)
			own.PodInfos = append(own.PodInfos, &q)
		}
		return controller.InputsFingerprint(own)
	}, nil
}

// WaitProgrammed waits until every running agent has committed a sync
// compiled from the API's current objects (ListInputs): the
// agent's nftpolicy_last_synced_inputs_fingerprint equals
// controller.InputsFingerprint of what the API lists now. The API is listed
// again on every round, so a change made meanwhile is waited for too. It
// returns how long it waited; it fails early when an agent exits. An agent
// reading PodAddressSlices (its nftpolicy_pod_source says slices) is
// compared with what the slices say of other nodes' pods instead.
func (c *Cluster) WaitProgrammed(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := waitCtx(ctx, DefaultWaitTimeout)
	defer cancel()
	var agents []*Agent
	for _, a := range c.Agents() {
		if a.Running() {
			agents = append(agents, a)
		}
	}
	if len(agents) == 0 {
		return 0, errors.New("cluster: WaitProgrammed: no agent is running")
	}
	if c.cfg.Enforcer == EnforcerKNP {
		return c.waitKNPProgrammed(ctx, agents)
	}
	var want uint64
	have := make([]float64, len(agents))
	wants := make([]uint64, len(agents))
	errs := make([]error, len(agents))
	for {
		in, err := c.ListInputs(ctx)
		var fromSlices func(node string) uint64
		if err == nil {
			fromSlices, err = c.slicesFingerprint(ctx, in)
		}
		if err == nil {
			want = controller.InputsFingerprint(in)
			done := true
			var wg sync.WaitGroup
			for i, a := range agents {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if !a.Running() {
						errs[i] = fmt.Errorf("the agent of %s exited; log tail:\n%s", a.Node, a.LogTail(30))
						return
					}
					m, err := a.Metrics(ctx)
					if err != nil {
						errs[i] = err
						return
					}
					have[i], errs[i] = m[FingerprintMetric], nil
					wants[i] = want
					if m[podSourceSlicesMetric] == 1 {
						wants[i] = fromSlices(a.Node)
					}
				}()
			}
			wg.Wait()
			for i, a := range agents {
				if errs[i] != nil && !a.Running() {
					return time.Since(start), fmt.Errorf("cluster: WaitProgrammed: %w", errs[i])
				}
				if errs[i] != nil || uint64(have[i]) != wants[i] {
					done = false
				}
			}
			if done {
				return time.Since(start), nil
			}
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			fmt.Fprintf(&b, "cluster: WaitProgrammed: %v after %v; API inputs fingerprint %d (list error: %v)", ctx.Err(), time.Since(start).Round(time.Millisecond), want, err)
			for i, a := range agents {
				fmt.Fprintf(&b, "\n  agent of %s: fingerprint %d (want %d), scrape error %v; log tail:\n%s", a.Node, uint64(have[i]), wants[i], errs[i], a.LogTail(15))
			}
			return time.Since(start), errors.New(b.String())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// DefaultProbeTimeout bounds one probe of ProbeAll. An allowed connection
// answers in milliseconds; a denied one takes the whole timeout.
const DefaultProbeTimeout = time.Second

// ProbeOptions selects what ProbeAll tries.
type ProbeOptions struct {
	// Port and Proto of every connection; 0 and "" mean 80/TCP.
	Port  uint16
	Proto netlab.Proto
	// Pods restricts sources and destinations ("namespace/name"); empty
	// means every pod of the harness.
	Pods []string
	// Timeout of one probe; 0 means DefaultProbeTimeout.
	Timeout time.Duration
}

// Cell is one connection of a Matrix: what real packets did and what the
// evaluator decides cluster-wide.
type Cell struct {
	From, To string
	Src, Dst netip.Addr
	// Kernel is true when the connection succeeded; Detail says how it
	// failed otherwise ("timeout" for a drop).
	Kernel bool
	Detail string
	// Eval is the evaluator's verdict and Reason its explanation.
	Eval   bool
	Reason string
	// Err is a harness problem (no common address family, a refused or
	// reset connection, a wrong responder), not a verdict.
	Err error
}

// Mismatch reports whether the cell is a disagreement or a harness problem.
func (c *Cell) Mismatch() bool { return c.Err != nil || c.Kernel != c.Eval }

// Matrix is the result of ProbeAll: every ordered pair of distinct pods.
type Matrix struct {
	Port  uint16
	Proto netlab.Proto
	Pods  []string
	cells map[[2]string]*Cell
}

// Cell returns the cell from -> to, nil for from == to or unknown pods.
func (m *Matrix) Cell(from, to string) *Cell { return m.cells[[2]string{from, to}] }

// Cells returns every cell, in row order.
func (m *Matrix) Cells() []*Cell {
	var out []*Cell
	for _, f := range m.Pods {
		for _, t := range m.Pods {
			if c := m.Cell(f, t); c != nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// Mismatches returns the cells where the kernel and the evaluator disagree
// or the probe had a harness problem.
func (m *Matrix) Mismatches() []*Cell {
	var out []*Cell
	for _, c := range m.Cells() {
		if c.Mismatch() {
			out = append(out, c)
		}
	}
	return out
}

// Grid formats the matrix: rows are sources, columns destinations, '.'
// connected and 'X' blocked on real packets, '-' for a pod to itself, '!'
// after a cell where the evaluator disagrees and '?' on a harness problem.
func (m *Matrix) Grid() string {
	w := 0
	for _, p := range m.Pods {
		w = max(w, len(p))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%*s", w, "")
	for _, p := range m.Pods {
		fmt.Fprintf(&b, " %*s", max(len(p), 3), p)
	}
	b.WriteString("\n")
	for _, f := range m.Pods {
		fmt.Fprintf(&b, "%-*s", w, f)
		for _, t := range m.Pods {
			s := "-"
			if c := m.Cell(f, t); c != nil {
				switch {
				case c.Err != nil:
					s = "?"
				case c.Kernel:
					s = "."
				default:
					s = "X"
				}
				if c.Err == nil && c.Kernel != c.Eval {
					s += "!"
				}
			}
			fmt.Fprintf(&b, " %*s", max(len(t), 3), s)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Report describes the mismatches, one line each; empty when there are none.
func (m *Matrix) Report() string {
	var b strings.Builder
	for _, c := range m.Mismatches() {
		if c.Err != nil {
			fmt.Fprintf(&b, "%s -> %s (%s -> %s %d/%s): harness problem: %v\n", c.From, c.To, c.Src, c.Dst, m.Port, m.Proto, c.Err)
			continue
		}
		fmt.Fprintf(&b, "%s -> %s (%s -> %s %d/%s): kernel %s (%s), evaluator %s: %s\n", c.From, c.To, c.Src, c.Dst, m.Port, m.Proto,
			word(c.Kernel), c.Detail, word(c.Eval), c.Reason)
	}
	return b.String()
}

func word(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// pickAddrs chooses the probe's addresses: IPv4 when both pods have it,
// else IPv6.
func pickAddrs(src, dst []netip.Addr) (netip.Addr, netip.Addr, bool) {
	for _, a := range src {
		for _, b := range dst {
			if a.Is4() == b.Is4() {
				return a, b, true
			}
		}
	}
	return netip.Addr{}, netip.Addr{}, false
}

// ProbeAll opens one new connection between every ordered pair of distinct
// pods, all at once, and puts each next to the evaluator's verdict on the
// cluster-wide program built from the API's current objects (what
// `nftpolicy eval` answers for that state). Call WaitProgrammed first.
func (c *Cluster) ProbeAll(ctx context.Context, o ProbeOptions) (*Matrix, error) {
	if o.Port == 0 {
		o.Port = 80
	}
	if o.Proto == "" {
		o.Proto = netlab.TCP
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultProbeTimeout
	}
	pods := o.Pods
	if len(pods) == 0 {
		pods = c.Pods()
	}
	pods = append([]string(nil), pods...)
	sort.Strings(pods)
	prog, err := c.Program(ctx)
	if err != nil {
		return nil, err
	}
	proto := compile.ProtoTCP
	if o.Proto == netlab.UDP {
		proto = compile.ProtoUDP
	}
	m := &Matrix{Port: o.Port, Proto: o.Proto, Pods: pods, cells: map[[2]string]*Cell{}}
	var reqs []netlab.ProbeReq
	var reqCells []*Cell
	names := map[string]string{} // netlab name -> pod key
	for _, f := range pods {
		from, err := c.PodEndpoint(f)
		if err != nil {
			return nil, err
		}
		names[from.Name] = f
		for _, t := range pods {
			if f == t {
				continue
			}
			cell := &Cell{From: f, To: t}
			m.cells[[2]string{f, t}] = cell
			src, dst, ok := pickAddrs(c.PodIPs(f), c.PodIPs(t))
			if !ok {
				cell.Err = errors.New("no common address family")
				continue
			}
			cell.Src, cell.Dst = src, dst
			v := evaluate.Evaluate(prog, src, dst, proto, o.Port)
			cell.Eval, cell.Reason = v.Allowed, v.Reason()
			reqs = append(reqs, netlab.ProbeReq{From: from, To: dst, Port: o.Port, Proto: o.Proto, Timeout: o.Timeout})
			reqCells = append(reqCells, cell)
		}
	}
	for i, r := range c.Lab.ProbeMany(ctx, reqs, 0) {
		cell := reqCells[i]
		cell.Kernel, cell.Detail = r.Connected, r.Reason
		switch {
		case r.Err != nil:
			cell.Err = r.Err
		case r.Connected && names[r.Responder] != cell.To:
			cell.Err = fmt.Errorf("answered by %q", r.Responder)
		case !r.Connected && r.Reason != "timeout":
			cell.Err = fmt.Errorf("connection failed: %s (policies drop silently)", r.Reason)
		}
		if r.Connected {
			cell.Detail = "connected"
		}
	}
	return m, ctx.Err()
}

// Verify waits until every agent is programmed, probes every pair and
// returns the matrix, with an error listing every mismatch (and the tables
// of the nodes involved) when real packets and the evaluator disagree.
func (c *Cluster) Verify(ctx context.Context, o ProbeOptions) (*Matrix, error) {
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return nil, err
	}
	m, err := c.ProbeAll(ctx, o)
	if err != nil {
		return m, err
	}
	if bad := m.Mismatches(); len(bad) > 0 {
		involved := map[string]bool{}
		for _, cell := range bad {
			involved[c.PodNode(cell.From)], involved[c.PodNode(cell.To)] = true, true
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%d of %d connections disagree with the evaluator (%s agents):\n%s\n%s", len(bad), len(m.Cells()), c.cfg.Mode, m.Report(), m.Grid())
		for _, n := range c.nodes {
			if involved[n] {
				fmt.Fprintf(&b, "\n--- nft list table inet %s on %s:\n%s", compile.TableName, n, c.ListTable(n))
			}
		}
		return m, errors.New(b.String())
	}
	return m, nil
}

// Explain returns the evaluator's verdict and reason for a connection
// between two pods on the API's current state.
func (c *Cluster) Explain(ctx context.Context, from, to string, port uint16, proto netlab.Proto) (evaluate.Verdict, error) {
	prog, err := c.Program(ctx)
	if err != nil {
		return evaluate.Verdict{}, err
	}
	src, dst, ok := pickAddrs(c.PodIPs(from), c.PodIPs(to))
	if !ok {
		return evaluate.Verdict{}, fmt.Errorf("%s and %s share no address family", from, to)
	}
	p := compile.ProtoTCP
	if proto == netlab.UDP {
		p = compile.ProtoUDP
	}
	return evaluate.Evaluate(prog, src, dst, p, port), nil
}

// ProbeScenario runs a scenario's probes on real packets and puts each next
// to the verdict the scenario decides for it (scenario.Decide, which
// `nftpolicy eval` prints: domainNames peers match its dnsAnswers). Apply
// the scenario and call WaitProgrammed first. Only probes between pods of
// the harness are supported; From and To of each cell are the probe's
// endpoints.
func (c *Cluster) ProbeScenario(ctx context.Context, s *scenario.Scenario, timeout time.Duration) ([]*Cell, error) {
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	cells, protos, err := scenarioCells(s)
	if err != nil {
		return nil, err
	}
	reqs := make([]netlab.ProbeReq, len(cells))
	for i, cell := range cells {
		from, err := c.PodEndpoint(cell.From)
		if err != nil {
			return nil, fmt.Errorf("probes[%d]: %w", i, err)
		}
		reqs[i] = netlab.ProbeReq{From: from, To: cell.Dst, Port: uint16(s.Probes[i].Port), Proto: protos[i], Timeout: timeout}
	}
	for i, r := range c.Lab.ProbeMany(ctx, reqs, 0) {
		cell := cells[i]
		cell.Kernel, cell.Detail = r.Connected, r.Reason
		switch {
		case r.Err != nil:
			cell.Err = r.Err
		case !r.Connected && r.Reason != "timeout":
			cell.Err = fmt.Errorf("connection failed: %s (is the port served?)", r.Reason)
		}
		if r.Connected {
			cell.Detail = "connected"
		}
	}
	return cells, ctx.Err()
}

// scenarioCells gives every probe of s a cell holding the scenario's
// verdict, and the protocol to probe it with; a probe the cluster cannot
// run (an end that is not a pod, a protocol other than TCP and UDP) is an
// error.
func scenarioCells(s *scenario.Scenario) ([]*Cell, []netlab.Proto, error) {
	verdicts := s.Decide()
	cells := make([]*Cell, len(s.Probes))
	protos := make([]netlab.Proto, len(s.Probes))
	for i, pr := range s.Probes {
		if pr.From.Pod == "" || pr.To.Pod == "" {
			return nil, nil, fmt.Errorf("probes[%d]: only probes between pods are supported", i)
		}
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, nil, fmt.Errorf("probes[%d]: %w", i, err)
		}
		switch pr.ProbeProtocol() {
		case compile.ProtoTCP:
			protos[i] = netlab.TCP
		case compile.ProtoUDP:
			protos[i] = netlab.UDP
		default:
			return nil, nil, fmt.Errorf("probes[%d]: only TCP and UDP can be probed", i)
		}
		cells[i] = &Cell{From: pr.From.Pod, To: pr.To.Pod, Src: src, Dst: dst, Eval: verdicts[i].Allowed, Reason: verdicts[i].Reason()}
	}
	return cells, protos, nil
}

// Conntrack dumps the conntrack table of a node's namespace.
func (c *Cluster) Conntrack(node string) ([]ct.Flow, error) {
	var flows []ct.Flow
	err := c.Lab.InNode(node, func() error {
		conn, err := ct.Dial(nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		flows, err = conn.Dump(nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: %w", node, err)
	}
	return flows, nil
}
