package evaluate

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// DefaultUnknownPodWait bounds how long a new connection of an unknown pod
// address waits for the agent to learn the pod.
const DefaultUnknownPodWait = 2 * time.Second

// Results of a decision on a connection of an unknown pod address, as
// UnknownPodObserver receives them.
const (
	// UnknownPodProgrammed: the pod was programmed within the wait; the
	// program decided.
	UnknownPodProgrammed = "programmed"
	// UnknownPodTimeoutAllowed and UnknownPodTimeoutDropped: the wait ran
	// out (or too many packets were waiting) and --fail-open decided.
	UnknownPodTimeoutAllowed = "timeout_allowed"
	UnknownPodTimeoutDropped = "timeout_dropped"
)

// ReasonUnknownPod is the reason of a decision taken at the wait's bound.
const ReasonUnknownPod = "unknown pod address in the pod ranges: not programmed within the wait; decided by the fail mode"

// ReasonUnknownSource is the reason of a connection dropped at the wait's
// bound although --fail-open is on: its source is the unknown address.
const ReasonUnknownSource = "unknown source address in the pod ranges: not programmed within the wait; dropped whatever the fail mode"

// UnknownPodObserver receives one call per decided connection of an unknown
// pod address: the result and how long the packet waited.
type UnknownPodObserver interface {
	ObserveUnknownPod(result string, waited time.Duration)
}

// waiters lets held decisions wait for the next published program. Swap
// closes the current channel; a waiter takes the channel before reading the
// program, so it cannot miss a publication.
type waiters struct {
	mu sync.Mutex
	ch chan struct{}
}

func (w *waiters) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// waiting reports whether a decision waits for the next program.
func (w *waiters) waiting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch != nil
}

// Waiting reports whether a held connection of an unknown pod address
// waits for the next program: the controller then publishes one at once.
func (e *Evaluator) Waiting() bool { return e.waiters.waiting() }

func (w *waiters) wake() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// unknownEnds reports whether the program knows neither the pod behind src
// or dst: an address inside the pod ranges that no pod or node holds.
func unknownEnds(p *compile.Program, src, dst netip.Addr) bool {
	return len(p.PodCIDRs) > 0 && (p.IsUnknownPodAddr(src) || p.IsUnknownPodAddr(dst))
}

// Unknown reports whether c names an unknown pod address under the
// program in force: its decision should wait for the pod (DecideHeld).
// Before the first program nothing is unknown (Decide answers
// OpenWithoutProgram at once).
func (e *Evaluator) Unknown(c Conn) bool {
	p := e.prog.Load()
	return p != nil && unknownEnds(p, c.Src, c.Dst)
}

// DecideHeld waits, up to UnknownPodWait, for a program in which both ends
// of c are known, and decides with it; at the bound, or when ctx ends, it
// answers OpenWithoutProgram (the agent's --fail-open).
func (e *Evaluator) DecideHeld(ctx context.Context, c Conn) (bool, string) {
	start := time.Now()
	wait := e.UnknownPodWait
	if wait <= 0 {
		wait = DefaultUnknownPodWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch := e.waiters.next()
		p := e.prog.Load()
		if p != nil && !unknownEnds(p, c.Src, c.Dst) {
			e.observeUnknown(UnknownPodProgrammed, time.Since(start))
			return e.decideWith(p, c)
		}
		select {
		case <-ch:
		case <-timer.C:
			return e.unknownAtBound(p, c, time.Since(start))
		case <-ctx.Done():
			return e.unknownAtBound(p, c, time.Since(start))
		}
	}
}

