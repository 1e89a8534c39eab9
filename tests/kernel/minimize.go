package kernel

import (
	"context"
	"fmt"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// MinimizeProbeTimeout bounds each probe while minimizing: only a handful
// of probes run at a time, so allowed ones answer in milliseconds, and a
// drop costs the whole timeout on every step.
const MinimizeProbeTimeout = 600 * time.Millisecond

// MinimizeOptions tunes Minimize.
type MinimizeOptions struct {
	// Before, when set, is synced (fully) before every candidate, which is
	// then synced incrementally on top of it: for disagreements that only
	// an incremental sync from Before shows. It is not minimized.
	Before *scenario.Scenario
	// Logf, if not nil, is told about every kept step.
	Logf func(format string, args ...any)
}

// MinimizeResult is a minimized scenario and what it shows.
type MinimizeResult struct {
	Scenario *scenario.Scenario
	// Report is a full check of Scenario (full sync, every probe).
	Report *lab.Report
	// Steps counts the candidate scenarios run on the kernel; Kept those
	// that still disagreed and became the new scenario.
	Steps, Kept int
}

// Minimize shrinks s while the kernel and the evaluator still disagree on
// one of the probes given (indices into s.Probes, normally the disagreeing
// ones of a Check): greedily it drops policies and ClusterNetworkPolicies,
// then rules, peers and ports (protocols), then probes, then pods,
// container ports, namespaces and listed nodes nothing refers to, keeping each removal after which a disagreement persists. Every
// candidate is a valid scenario (scenario.Parse), fully synced on
// the real kernel (or incrementally after opts.Before) and probed again;
// only the probes of interest run until the probe stage.
func Minimize(ctx context.Context, c *lab.Lab, s *scenario.Scenario, probes []int, opts MinimizeOptions) (*MinimizeResult, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	saved := c.ProbeTimeout()
	c.SetProbeTimeout(min(saved, MinimizeProbeTimeout))
	defer c.SetProbeTimeout(saved)

	m := &minimizer{c: c, ctx: ctx, cur: lab.CloneScenario(s), focus: append([]int(nil), probes...), logf: logf, before: opts.Before}
	if len(m.focus) == 0 {
		return nil, fmt.Errorf("minimize: no probe to keep")
	}
	if ok, err := m.try("original", m.cur); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("minimize: the scenario does not disagree (with the shorter probe timeout %v)", c.ProbeTimeout())
	}
	stages := []func() error{m.policies, m.clusterPolicies, m.rules, m.clusterRules, m.peers, m.ports, m.clusterItems,
		m.probes, m.pods, m.containerPorts, m.namespaces, m.nodes}
	for _, stage := range stages {
		if err := stage(); err != nil {
			return nil, err
		}
	}
	c.SetProbeTimeout(saved)
	rep, err := m.check(m.cur, nil)
	if err != nil {
		return nil, err
	}
	return &MinimizeResult{Scenario: m.cur, Report: rep, Steps: m.steps, Kept: m.kept}, nil
}

type minimizer struct {
	c     *lab.Lab
	ctx   context.Context
	cur   *scenario.Scenario
	focus []int // probes of cur that disagreed last
	logf  func(string, ...any)
	// before is synced ahead of every candidate (see MinimizeOptions).
	before *scenario.Scenario

	steps, kept int
}

func (m *minimizer) check(cand *scenario.Scenario, focus []int) (*lab.Report, error) {
	if m.before == nil {
		return m.c.Check(m.ctx, cand, true, focus)
	}
	return m.c.CheckAfter(m.ctx, m.before, cand, focus)
}

// try runs cand on the kernel (the focus probes only) and adopts it when a
// disagreement persists.
func (m *minimizer) try(what string, cand *scenario.Scenario) (bool, error) {
	return m.tryWith(what, cand, m.focus)
}

// tryWith is try with the probes of interest given as indices into cand.
func (m *minimizer) tryWith(what string, cand *scenario.Scenario, focus []int) (bool, error) {
	valid, err := lab.Revalidate(cand)
	if err != nil {
		return false, nil // the API server would reject it: not a scenario
	}
	m.steps++
	rep, err := m.check(valid, focus)
	if err != nil {
		if m.ctx.Err() != nil {
			return false, err
		}
		return false, nil // e.g. a lab topology the candidate cannot have
	}
	var still []int
	for _, o := range rep.Outcomes {
		if o.Disagrees() {
			still = append(still, o.Index)
		}
	}
	if len(still) == 0 {
		return false, nil
	}
	m.cur, m.focus = valid, still
	m.kept++
	m.logf("minimize: %s: %d policies, %d probes, %d disagree", what, len(valid.Policies), len(valid.Probes), len(still))
	return true, nil
}

