package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

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

// PodForIP returns the key of the scenario pod owning ip, or "": an ip
// endpoint equal to a pod's address is that pod.
func PodForIP(s *scenario.Scenario, ip netip.Addr) string {
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
			return nil, nil, nil, fmt.Errorf("pod %s: hostNetwork pods are not supported by the lab", p.Key())
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
		if k := PodForIP(s, dst); k != "" {
			pods[k] = add(pods[k], proto, uint16(pr.Port))
		} else if n := nodeForIP(s, dst); n != "" {
			nodes[n] = add(nodes[n], proto, uint16(pr.Port))
		} else {
			exts[dst] = add(exts[dst], proto, uint16(pr.Port))
		}
		if PodForIP(s, src) == "" && nodeForIP(s, src) == "" {
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
func (l *Lab) fit(s *scenario.Scenario) error {
	nodes, where := placement(s)
	for _, n := range nodes {
		if !slices.Contains(l.nodes, n) {
			return fmt.Errorf("scenario names node %q, which the lab lacks (it has %s)", n, strings.Join(l.nodes, ", "))
		}
	}
	podPorts, nodePorts, extPorts, err := served(s)
	if err != nil {
		return err
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		have, ok := l.nodeIPs[n.Name]
		if !ok {
			return fmt.Errorf("scenario lists node %q, which the lab lacks (it has %s)", n.Name, strings.Join(l.nodes, ", "))
		}
		for _, a := range n.Addrs() {
			if !slices.Contains(have, a) {
				return fmt.Errorf("node %s: the scenario gives it %s, the lab %v (node addresses are fixed when the lab is created)", n.Name, a, have)
			}
		}
	}
	for _, n := range l.nodes {
		want, have := nodePorts[n], l.nodePorts[n]
		if covers(have[0], want[0]) && covers(have[1], want[1]) {
			continue
		}
		ports := [2][]uint16{union(have[0], want[0]), union(have[1], want[1])}
		if err := l.net.ServeNode(n, ports[0], ports[1]); err != nil {
			return err
		}
		l.nodePorts[n] = ports
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range s.Pods {
		p := &s.Pods[i]
		k := p.Key()
		want := podPorts[k]
		have := l.pods[k]
		if have != nil && have.node == where[k] && slices.Equal(have.ips, p.Addrs()) && covers(have.tcp, want[0]) && covers(have.udp, want[1]) {
			continue
		}
		if have != nil {
			if err := l.net.RemovePod(have.name); err != nil {
				return err
			}
			if have.node == where[k] && slices.Equal(have.ips, p.Addrs()) {
				want[0], want[1] = union(want[0], have.tcp), union(want[1], have.udp)
			}
			delete(l.pods, k)
		}
		for _, o := range l.pods {
			for _, ip := range p.Addrs() {
				if slices.Contains(o.ips, ip) {
					return fmt.Errorf("pod %s: address %s is held by another pod of the lab", k, ip)
				}
			}
		}
		lp := &labPod{name: fmt.Sprintf("p%d", l.next), node: where[k], ips: p.Addrs(), tcp: union(nil, want[0]), udp: union(nil, want[1])}
		l.next++
		if err := l.net.AddPod(netlab.PodSpec{Name: lp.name, Node: lp.node, IPs: lp.ips, TCPPorts: lp.tcp, UDPPorts: lp.udp}); err != nil {
			return fmt.Errorf("pod %s: %w", k, err)
		}
		l.pods[k] = lp
	}
	addrs := make([]netip.Addr, 0, len(extPorts))
	for a := range extPorts {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		want := extPorts[a]
		have := l.exts[a]
		if have != nil && covers(have.tcp, want[0]) && covers(have.udp, want[1]) {
			continue
		}
		if have != nil {
			if err := l.net.RemoveExternal(have.name); err != nil {
				return err
			}
			want[0], want[1] = union(want[0], have.tcp), union(want[1], have.udp)
		}
		le := &labExternal{name: fmt.Sprintf("x%d", l.next), tcp: union(nil, want[0]), udp: union(nil, want[1])}
		l.next++
		if err := l.net.AddExternal(netlab.ExternalSpec{Name: le.name, Node: ExternalNode, IPs: []netip.Addr{a}, TCPPorts: le.tcp, UDPPorts: le.udp}); err != nil {
			return fmt.Errorf("external host %s: %w", a, err)
		}
		l.exts[a] = le
	}
	return nil
}

// RemovePod deletes a pod's namespace from the lab, as when the pod is
// deleted, so that a later scenario may give its addresses to another pod.
// The pod must also be gone from the scenarios applied after.
func (l *Lab) RemovePod(key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[key]
	if p == nil {
		return fmt.Errorf("the lab has no pod %s", key)
	}
	if err := l.net.RemovePod(p.name); err != nil {
		return err
	}
	delete(l.pods, key)
	return nil
}

// SyncResult is what applying a scenario did on each node.
type SyncResult map[string]sets.Result

// Apply makes every node enforce s: the lab is fitted to s, then each node
// gets compile.Build(s.Input(node, nodes, nil)) rendered and synced
// (incrementally after the first sync). With full, every node's table is
// rewritten as on a first sync.
func (l *Lab) Apply(ctx context.Context, s *scenario.Scenario, full bool) (SyncResult, error) {
	if err := l.fit(s); err != nil {
		return nil, err
	}
	nodes, _ := placement(s)
	out := SyncResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(l.nodes))
	for i, n := range l.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prog := compile.Build(s.Input(n, nodes, nil))
			res, err := l.agents[n].Apply(ctx, prog, l.cfg.MutateRuleset, full)
			if err == nil {
				// What the scenario's pods resolved (dnsAnswers), as if
				// they had looked their names up.
				err = l.agents[n].Seed(ctx, s)
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

// Check applies s (see Apply), runs its probes concurrently and compares
// each with the evaluator. only, when not nil, restricts the probes run to
// those indices.
func (l *Lab) Check(ctx context.Context, s *scenario.Scenario, full bool, only []int) (*Report, error) {
	start := time.Now()
	res, err := l.Apply(ctx, s, full)
	if err != nil {
		return nil, err
	}
	rep, err := l.Probe(ctx, s, only)
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
func (l *Lab) CheckAfter(ctx context.Context, before, s *scenario.Scenario, only []int) (*Report, error) {
	// Fit s first: re-creating a pod for s must not happen between the syncs.
	if err := l.fit(s); err != nil {
		return nil, err
	}
	if _, err := l.Apply(ctx, before, true); err != nil {
		return nil, fmt.Errorf("syncing the earlier state: %w", err)
	}
	return l.Check(ctx, s, false, only)
}

// CheckPodEvents syncs before fully, then takes each node to s as the
// agent's controller does in hybrid mode (compile.Tracker: the changes
// that are neither pods' nor policies' rebuilt, then every changed
// NetworkPolicy, ClusterNetworkPolicy and pod on its own), and probes s.
// In queue mode, where the agent rebuilds on every change, it is
// CheckAfter.
func (l *Lab) CheckPodEvents(ctx context.Context, before, s *scenario.Scenario, only []int) (*Report, error) {
	if l.rcfg.Mode == compile.ModeQueue {
		return l.CheckAfter(ctx, before, s, only)
	}
	start := time.Now()
	if err := l.fit(s); err != nil {
		return nil, err
	}
	if _, err := l.Apply(ctx, before, true); err != nil {
		return nil, fmt.Errorf("syncing the earlier state: %w", err)
	}
	nodes, _ := placement(s)
	var tracked, rebuilt int
	for _, n := range l.nodes {
		after := s.Input(n, nodes, nil)
		t, r, err := l.agents[n].ApplyPodEvents(ctx, before.Input(n, nodes, nil), after, compile.Build(after))
		if err != nil {
			return nil, err
		}
		// What s's pods resolved, into the learned sets of the program now
		// in force (a rule whose set was recreated starts empty), as Apply
		// does.
		if err := l.agents[n].Seed(ctx, s); err != nil {
			return nil, err
		}
		tracked += t
		rebuilt += r
	}
	rep, err := l.Probe(ctx, s, only)
	if err != nil {
		return nil, err
	}
	rep.PodEvents, rep.PodRebuilds = tracked, rebuilt
	rep.Duration = time.Since(start)
	return rep, nil
}

// Probe runs s's probes (or those in only) against what the nodes enforce
// now and compares them with the evaluator's verdicts for s.
func (l *Lab) Probe(ctx context.Context, s *scenario.Scenario, only []int) (*Report, error) {
	start := time.Now()
	idx := only
	if idx == nil {
		idx = make([]int, len(s.Probes))
		for i := range idx {
			idx[i] = i
		}
	}
	outs, expect, err := l.probeRequests(s, idx)
	if err != nil {
		return nil, err
	}
	reqs := make([]netlab.ProbeReq, len(outs))
	for j := range outs {
		reqs[j] = outs[j].ProbeReq
	}
	for j, r := range l.net.ProbeMany(ctx, reqs, l.cfg.Parallelism) {
		o := &outs[j]
		o.ProbeResult = r
		switch {
		case r.Err != nil:
		case r.Connected && r.Responder != expect[j]:
			o.Err = fmt.Errorf("answered by %q, want %q", r.Responder, expect[j])
		case !r.Connected && r.Reason != "timeout":
			// Rulesets drop; anything but silence is not a policy verdict.
			o.Err = fmt.Errorf("connection failed: %s", r.Reason)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep := l.report(outs)
	involved := map[string]bool{}
	for _, o := range rep.Outcomes {
		if o.Disagrees() || o.Err != nil {
			involved[o.SrcNode], involved[o.DstNode] = true, true
		}
	}
	if len(involved) > 0 {
		rep.Rulesets = map[string]string{}
		for n := range involved {
			rep.Rulesets[n] = l.ListTable(n)
		}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// probeRequests returns the outcomes of s's probes idx with their requests
// and the evaluator's verdicts filled in, and the name of the server each
// should be answered by.
func (l *Lab) probeRequests(s *scenario.Scenario, idx []int) ([]Outcome, []string, error) {
	_, where := placement(s)
	verdicts := s.Decide()
	l.mu.Lock()
	defer l.mu.Unlock()
	outs := make([]Outcome, len(idx))
	expect := make([]string, len(idx))
	for j, i := range idx {
		pr := s.Probes[i]
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			return nil, nil, fmt.Errorf("probes[%d]: %w", i, err)
		}
		o := &outs[j]
		o.Index, o.Probe, o.Src = i, pr, src
		o.Want, o.WantReason = verdicts[i].Allowed, verdicts[i].Reason()
		var from netlab.Endpoint
		if k := PodForIP(s, src); k != "" {
			from, o.SrcNode = netlab.Pod(l.pods[k].name), where[k]
		} else if n := nodeForIP(s, src); n != "" {
			from, o.SrcNode = netlab.Node(n), n
		} else {
			from, o.SrcNode = netlab.Ext(l.exts[src].name), ExternalNode
		}
		if k := PodForIP(s, dst); k != "" {
			expect[j], o.DstNode = l.pods[k].name, where[k]
		} else if n := nodeForIP(s, dst); n != "" {
			expect[j], o.DstNode = n, n // a node's servers answer with its name
		} else {
			expect[j], o.DstNode = l.exts[dst].name, ExternalNode
		}
		o.ProbeReq = netlab.ProbeReq{From: from, To: dst, Port: uint16(pr.Port), Proto: netlabProto(pr.ProbeProtocol()), Timeout: l.cfg.ProbeTimeout}
	}
	return outs, expect, nil
}

// netlabProto is a probe's protocol for netlab (TCP or UDP; served
// rejects the others).
func netlabProto(p compile.Protocol) netlab.Proto {
	if p == compile.ProtoUDP {
		return netlab.UDP
	}
	return netlab.TCP
}
