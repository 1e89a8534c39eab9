package evaluate

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Verdict is the evaluator's decision for the first packet of a connection.
type Verdict struct {
	// Allowed is Egress && Ingress.
	Allowed bool
	// Egress reports whether the source side admits the connection, Ingress
	// whether the destination side does.
	Egress, Ingress bool
	// EgressReason and IngressReason say why, naming the deciding policy
	// and rule. They point into the program: building a Verdict allocates
	// nothing.
	EgressReason, IngressReason string
}

// Reason is the one-line explanation of the verdict: the reason of the side
// that denied, or both reasons when the connection is allowed.
func (v Verdict) Reason() string {
	switch {
	case !v.Egress:
		return v.EgressReason
	case !v.Ingress:
		return v.IngressReason
	}
	if v.EgressReason == v.IngressReason {
		return v.EgressReason
	}
	return v.EgressReason + "; " + v.IngressReason
}

// Reasons that do not depend on a policy.
const (
	ReasonEgressNotIsolated  = "source not isolated for egress"
	ReasonIngressNotIsolated = "destination not isolated for ingress"
	ReasonNotEnforcedHere    = "not enforced on this node"
	ReasonNodeTraffic        = "traffic between a node and its own pods is always allowed"
	ReasonNoProgram          = "no policy program loaded yet"
	ReasonSelf               = "a pod can always reach itself"
)

// end is one end of a connection: its address and, when a pod owns the
// address, the pod's evaluator record.
type end struct {
	addr netip.Addr
	pod  *compile.PodRecord
}

// addrMatcher checks an end's address against rules' address peers, an
// IPv4 address as the integer the ranges are held as, converted once.
type addrMatcher struct {
	addr netip.Addr
	a4   uint32
	is4  bool
}

// matcher returns the end's addrMatcher. An IPv4 address that a pod owns
// is its record's key already.
func (e *end) matcher() addrMatcher {
	if e.pod != nil && e.addr.Is4() {
		return addrMatcher{addr: e.addr, a4: e.pod.Addr, is4: true}
	}
	return newAddrMatcher(e.addr)
}

func newAddrMatcher(a netip.Addr) addrMatcher {
	m := addrMatcher{addr: a, is4: a.Is4()}
	if m.is4 {
		m.a4 = compile.Addr4(a)
	}
	return m
}

// in reports whether the match's address peers contain the address.
func (am *addrMatcher) in(x *compile.EvalIndex, m *compile.EvalMatch) bool {
	if am.is4 {
		return x.ContainsAddr4(m, am.a4)
	}
	return x.ContainsAddr(m, am.addr)
}

// Evaluate decides a new connection from src to dst with the given protocol
// and destination port, using the same policy model the kernel ruleset is
// rendered from. Egress is decided for a local source pod, ingress for a
// local destination pod. It does not allocate.
//
// It reads the program's EvalIndex: pods by address in an open-addressed
// table whose slots are the pods' 64-byte records, and decision tables
// whose rules lie next to each other, so that a verdict touches a few cache
// lines: one per end, the table's one or two, the rules it tries.
func Evaluate(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) Verdict {
	return EvaluateResolved(p, nil, src, dst, proto, port)
}

// Resolver knows what pods resolved: domainNames peers match the
// addresses a pod itself got for a matching name (pkg/fqdn's learner in the
// agent, scenario.ResolvedAnswers for scenarios). It must be safe for
// concurrent use and must not block.
type Resolver interface {
	Resolved(pod, peer netip.Addr, domains []compile.DomainPattern) bool
}

