package conntrack

import (
	"context"
	"fmt"
	"net/netip"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Change is how a connection's verdict changes from earlier programs to a
// later one.
type Change uint8

const (
	// Unchanged: the later program decides the connection as before (or
	// the change is an Allow the caller did not ask for).
	Unchanged Change = iota
	// Cut: an earlier program allowed the connection and the later one
	// denies it. The Revoker deletes exactly these entries.
	Cut
	// Allow: every earlier program denied the connection and the later
	// one allows it.
	Allow
)

// String names the change as preview prints it.
func (c Change) String() string {
	switch c {
	case Cut:
		return "would cut"
	case Allow:
		return "would allow"
	}
	return "unchanged"
}

// Judge decides connections with earlier programs and a later one. The
// Revoker and Preview share it, and its pass over the table, so that the
// connections a preview says a change would cut are the ones revocation
// deletes when the change is applied.
type Judge struct {
	// Decide decides with the later program.
	Decide DecideFunc
	// DecideBefore decides with the earlier programs; nil: Decide.
	DecideBefore DecideFunc
}

// Judge returns how c's verdict changes from olds to cur, and cur's
// decision. Allow is reported only when allows is set: revocation does
// not need it, and it costs a decision with every earlier program for
// every entry cur allows.
func (j Judge) Judge(olds []*compile.Program, cur *compile.Program, c Conn, allows bool) (Change, Decision) {
	before := j.DecideBefore
	if before == nil {
		before = j.Decide
	}
	now := decision(j.Decide, cur, c)
	switch {
	case !now.Allowed && allowedByAny(before, olds, c):
		return Cut, now
	case now.Allowed && allows && !allowedByAny(before, olds, c):
		return Allow, now
	}
	return Unchanged, now
}

// pass streams the table once and judges every forwarded entry that
// touches an address Affected names between one of olds and cur, handing
// each to fn as it arrives; nothing of the table is kept (dump.go), so a
// table that pods inflated costs time, not memory. It fills Affected and
// Dumped (0 when no address is affected: no dump is needed). When ctx
// ends, the entries left are not judged.
func (j Judge) pass(ctx context.Context, t Table, olds []*compile.Program, cur *compile.Program, allows bool,
	fn func(f *ct.Flow, c Conn, ch Change, now Decision)) (Result, error) {
	var res Result
	affected := map[netip.Addr]bool{}
	for _, old := range olds {
		for _, a := range Affected(old, cur) {
			affected[a] = true
		}
	}
	res.Affected = len(affected)
	if len(affected) == 0 {
		return res, nil
	}
	err := t.Stream(dumpFamily(affected), func(f *ct.Flow) error {
		if res.Dumped%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		res.Dumped++
		c, ok := Forwarded(f)
		if !ok || !affected[c.Src] && !affected[c.Dst] {
			return nil
		}
		ch, now := j.Judge(olds, cur, c, allows)
		fn(f, c, ch, now)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("dumping conntrack: %w", err)
	}
	return res, nil
}

// Preview streams t and calls fn with every live connection whose verdict
// candidate changes from current's (Cut or Allow), with candidate's
// decision, without deleting anything: what a Revoker would delete if
// candidate were published after current, and the denied connections it
// would let through. f is valid during the call only. When ctx ends, the
// entries left are not judged and its error is returned.
func (j Judge) Preview(ctx context.Context, t Table, current, candidate *compile.Program, fn func(f *ct.Flow, c Conn, ch Change, d Decision)) (Result, error) {
	return j.pass(ctx, t, []*compile.Program{current}, candidate, true, func(f *ct.Flow, c Conn, ch Change, d Decision) {
		if ch != Unchanged {
			fn(f, c, ch, d)
		}
	})
}

func decision(f DecideFunc, p *compile.Program, c Conn) Decision {
	a, e, r := f(p, c.Src, c.Dst, c.Proto, c.Port)
	return Decision{Allowed: a, EgressDenied: e, Reason: r}
}

func allowedByAny(decide DecideFunc, olds []*compile.Program, c Conn) bool {
	for _, p := range olds {
		if decision(decide, p, c).Allowed {
			return true
		}
	}
	return false
}

// dumpFamily is the address family whose entries can touch an affected
// address: the kernel skips the others.
func dumpFamily(affected map[netip.Addr]bool) uint8 {
	var v4, v6 bool
	for a := range affected {
		v4, v6 = v4 || a.Is4(), v6 || a.Is6()
	}
	switch {
	case v4 && !v6:
		return unix.AF_INET
	case v6 && !v4:
		return unix.AF_INET6
	}
	return unix.AF_UNSPEC
}
