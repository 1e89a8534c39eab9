package queue

import (
	"net/netip"
	"sync/atomic"

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

// Evaluate decides a new connection from src to dst with the given protocol
// and destination port, using the same policy model the kernel ruleset is
// rendered from. Egress is decided for a local source pod, ingress for a
// local destination pod. It does not allocate.
func Evaluate(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) Verdict {
	src, dst = src.Unmap(), dst.Unmap()
	srcID, srcIsPod := p.PodByIP(src)
	dstID, dstIsPod := p.PodByIP(dst)
	var srcPod, dstPod *compile.Pod
	if srcIsPod {
		srcPod = &p.Pods[srcID]
	}
	if dstIsPod {
		dstPod = &p.Pods[dstID]
	}
	v := Verdict{Egress: true, Ingress: true, EgressReason: ReasonEgressNotIsolated, IngressReason: ReasonIngressNotIsolated}
	if srcIsPod && dstIsPod && srcID == dstID {
		// The API documentation: a pod cannot block access to itself (for
		// example through a Service that load-balances back to it).
		v.Allowed, v.EgressReason, v.IngressReason = true, ReasonSelf, ReasonSelf
		return v
	}

	// Egress of the source pod.
	switch {
	case srcPod == nil:
	case !srcPod.Local:
		v.EgressReason = ReasonNotEnforcedHere
	default:
		v.Egress, v.EgressReason = decideDirection(p, srcPod, compile.Egress, dstPod, dst, dstPod, proto, port)
	}

	// Ingress of the destination pod. Traffic from the pod's own node (kubelet
	// probes among it) is never filtered: no ingress peer of either API can
	// name a node, and the kernel does not filter the node's output.
	switch {
	case dstPod == nil:
	case !dstPod.Local:
		v.IngressReason = ReasonNotEnforcedHere
	case srcPod == nil && p.IsOwnNode(dstPod, src):
		if dstPod.IngressTable >= 0 || len(dstPod.AdminIngress) > 0 || len(dstPod.BaselineIngress) > 0 {
			v.IngressReason = ReasonNodeTraffic
		}
	default:
		v.Ingress, v.IngressReason = decideDirection(p, dstPod, compile.Ingress, srcPod, src, dstPod, proto, port)
	}
	v.Allowed = v.Egress && v.Ingress
	return v
}

// decideDirection decides one side of a connection for a local pod: the
// Admin tier, then the NetworkPolicies isolating the pod, then the Baseline
// tier, then allow. The remote end is the destination for egress, the
// source for ingress.
func decideDirection(p *compile.Program, pod *compile.Pod, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (bool, string) {
	passed := ""
	if ids := pod.ClusterPolicies(compile.TierAdmin, d); len(ids) > 0 {
		switch a, reason := decideTier(p, ids, d, remotePod, remote, dstPod, proto, port); a {
		case compile.ActionAccept:
			return true, reason
		case compile.ActionDeny:
			return false, reason
		case compile.ActionPass:
			passed = reason
		}
	}
	table := pod.IngressTable
	if d == compile.Egress {
		table = pod.EgressTable
	}
	if table >= 0 {
		if remotePod == nil && p.IsOwnNode(pod, remote) {
			return true, ReasonNodeTraffic
		}
		return decide(p, pod, d, remotePod, remote, dstPod, proto, port)
	}
	if ids := pod.ClusterPolicies(compile.TierBaseline, d); len(ids) > 0 {
		switch a, reason := decideTier(p, ids, d, remotePod, remote, dstPod, proto, port); a {
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
	if d == compile.Egress {
		return true, ReasonEgressNotIsolated
	}
	return true, ReasonIngressNotIsolated
}

// decideTier walks one tier's ClusterNetworkPolicies in precedence order and
// their rules in written order; the first rule that matches decides (0 when
// none does).
func decideTier(p *compile.Program, ids []compile.ClusterPolicyID, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (compile.Action, string) {
	for _, id := range ids {
		rules := p.ClusterPolicies[id].Rules(d)
		for i := range rules {
			r := &rules[i]
			if r.Disabled {
				continue
			}
			if peerMatches(p, &r.Match, remotePod, remote) && portMatches(&r.Match, dstPod, proto, port) {
				return r.Action, r.Reason
			}
		}
	}
	return 0, ""
}

// peerMatches checks the remote end against a ClusterNetworkPolicy rule's peers.
func peerMatches(p *compile.Program, m *compile.Match, remotePod *compile.Pod, remote netip.Addr) bool {
	if m.AllPeers {
		return true
	}
	if remotePod != nil {
		for _, s := range m.Selectors {
			if remotePod.InSelector(s) {
				return true
			}
		}
	}
	for _, n := range m.Nodes {
		if p.NodeSets[n].Contains(remote) {
			return true
		}
	}
	return compile.RangesContain(m.IPBlocks, remote)
}

// decide looks the connection up in the decision table of the policies
// isolating pod in direction d. The remote end (a pod or nil, and its
// address) is the source for ingress, the destination for egress. When
// several rules allow, the reason names the first in program order.
func decide(p *compile.Program, pod *compile.Pod, d compile.Direction,
	remotePod *compile.Pod, remote netip.Addr, dstPod *compile.Pod,
	proto compile.Protocol, port uint16) (bool, string) {
	ti, denied := pod.IngressTable, pod.IngressDenied
	if d == compile.Egress {
		ti, denied = pod.EgressTable, pod.EgressDenied
	}
	t := &p.Tables[ti]
	var best *compile.Rule
	for _, r := range t.AnyPeer {
		if portMatches(&r.Match, dstPod, proto, port) {
			best = r
			break
		}
	}
	if remotePod != nil {
		// Merge the pod's sorted memberships with the table's sorted selectors.
		m, bs := remotePod.MemberOf, t.BySelector
		for i, j := 0, 0; i < len(m) && j < len(bs); {
			switch {
			case m[i] < bs[j].Selector:
				i++
			case m[i] > bs[j].Selector:
				j++
			default:
				r := bs[j].Rule
				if (best == nil || r.Order < best.Order) && portMatches(&r.Match, dstPod, proto, port) {
					best = r
				}
				j++
			}
		}
	}
	for _, r := range t.Blocks {
		if best != nil && r.Order > best.Order {
			break
		}
		if compile.RangesContain(r.IPBlocks, remote) && portMatches(&r.Match, dstPod, proto, port) {
			best = r
			break
		}
	}
	if best == nil {
		return false, denied
	}
	return true, best.AllowReason
}

// portMatches checks the destination port; named ports resolve on the
// destination pod and match nothing when the destination is not a pod.
func portMatches(r *compile.Match, dstPod *compile.Pod, proto compile.Protocol, port uint16) bool {
	if r.AllPorts {
		return true
	}
	for _, pr := range r.Ports {
		if pr.Protocol == proto && pr.First <= port && port <= pr.Last {
			return true
		}
	}
	if dstPod != nil {
		for _, np := range r.NamedPorts {
			if np.Protocol != 0 && np.Protocol != proto {
				continue
			}
			if n, ok := dstPod.NamedPort(np.Name, proto); ok && n == port {
				return true
			}
		}
	}
	return false
}

// Evaluator decides queued connections from the current program. The
// program is swapped whole; readers never see a partial update.
type Evaluator struct {
	prog atomic.Pointer[compile.Program]
	// OpenWithoutProgram is what Decide answers before the first program
	// is published (the agent sets it from --fail-open).
	OpenWithoutProgram bool
}

// Swap publishes a new program. Call it only after the kernel transaction
// rendered from the same program has committed.
func (e *Evaluator) Swap(p *compile.Program) { e.prog.Store(p) }

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
	return Evaluate(p, src, dst, proto, port)
}

// Decide implements Decider for the NFQUEUE runtime. The reason is the
// denying side's, or the destination's when allowed; it never allocates.
func (e *Evaluator) Decide(pkt Packet) (bool, string) {
	v := e.Evaluate(pkt.Src, pkt.Dst, compile.Protocol(pkt.Proto), pkt.DstPort)
	if !v.Egress {
		return false, v.EgressReason
	}
	return v.Ingress, v.IngressReason
}