// EvaluateResolved is Evaluate with domainNames peers decided from res
// (nil: they match nothing).
func EvaluateResolved(p *compile.Program, res Resolver, src, dst netip.Addr, proto compile.Protocol, port uint16) Verdict {
	x := &p.Eval
	s, d := end{addr: src.Unmap()}, end{addr: dst.Unmap()}
	s.pod, d.pod = x.RecordsByAddr(s.addr, d.addr)
	v := Verdict{Egress: true, Ingress: true, EgressReason: ReasonEgressNotIsolated, IngressReason: ReasonIngressNotIsolated}
	if s.pod != nil && d.pod != nil && s.pod.ID == d.pod.ID {
		// The API documentation: a pod cannot block access to itself (for
		// example through a Service that load-balances back to it).
		v.Allowed, v.EgressReason, v.IngressReason = true, ReasonSelf, ReasonSelf
		return v
	}
	// Rules' ports are checked against the destination: its port names are
	// resolved once, when a rule is first tried.
	ports := portQuery{q: compile.PortQuery{Dst: d.pod, Proto: proto, Port: port}}

	// Egress of the source pod.
	switch {
	case s.pod == nil:
	case !s.pod.Local:
		v.EgressReason = ReasonNotEnforcedHere
	default:
		v.Egress, v.EgressReason = decideDirection(p, res, &s, compile.Egress, &d, &ports)
	}

	// Ingress of the destination pod. Traffic from the pod's own node (kubelet
	// probes among it) is never filtered: no ingress peer of either API can
	// name a node, and the kernel does not filter the node's output.
	switch {
	case d.pod == nil:
	case !d.pod.Local:
		v.IngressReason = ReasonNotEnforcedHere
	case s.pod == nil && p.IsOwnNode(&p.Pods[d.pod.ID], s.addr):
		if d.pod.IngressTable >= 0 || d.pod.Tiers >= 0 && (len(x.ClusterPolicies(d.pod, compile.TierAdmin, compile.Ingress)) > 0 ||
			len(x.ClusterPolicies(d.pod, compile.TierBaseline, compile.Ingress)) > 0) {
			v.IngressReason = ReasonNodeTraffic
		}
	default:
		v.Ingress, v.IngressReason = decideDirection(p, nil, &d, compile.Ingress, &s, &ports)
	}
	v.Allowed = v.Egress && v.Ingress
	return v
}

// portQuery resolves the connection's compile.PortQuery the first time a
// rule's ports are checked: most verdicts of pods that no policy isolates
// check none.
type portQuery struct {
	q     compile.PortQuery
	ready bool
}

func (pq *portQuery) get(x *compile.EvalIndex) *compile.PortQuery {
	if !pq.ready {
		x.ResolveNames(&pq.q)
		pq.ready = true
	}
	return &pq.q
}

// decideDirection decides one side of a connection for a local pod: the
// Admin tier, then the NetworkPolicies isolating the pod, then the Baseline
// tier, then allow. The remote end is the destination for egress, the
// source for ingress.
func decideDirection(p *compile.Program, res Resolver, local *end, d compile.Direction,
	remote *end, ports *portQuery) (bool, string) {
	if local.pod.Tiers < 0 {
		// No ClusterNetworkPolicy has the pod as a subject (the common
		// case): the NetworkPolicies isolating the pod decide, if any.
		if table := local.pod.Table(d); table >= 0 {
			return decideTable(p, local, d, table, remote, ports)
		}
		return true, notIsolated(d)
	}
	x := &p.Eval
	passed := ""
	for _, t := range [...]compile.Tier{compile.TierAdmin, compile.TierBaseline} {
		if t == compile.TierBaseline {
			// Between the tiers: the NetworkPolicies isolating the pod.
			if table := local.pod.Table(d); table >= 0 {
				return decideTable(p, local, d, table, remote, ports)
			}
		}
		switch a, reason := decideTier(p, res, local.addr, x.TierRulesOf(local.pod, t, d), remote, ports); a {
		case compile.ActionAccept:
			return true, reason
		case compile.ActionDeny:
			return false, reason
		case compile.ActionPass:
			passed = reason
		}
	}
	if passed != "" {
		return true, passed
	}
	return true, notIsolated(d)
}

// notIsolated is the reason of a direction no policy isolates.
func notIsolated(d compile.Direction) string {
	if d == compile.Egress {
		return ReasonEgressNotIsolated
	}
	return ReasonIngressNotIsolated
}

// decideTable decides a direction in which NetworkPolicies isolate the
// local pod: traffic between the pod and its own node passes, the rest is
// looked up in the pod's decision table.
func decideTable(p *compile.Program, local *end, d compile.Direction, table int32, remote *end, ports *portQuery) (bool, string) {
	if remote.pod == nil && p.IsOwnNode(&p.Pods[local.pod.ID], remote.addr) {
		return true, ReasonNodeTraffic
	}
	return decide(p, local, d, table, remote, ports)
}

