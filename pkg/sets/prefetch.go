package sets

import (
	"context"

	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
)

// A full sync over a hooked table reads the kernel's sets (resync.go). That
// read needs nothing of the desired ruleset but the names to read, so a
// caller about to build one (the controller's full build) starts it first
// with Prefetch: the kernel's dumps then run while the ruleset is built,
// and the sync compares with what was read for every set the kernel still
// declares as it did then (same handle, same declaration), reading the
// others itself.
//
// Between Prefetch and the full sync that takes its read, the Syncer
// writes nothing (it only prefetches before a full sync, and every sync
// runs in the caller's goroutine), so the read is as current as the sync's
// own would be, but for a hand edit in between, which the sync's own read
// could miss too: a changed element the transaction trips over makes the
// sync rewrite the table whole, and the periodic re-sync corrects the rest.

// kernelRead is the table's sets and their elements as a Prefetch read them.
type kernelRead struct {
	done  chan struct{}
	decls map[string]*nftnl.SetDecl
	sets  map[string]kernelElements
	err   error
}

// Prefetch starts reading the kernel's sets in the background when the
// next sync is a full one and the Syncer reads sets over netlink; it does
// nothing otherwise. The next full sync uses and releases the read of the
// last Prefetch (an earlier one, whose build failed, is dropped).
func (s *Syncer) Prefetch(ctx context.Context) {
	if s.applied != nil || s.cfg.Netlink == nil {
		return
	}
	r := &kernelRead{done: make(chan struct{})}
	s.pre = r
	go func() {
		defer close(r.done)
		r.read(ctx, s)
	}()
}

// read lists the table and dumps the elements of its sets but those whose
// elements expire (a learner's) and those the sync never compares. A table
// without base chains is filled without reading (fullfill.go): nothing is
// dumped then.
func (r *kernelRead) read(ctx context.Context, s *Syncer) {
	existing, decls, err := s.cfg.Netlink.ListTable(ctx)
	if err != nil || s.unhooked(existing) {
		r.err = err
		return
	}
	r.decls, r.sets = decls, make(map[string]kernelElements, len(decls))
	for name, d := range decls {
		if d.Expires() || !d.Comparable() {
			continue
		}
		k := s.readKernelSet(ctx, name)
		if k.err != nil {
			r.err = k.err
			return
		}
		r.sets[name] = k
	}
}

// takePrefetch returns the pending read and forgets it; nil when none was
// started.
func (s *Syncer) takePrefetch() *kernelRead {
	r := s.pre
	s.pre = nil
	return r
}

// elements returns what r read of the set named name if the kernel
// declares it now (decl) as it did then; it waits for the read to end.
func (r *kernelRead) elements(name string, decl *nftnl.SetDecl) (kernelElements, bool) {
	if r == nil || decl == nil {
		return kernelElements{}, false
	}
	<-r.done
	if r.err != nil {
		return kernelElements{}, false
	}
	then, ok := r.decls[name]
	if !ok || !then.SameObject(decl) {
		return kernelElements{}, false
	}
	k, ok := r.sets[name]
	return k, ok
}