// each tries removing the items of a list from the end, so that indices of
// the items not yet tried stay valid. n reads the current length; drop
// returns a candidate without item i, or nil to skip it.
func (m *minimizer) each(what string, n func() int, drop func(i int) *scenario.Scenario) error {
	for i := n() - 1; i >= 0; i-- {
		if i >= n() {
			continue
		}
		cand := drop(i)
		if cand == nil {
			continue
		}
		if _, err := m.try(fmt.Sprintf("drop %s %d", what, i), cand); err != nil {
			return err
		}
	}
	return nil
}

func (m *minimizer) policies() error {
	return m.each("policy", func() int { return len(m.cur.Policies) }, func(i int) *scenario.Scenario {
		cand := lab.CloneScenario(m.cur)
		cand.Policies = slices.Delete(cand.Policies, i, i+1)
		return cand
	})
}

// ruleRef addresses one rule: policy index, egress or not, rule index.
type ruleRef struct {
	pol    int
	egress bool
	idx    int
}

func (m *minimizer) allRules() []ruleRef {
	var out []ruleRef
	for p := range m.cur.Policies {
		for i := range m.cur.Policies[p].Spec.Ingress {
			out = append(out, ruleRef{p, false, i})
		}
		for i := range m.cur.Policies[p].Spec.Egress {
			out = append(out, ruleRef{p, true, i})
		}
	}
	return out
}

// ruleLists returns pointers to a rule's peers and ports in s.
func ruleLists(s *scenario.Scenario, r ruleRef) (*[]networkingv1.NetworkPolicyPeer, *[]networkingv1.NetworkPolicyPort) {
	spec := &s.Policies[r.pol].Spec
	if r.egress {
		return &spec.Egress[r.idx].To, &spec.Egress[r.idx].Ports
	}
	return &spec.Ingress[r.idx].From, &spec.Ingress[r.idx].Ports
}