// decideTier walks the rules of one tier's ClusterNetworkPolicies (policies
// in precedence order, rules in written order, laid out in that order); the
// first rule that matches decides (0 when none does). The port is checked
// first: it is the cheaper test and the one that fails most often.
func decideTier(p *compile.Program, res Resolver, local netip.Addr, rules []compile.EvalClusterRule,
	remote *end, ports *portQuery) (compile.Action, string) {
	if len(rules) == 0 {
		return 0, ""
	}
	x := &p.Eval
	q := ports.get(x)
	for i := range rules {
		r := &rules[i]
		if x.PortMatches(&r.EvalMatch, q) && peerMatches(p, res, local, r, remote) {
			return r.Action, r.Reason
		}
	}
	return 0, ""
}

// peerMatches checks the remote end against a ClusterNetworkPolicy rule's
// peers; domainNames peers ask res whether the local pod resolved the
// remote address.
func peerMatches(p *compile.Program, res Resolver, local netip.Addr, r *compile.EvalClusterRule, remote *end) bool {
	if r.AllPeers {
		return true
	}
	x := &p.Eval
	if remote.pod != nil && r.Selectors.Len > 0 {
		for _, s := range x.ClusterSelectors[r.Selectors.Off : r.Selectors.Off+r.Selectors.Len] {
			if x.InSelector(remote.pod, s) {
				return true
			}
		}
	}
	if r.HasNodes {
		for _, n := range r.Rule.Nodes {
			if p.NodeSets[n].Contains(remote.addr) {
				return true
			}
		}
	}
	if res != nil && len(r.Rule.Domains) > 0 && res.Resolved(local, remote.addr, r.Rule.Domains) {
		return true
	}
	am := remote.matcher()
	return am.in(x, &r.EvalMatch)
}

// decide looks the connection up in the decision table of the policies
// isolating the local pod in direction d (at offset ti of TableData). The
// remote end is the source for ingress, the destination for egress. When
// several rules allow, the reason names the first in program order; a
// table's rules are in that order, so the smallest table-relative index
// wins.
func decide(p *compile.Program, local *end, d compile.Direction, ti int32,
	remote *end, ports *portQuery) (bool, string) {
	x := &p.Eval
	// The table's layout is EvalIndex.TableData's; its parts are read in
	// place rather than through compile.EvalTable's slices, which cost
	// more than the rest of a typical walk.
	h := (*[compile.TableHeader]uint32)(x.TableData[ti:])
	ro, nAny, nBlocks, nSel, selBits, nRules := h[0], h[1], h[2], h[3], h[4], h[5]
	data := x.TableData[int(ti)+compile.TableHeader:]
	rules := x.Rules[ro : ro+nRules]
	selOff := nAny + nBlocks
	ruleOff, fOff := selOff+nSel, selOff+2*nSel
	filter := func(ri uint32) uint64 {
		return uint64(data[fOff+2*ri]) | uint64(data[fOff+2*ri+1])<<32
	}
	q := ports.get(x)
	// A rule whose port filter rules the port out is not read.
	qf := q.Filter
	best := nRules // none yet: past every rule
	for _, ri := range data[:nAny] {
		if filter(ri)&qf != 0 && x.PortMatches(&rules[ri].EvalMatch, q) {
			best = ri
			break
		}
	}
	if remote.pod != nil && nSel > 0 {
		// Look the pod's memberships up in the table's sorted selectors
		// (data[ruleOff+j] is the rule of data[selOff+j]), skipping those
		// the table's summary rules out; both lists are sorted, so each
		// search starts where the previous one ended.
		j := selOff
		for _, sel := range x.MemberOf(remote.pod) {
			if selBits&compile.SelectorBit(sel) == 0 {
				continue
			}
			s := uint32(sel)
			for lo, hi := j, ruleOff; lo < hi; {
				if m := (lo + hi) >> 1; data[m] < s {
					lo, j = m+1, m+1
				} else {
					hi = m
				}
			}
			for ; j < ruleOff && data[j] == s; j++ {
				if ri := data[j+nSel]; ri < best && filter(ri)&qf != 0 && x.PortMatches(&rules[ri].EvalMatch, q) {
					best = ri
				}
			}
			if j == ruleOff {
				break
			}
		}
	}
	if nBlocks > 0 && data[nAny] < best {
		am := remote.matcher()
		for _, ri := range data[nAny:selOff] {
			if ri > best {
				break
			}
			// The port first: the rule's line is read either way, and
			// the port test fails more often (address peers are wide).
			if filter(ri)&qf == 0 {
				continue
			}
			if m := &rules[ri].EvalMatch; x.PortMatches(m, q) && am.in(x, m) {
				best = ri
				break
			}
		}
	}
	if best >= nRules {
		// The reason a denial gives is in the pod's record, read already.
		return false, p.DeniedReason(local.pod, d)
	}
	return true, rules[best].Reason
}