// unknownAtBound is the fail-mode decision for a connection whose pod was
// not programmed in time under p (the last program read). --fail-open
// admits it only when its source is known: an unknown source is the pod
// whose own egress policy is not known yet, or an address a pod took that
// no pod holds (on a bridge CNI any unused address of its subnet), and
// admitting it would let that pod's egress out unchecked. Such a source is
// dropped whatever the fail mode; a known source's connection to a pod
// not yet programmed is what --fail-open is for.
func (e *Evaluator) unknownAtBound(p *compile.Program, c Conn, waited time.Duration) (bool, string) {
	open := e.OpenWithoutProgram && (p == nil || !p.IsUnknownPodAddr(c.Src))
	res := UnknownPodTimeoutDropped
	if open {
		res = UnknownPodTimeoutAllowed
	}
	e.observeUnknown(res, waited)
	if !open && e.OpenWithoutProgram {
		return false, ReasonUnknownSource
	}
	return open, ReasonUnknownPod
}

func (e *Evaluator) observeUnknown(result string, waited time.Duration) {
	if o := e.UnknownPods; o != nil {
		o.ObserveUnknownPod(result, waited)
	}
}

// DecideSides decides a connection with the program p (not necessarily the
// one in force) for callers that need the verdict and which side denied
// (pkg/conntrack's revocation): allowed, whether the source's egress
// denied (else the destination's ingress did), and the deciding reason.
// domainNames peers are decided from e.Resolved, what pods resolved, as
// for every other decision of the evaluator: a connection admitted only by
// a name is allowed by p exactly when p's rules still name it.
func (e *Evaluator) DecideSides(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) (allowed, egressDenied bool, reason string) {
	return sides(EvaluateResolved(p, e.Resolved, src, dst, proto, port))
}

// sides splits a verdict as DecideSides returns it.
func sides(v Verdict) (allowed, egressDenied bool, reason string) {
	if !v.Egress {
		return false, true, v.EgressReason
	}
	return v.Ingress, false, v.IngressReason
}

// DecideSidesBefore is DecideSides for an earlier program p, to tell
// whether p admitted a connection that is still open (pkg/conntrack's
// revocation, Config.DecideBefore). A pod that is no longer the local
// subject of any domainNames rule in the program in force counts as having
// resolved every peer of p's domainNames rules: the learner forgot its
// answers with its last such rule, and a connection that rule admitted
// must not outlive it. Whether the connection is denied now is still
// DecideSides' exact verdict, so only a connection denied now is ever
// taken for one admitted before.
func (e *Evaluator) DecideSidesBefore(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) (allowed, egressDenied bool, reason string) {
	return sides(EvaluateResolved(p, forgottenResolver{r: e.Resolved, cur: e.Program()}, src, dst, proto, port))
}

// DecideSidesBeforeIn is DecideSidesBefore as it will be once next is in
// force (a preview of next): which pods count as having forgotten their
// answers is read from next, not from the program in force.
func (e *Evaluator) DecideSidesBeforeIn(next *compile.Program) func(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) (bool, bool, string) {
	return func(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) (bool, bool, string) {
		return sides(EvaluateResolved(p, forgottenResolver{r: e.Resolved, cur: next}, src, dst, proto, port))
	}
}

// forgottenResolver is r, and true for a pod without domainNames rules in
// cur (DecideSidesBefore).
type forgottenResolver struct {
	r   Resolver
	cur *compile.Program
}

func (f forgottenResolver) Resolved(pod, peer netip.Addr, domains []compile.DomainPattern) bool {
	if f.r != nil && f.r.Resolved(pod, peer, domains) {
		return true
	}
	return f.cur != nil && !hasDomainRules(f.cur, pod)
}

// hasDomainRules reports whether the local pod at addr is the subject of
// an enabled egress rule with domainNames peers in p.
func hasDomainRules(p *compile.Program, addr netip.Addr) bool {
	id, ok := p.PodByIP(addr)
	if !ok || !p.Pods[id].Local {
		return false
	}
	pod := &p.Pods[id]
	for _, ids := range [][]compile.ClusterPolicyID{pod.AdminEgress, pod.BaselineEgress} {
		for _, cid := range ids {
			for i := range p.ClusterPolicies[cid].Egress {
				if r := &p.ClusterPolicies[cid].Egress[i]; !r.Disabled && len(r.Domains) > 0 {
					return true
				}
			}
		}
	}
	return false
}