func (m *minimizer) rules() error {
	for p := len(m.cur.Policies) - 1; p >= 0; p-- {
		for _, egress := range []bool{true, false} {
			count := func() int {
				if egress {
					return len(m.cur.Policies[p].Spec.Egress)
				}
				return len(m.cur.Policies[p].Spec.Ingress)
			}
			err := m.each("rule", count, func(i int) *scenario.Scenario {
				cand := lab.CloneScenario(m.cur)
				spec := &cand.Policies[p].Spec
				if egress {
					spec.Egress = slices.Delete(spec.Egress, i, i+1)
				} else {
					spec.Ingress = slices.Delete(spec.Ingress, i, i+1)
				}
				return cand
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *minimizer) peers() error { return m.ruleItems("peer", true) }
func (m *minimizer) ports() error { return m.ruleItems("port", false) }

func (m *minimizer) ruleItems(what string, peers bool) error {
	rules := m.allRules()
	for k := len(rules) - 1; k >= 0; k-- {
		r := rules[k]
		count := func() int {
			pe, po := ruleLists(m.cur, r)
			if peers {
				return len(*pe)
			}
			return len(*po)
		}
		err := m.each(what, count, func(i int) *scenario.Scenario {
			cand := lab.CloneScenario(m.cur)
			pe, po := ruleLists(cand, r)
			if peers {
				*pe = slices.Delete(*pe, i, i+1)
			} else {
				*po = slices.Delete(*po, i, i+1)
			}
			return cand
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// probes keeps only the probes that disagree, then drops them one by one
// while another still disagrees.
func (m *minimizer) probes() error {
	subset := func(idx []int) *scenario.Scenario {
		cand := lab.CloneScenario(m.cur)
		cand.Probes = nil
		for _, i := range idx {
			cand.Probes = append(cand.Probes, m.cur.Probes[i])
		}
		return cand
	}
	if len(m.focus) < len(m.cur.Probes) {
		cand := subset(m.focus)
		if ok, err := m.tryWith("keep the disagreeing probes", cand, allIndices(len(cand.Probes))); err != nil || !ok {
			return err
		}
	}
	for j := len(m.cur.Probes) - 1; j >= 0 && len(m.cur.Probes) > 1; j-- {
		if j >= len(m.cur.Probes) {
			continue
		}
		rest := slices.Delete(allIndices(len(m.cur.Probes)), j, j+1)
		cand := subset(rest)
		if _, err := m.tryWith(fmt.Sprintf("drop probe %d", j), cand, allIndices(len(cand.Probes))); err != nil {
			return err
		}
	}
	return nil
}

func allIndices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// referencedPods are the pods probes name, by key or address.
func referencedPods(s *scenario.Scenario) map[string]bool {
	out := map[string]bool{}
	for i, pr := range s.Probes {
		for _, e := range []scenario.Endpoint{pr.From, pr.To} {
			if e.Pod != "" {
				out[e.Pod] = true
			}
		}
		if src, dst, err := s.ProbeAddrs(i); err == nil {
			for _, a := range []string{lab.PodForIP(s, src), lab.PodForIP(s, dst)} {
				if a != "" {
					out[a] = true
				}
			}
		}
	}
	return out
}

func (m *minimizer) pods() error {
	return m.each("pod", func() int { return len(m.cur.Pods) }, func(i int) *scenario.Scenario {
		if referencedPods(m.cur)[m.cur.Pods[i].Key()] {
			return nil
		}
		cand := lab.CloneScenario(m.cur)
		cand.Pods = slices.Delete(cand.Pods, i, i+1)
		return cand
	})
}

func (m *minimizer) containerPorts() error {
	for p := len(m.cur.Pods) - 1; p >= 0; p-- {
		err := m.each("container port", func() int { return len(m.cur.Pods[p].Ports) }, func(i int) *scenario.Scenario {
			cand := lab.CloneScenario(m.cur)
			cand.Pods[p].Ports = slices.Delete(cand.Pods[p].Ports, i, i+1)
			return cand
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *minimizer) namespaces() error {
	return m.each("namespace", func() int { return len(m.cur.Namespaces) }, func(i int) *scenario.Scenario {
		cand := lab.CloneScenario(m.cur)
		cand.Namespaces = slices.Delete(cand.Namespaces, i, i+1)
		return cand
	})
}

func (m *minimizer) clusterPolicies() error {
	return m.each("cluster policy", func() int { return len(m.cur.ClusterNetworkPolicies) }, func(i int) *scenario.Scenario {
		cand := lab.CloneScenario(m.cur)
		cand.ClusterNetworkPolicies = slices.Delete(cand.ClusterNetworkPolicies, i, i+1)
		return cand
	})
}

// clusterRuleCount returns how many ingress or egress rules ClusterNetworkPolicy p of s has.
func clusterRuleCount(s *scenario.Scenario, p int, egress bool) int {
	spec := &s.ClusterNetworkPolicies[p].Spec
	if egress {
		return len(spec.Egress)
	}
	return len(spec.Ingress)
}

func (m *minimizer) clusterRules() error {
	for p := len(m.cur.ClusterNetworkPolicies) - 1; p >= 0; p-- {
		for _, egress := range []bool{true, false} {
			err := m.each("cluster rule", func() int { return clusterRuleCount(m.cur, p, egress) }, func(i int) *scenario.Scenario {
				cand := lab.CloneScenario(m.cur)
				spec := &cand.ClusterNetworkPolicies[p].Spec
				if egress {
					spec.Egress = slices.Delete(spec.Egress, i, i+1)
				} else {
					spec.Ingress = slices.Delete(spec.Ingress, i, i+1)
				}
				return cand
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// clusterItems drops the peers and protocol entries of ClusterNetworkPolicy
// rules (a rule left without peers is invalid and is not tried).
func (m *minimizer) clusterItems() error {
	for p := len(m.cur.ClusterNetworkPolicies) - 1; p >= 0; p-- {
		for _, egress := range []bool{true, false} {
			for r := clusterRuleCount(m.cur, p, egress) - 1; r >= 0; r-- {
				for _, peers := range []bool{true, false} {
					count := func() int {
						if r >= clusterRuleCount(m.cur, p, egress) {
							return 0
						}
						spec := &m.cur.ClusterNetworkPolicies[p].Spec
						switch {
						case egress && peers:
							return len(spec.Egress[r].To)
						case egress:
							return len(spec.Egress[r].Protocols)
						case peers:
							return len(spec.Ingress[r].From)
						}
						return len(spec.Ingress[r].Protocols)
					}
					err := m.each("cluster rule item", count, func(i int) *scenario.Scenario {
						cand := lab.CloneScenario(m.cur)
						spec := &cand.ClusterNetworkPolicies[p].Spec
						switch {
						case egress && peers:
							spec.Egress[r].To = slices.Delete(spec.Egress[r].To, i, i+1)
						case egress:
							spec.Egress[r].Protocols = slices.Delete(spec.Egress[r].Protocols, i, i+1)
						case peers:
							spec.Ingress[r].From = slices.Delete(spec.Ingress[r].From, i, i+1)
						default:
							spec.Ingress[r].Protocols = slices.Delete(spec.Ingress[r].Protocols, i, i+1)
						}
						return cand
					})
					if err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// nodes drops listed nodes that no probe names and no host-network pod
// takes its addresses from; the lab keeps the node and its addresses.
func (m *minimizer) nodes() error {
	return m.each("node", func() int { return len(m.cur.Nodes) }, func(i int) *scenario.Scenario {
		name := m.cur.Nodes[i].Name
		for _, pr := range m.cur.Probes {
			if pr.From.Node == name || pr.To.Node == name {
				return nil
			}
		}
		cand := lab.CloneScenario(m.cur)
		cand.Nodes = slices.Delete(cand.Nodes, i, i+1)
		return cand
	})
}
