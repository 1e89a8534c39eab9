package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Decision is a program's verdict on a connection.
type Decision struct {
	Allowed bool
	// EgressDenied is true when the source side denied, false when the
	// destination side did (meaningless when allowed).
	EgressDenied bool
	// Reason names the deciding policy and rule.
	Reason string
}

// DecideFunc decides a new connection from src to dst with a program: the
// agent passes the evaluator's (evaluate.Evaluator.DecideSides), which decides
// domainNames peers from what pods resolved.
type DecideFunc func(p *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) (allowed, egressDenied bool, reason string)

// Table is the conntrack table: *KernelTable satisfies it; tests may fake it.
type Table interface {
	// Stream calls fn with each entry of an address family (unix.AF_INET,
	// AF_INET6, AF_UNSPEC for both); the Flow is valid during the call
	// only. Deletions may happen during the stream.
	Stream(family uint8, fn func(f *ct.Flow) error) error
	Delete(f ct.Flow) error
}

// Observer is told each revoked flow's deciding policy, and each pass's
// duration, dumped entries and result.
type Observer interface {
	ObserveRevoked(policy string)
	ObservePass(d time.Duration, dumped int, err error)
}

// Config configures a Revoker.
type Config struct {
	// Decide decides with the new program (is the flow denied now?).
	Decide DecideFunc
	// DecideBefore, if set, decides with the earlier programs (did one
	// admit the flow?); nil: Decide. The agent passes
	// evaluate.Evaluator.DecideSidesBefore, which assumes that a pod whose
	// domainNames rules are all gone, and whose answers the learner forgot
	// with them, had resolved what those rules named.
	DecideBefore DecideFunc
	// Table is the conntrack table of the node's network namespace.
	Table Table
	// Observer, if set, receives the counts (metrics).
	Observer Observer
	Logger   klog.Logger
}

// Revoker deletes the conntrack entries of connections a new program
// denies that the previous one allowed. OnProgram only queues the change;
// Run does the work, so that the sync loop never waits on a table dump.
type Revoker struct {
	cfg Config

	mu sync.Mutex
	// olds are the programs published since the last pass, oldest first;
	// cur is the newest. A flow is revoked when cur denies it and any of
	// olds allowed it: each was in force for a while, and a flow it let in
	// is in conntrack now.
	olds []*compile.Program
	cur  *compile.Program
	kick chan struct{}
}

// NewRevoker returns a Revoker; start it with Run.
func NewRevoker(cfg Config) (*Revoker, error) {
	if cfg.Decide == nil || cfg.Table == nil {
		return nil, errors.New("conntrack revoker: Decide and Table are required")
	}
	if cfg.DecideBefore == nil {
		cfg.DecideBefore = cfg.Decide
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background().WithName("conntrack")
	}
	return &Revoker{cfg: cfg, kick: make(chan struct{}, 1)}, nil
}

// OnProgram records a publication (controller.Config.OnProgram). It does
// not block.
func (r *Revoker) OnProgram(old, cur *compile.Program) {
	r.mu.Lock()
	if old != nil && r.cur == nil {
		r.olds = append(r.olds, old)
	}
	if r.cur != nil {
		r.olds = append(r.olds, r.cur)
	}
	r.cur = cur
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run revokes after each publication until ctx ends.
func (r *Revoker) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		r.mu.Lock()
		olds, cur := r.olds, r.cur
		r.olds = nil
		r.mu.Unlock()
		if len(olds) == 0 || cur == nil {
			continue
		}
		res, err := r.Revoke(olds, cur)
		if err != nil {
			r.cfg.Logger.Error(err, "Revoking denied connections failed; they keep flowing until they end", "deleted", res.Deleted)
			continue
		}
		if res.Deleted > 0 || res.Dumped > 0 {
			r.cfg.Logger.V(2).Info("Revoked connections the new policies deny", "affectedAddresses", res.Affected,
				"dumped", res.Dumped, "deleted", res.Deleted, "duration", res.Duration)
		}
	}
}

// Result says what a pass did.
type Result struct {
	// Affected is how many local pod addresses the delta named; Dumped how
	// many conntrack entries were read (0: no dump was needed); Deleted how
	// many were deleted.
	Affected, Dumped, Deleted int
	Duration                  time.Duration
}