// Evaluator decides connections from the program in force on the node. The
// program is swapped whole; readers never see a partial update.
type Evaluator struct {
	prog atomic.Pointer[compile.Program]
	// OpenWithoutProgram is what Decide answers before the first program
	// is published, and for a connection of an unknown pod address that
	// was not programmed within UnknownPodWait (the agent sets it from
	// --fail-open).
	OpenWithoutProgram bool
	// UnknownPodWait bounds how long DecideHeld waits for an unknown pod
	// address to be programmed (0: DefaultUnknownPodWait).
	UnknownPodWait time.Duration
	// UnknownPods, if set, is told every decision on an unknown pod address.
	UnknownPods UnknownPodObserver
	waiters     waiters
	// Resolved, if set, decides domainNames peers (the agent's DNS learner).
	Resolved Resolver
	// Snapshots, if not nil, keeps a snapshot of the program in force on
	// the node for a restarted agent (see Restore).
	Snapshots *Snapshots
}

// Swap publishes a new program and wakes the decisions waiting for a pod
// to be programmed (unknown.go). Call it only after the kernel transaction
// rendered from the same program has committed.
func (e *Evaluator) Swap(p *compile.Program) {
	s := e.Snapshots
	if s != nil {
		s.invalidate() // before: the old snapshot must not outlive its program
	}
	e.prog.Store(p)
	e.waiters.wake()
	if s != nil {
		s.save(p)
	}
}

// Restore publishes p, rebuilt from a snapshot, unless a program was
// published already (the first sync was faster: its program is newer).
// It reports whether p is in force; if so, decisions waiting for an
// unknown pod address are woken to look it up in p.
func (e *Evaluator) Restore(p *compile.Program) bool {
	if !e.prog.CompareAndSwap(nil, p) {
		return false
	}
	e.waiters.wake()
	return true
}

// Program returns the program in use, or nil before the first Swap.
func (e *Evaluator) Program() *compile.Program { return e.prog.Load() }

// Evaluate decides a connection against the current program. Before any
// program is loaded it answers OpenWithoutProgram, with a reason saying so.
func (e *Evaluator) Evaluate(src, dst netip.Addr, proto compile.Protocol, port uint16) Verdict {
	p := e.prog.Load()
	if p == nil {
		o := e.OpenWithoutProgram
		return Verdict{Allowed: o, Egress: o, Ingress: o, EgressReason: ReasonNoProgram, IngressReason: ReasonNoProgram}
	}
	return EvaluateResolved(p, e.Resolved, src, dst, proto, port)
}

// Conn is a new connection as the Evaluator's methods decide it.
type Conn struct {
	Src, Dst netip.Addr
	Proto    compile.Protocol
	// Port is the destination port (0 for protocols without ports).
	Port uint16
}

// Decide decides c with the program in force for the NFQUEUE runtime
// (queue.Evaluating). The reason is the denying side's, or the
// destination's when allowed; it never allocates.
//
// A connection of an unknown pod address (see Unknown) that reaches Decide
// was not held, because too many were waiting already: it gets the
// decision of the wait's bound, never the unrestricted verdict of an
// address no policy knows.
func (e *Evaluator) Decide(c Conn) (bool, string) {
	p := e.prog.Load()
	if p == nil {
		return e.OpenWithoutProgram, ReasonNoProgram
	}
	if unknownEnds(p, c.Src, c.Dst) {
		return e.unknownAtBound(p, c, 0)
	}
	return e.decideWith(p, c)
}

func (e *Evaluator) decideWith(p *compile.Program, c Conn) (bool, string) {
	// With Resolved: domainNames peers match what the pod resolved.
	v := EvaluateResolved(p, e.Resolved, c.Src, c.Dst, c.Proto, c.Port)
	if !v.Egress {
		return false, v.EgressReason
	}
	return v.Ingress, v.IngressReason
}