// Revoke runs one pass: the entries allowed by any of olds and denied by
// cur, among those touching an address Affected names, are deleted.
func (r *Revoker) Revoke(olds []*compile.Program, cur *compile.Program) (res Result, err error) {
	start := time.Now()
	defer func() {
		res.Duration = time.Since(start)
		if o := r.cfg.Observer; o != nil && (res.Dumped > 0 || err != nil) {
			o.ObservePass(res.Duration, res.Dumped, err)
		}
	}()
	var errs []error
	failed, deleted := 0, 0
	j := Judge{Decide: r.cfg.Decide, DecideBefore: r.cfg.DecideBefore}
	res, err = j.pass(context.Background(), r.cfg.Table, olds, cur, false, func(f *ct.Flow, c Conn, ch Change, now Decision) {
		if ch != Cut {
			return
		}
		if err := r.cfg.Table.Delete(ct.Flow{ID: f.ID, Zone: f.Zone, TupleOrig: f.TupleOrig, TupleReply: f.TupleReply}); err != nil {
			if !isNotFound(err) { // ended on its own meanwhile
				if failed++; len(errs) < maxPassErrors {
					errs = append(errs, fmt.Errorf("deleting %s: %w", c, err))
				}
			}
			return
		}
		deleted++
		if o := r.cfg.Observer; o != nil {
			o.ObserveRevoked(DecidingPolicy(cur, c, now))
		}
		r.cfg.Logger.V(4).Info("Revoked connection", "connection", c.String(), "reason", now.Reason)
	})
	res.Deleted = deleted
	if failed > maxPassErrors {
		errs = append(errs, fmt.Errorf("and %d more deletions failed", failed-maxPassErrors))
	}
	if err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// maxPassErrors bounds the deletion errors a pass reports one by one.
const maxPassErrors = 8

// isNotFound: the entry ended on its own between the dump and the delete.
func isNotFound(err error) bool { return errors.Is(err, os.ErrNotExist) }

// Conn is a connection as nftpolicy's forward hook saw its first packet:
// after Service DNAT, before SNAT.
type Conn struct {
	Src, Dst netip.Addr
	Proto    compile.Protocol
	Port     uint16
}

// String formats the connection for logs.
func (c Conn) String() string {
	if !c.HasPorts() {
		return fmt.Sprintf("%s %s -> %s", c.Proto.Name(), c.Src, c.Dst)
	}
	return fmt.Sprintf("%s %s -> %s", c.Proto.Name(), c.Src, netip.AddrPortFrom(c.Dst, c.Port))
}

// HasPorts reports whether the connection's protocol has ports: TCP, UDP,
// UDP-Lite, SCTP and DCCP, the protocols whose ports the queue reads
// (pkg/queue ParsePacket). Others (ICMP, ICMPv6, GRE, ESP, ...) are decided
// with port 0, which only a rule without ports admits.
func (c Conn) HasPorts() bool {
	switch c.Proto {
	case compile.ProtoTCP, compile.ProtoUDP, compile.ProtoSCTP, unix.IPPROTO_UDPLITE, unix.IPPROTO_DCCP:
		return true
	}
	return false
}

// Forwarded returns the connection of a conntrack entry as the policy saw
// it: the original tuple's source (the client before any SNAT, which
// happens after the filter hook) and the reply tuple's source (the backend
// after DNAT: the original destination may be a Service's ClusterIP) and,
// for a protocol with ports, its source port.
//
// Every protocol conntrack tracks is a connection, as the ruleset decides
// every protocol's first packet: an ICMP or ICMPv6 echo (its tuple holds
// the echo's identifier, not ports), GRE, or any protocol tracked
// generically is decided as a connection without ports, which a rule
// without ports admits and a rule with ports does not. Judging only the
// protocols with ports would let a ping admitted before a narrowing be
// answered for as long as it goes on.
func Forwarded(f *ct.Flow) (Conn, bool) {
	src, dst := f.TupleOrig.IP.SourceAddress.Unmap(), f.TupleReply.IP.SourceAddress.Unmap()
	if !src.IsValid() || !dst.IsValid() {
		return Conn{}, false
	}
	c := Conn{Src: src, Dst: dst, Proto: compile.Protocol(f.TupleOrig.Proto.Protocol)}
	if c.HasPorts() {
		c.Port = f.TupleReply.Proto.SourcePort
	}
	return c, true
}

// DecidingPolicy names the policy behind a denial, for the revoked-flows
// metric: the ClusterNetworkPolicy whose Deny rule gave the reason, else
// the NetworkPolicies isolating the denying side's pod ("ns/a, ns/b").
func DecidingPolicy(p *compile.Program, c Conn, d Decision) string {
	local, dir := c.Dst, compile.Ingress
	if d.EgressDenied {
		local, dir = c.Src, compile.Egress
	}
	id, ok := p.PodByIP(local)
	if !ok {
		return "unknown"
	}
	pod := &p.Pods[id]
	for _, t := range []compile.Tier{compile.TierAdmin, compile.TierBaseline} {
		for _, cid := range pod.ClusterPolicies(t, dir) {
			for _, r := range p.ClusterPolicies[cid].Rules(dir) {
				if r.Action == compile.ActionDeny && r.Reason == d.Reason {
					return p.ClusterPolicies[cid].Name
				}
			}
		}
	}
	var keys []string
	for _, pid := range pod.Policies(dir) {
		keys = append(keys, p.Policies[pid].Key)
	}
	if len(keys) == 0 {
		return "unknown"
	}
	return strings.Join(keys, ", ")
}
