package fqdn

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// learnedName is one name of a reply that resolved to addrs, as the store
// keeps it.
type learnedName struct {
	name   string
	addrs  []netip.Addr
	expiry time.Time
	ttl    time.Duration
}

// podStore is what one pod learned: for each name a rule of the pod
// matches, the addresses it resolved to and when each expires, indexed by
// address for Resolved, and the names in the order they were last learned
// for eviction. Its lock is the pod's alone. Expired addresses are dropped
// lazily: when their name is learned again, when their name reaches the
// front of the eviction order, or with their pod.
type podStore struct {
	mu sync.Mutex
	// gone is set once the pod left the program (or changed addresses):
	// nothing is learned into the store any more.
	gone   bool
	names  map[string]*nameEntry
	byAddr map[netip.Addr]map[*nameEntry]struct{}
	// links counts name-address pairs.
	links int
	// lru is the sentinel of the ring of names, least recently learned
	// first (lru.next).
	lru nameEntry
}

type nameEntry struct {
	name       string
	addrs      map[netip.Addr]time.Time
	prev, next *nameEntry
}

func newPodStore() *podStore {
	s := &podStore{names: map[string]*nameEntry{}, byAddr: map[netip.Addr]map[*nameEntry]struct{}{}}
	s.lru.prev, s.lru.next = &s.lru, &s.lru
	return s
}

// storePlan is what storing a reply's names will evict.
type storePlan struct {
	victims []*nameEntry
}

// plan picks, least recently learned first, the names to evict so that
// the store stays within maxNames names and maxLinks name-address pairs
// once learned is stored. Names of the reply itself are never picked. The
// caller holds s.mu. Each name is picked at most once in its life: the
// work is proportional to the reply, amortized.
func (s *podStore) plan(learned []learnedName, maxNames, maxLinks int) storePlan {
	var upd []string
	newNames, newLinks := 0, 0
	for _, lg := range learned {
		e := s.names[lg.name]
		if !slices.Contains(upd, lg.name) {
			upd = append(upd, lg.name)
			if e == nil {
				newNames++
			}
		}
		for _, a := range lg.addrs {
			if e == nil {
				newLinks++
			} else if _, ok := e.addrs[a]; !ok {
				newLinks++
			}
		}
	}
	names, links := len(s.names)+newNames, s.links+newLinks
	var p storePlan
	for e := s.lru.next; e != &s.lru && (names > maxNames || links > maxLinks); e = e.next {
		if slices.Contains(upd, e.name) {
			continue
		}
		p.victims = append(p.victims, e)
		names--
		links -= len(e.addrs)
	}
	return p
}

// apply evicts the plan's victims and stores learned, and returns the
// unexpired addresses of the victims that no stored name resolves to any
// more: their kernel elements are to be deleted. Up to two expired names
// at the front of the eviction order are dropped on the way. The caller
// holds s.mu.
func (s *podStore) apply(now time.Time, p storePlan, learned []learnedName) []netip.Addr {
	var freed []netip.Addr
	for _, v := range p.victims {
		for a, exp := range v.addrs {
			if now.Before(exp) {
				freed = append(freed, a)
			}
		}
		s.remove(v)
	}
	for _, lg := range learned {
		e := s.names[lg.name]
		if e == nil {
			e = &nameEntry{name: lg.name, addrs: make(map[netip.Addr]time.Time, len(lg.addrs))}
			s.names[lg.name] = e
		} else {
			e.prev.next, e.next.prev = e.next, e.prev
			for a, exp := range e.addrs {
				if !now.Before(exp) && !slices.Contains(lg.addrs, a) {
					s.unlink(e, a)
				}
			}
		}
		e.prev, e.next = s.lru.prev, &s.lru
		s.lru.prev.next = e
		s.lru.prev = e
		for _, a := range lg.addrs {
			if _, ok := e.addrs[a]; !ok {
				s.links++
				m := s.byAddr[a]
				if m == nil {
					m = map[*nameEntry]struct{}{}
					s.byAddr[a] = m
				}
				m[e] = struct{}{}
			}
			e.addrs[a] = lg.expiry
		}
	}
	for i := 0; i < 2 && s.lru.next != &s.lru && s.lru.next.expired(now); i++ {
		s.remove(s.lru.next)
	}
	out := freed[:0]
	for _, a := range freed {
		if len(s.byAddr[a]) == 0 && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func (e *nameEntry) expired(now time.Time) bool {
	for _, exp := range e.addrs {
		if now.Before(exp) {
			return false
		}
	}
	return true
}

// remove drops a name and its addresses.
func (s *podStore) remove(e *nameEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	for a := range e.addrs {
		s.unlink(e, a)
	}
	delete(s.names, e.name)
}

// unlink drops one address of a name.
func (s *podStore) unlink(e *nameEntry, a netip.Addr) {
	delete(e.addrs, a)
	s.links--
	if m := s.byAddr[a]; m != nil {
		delete(m, e)
		if len(m) == 0 {
			delete(s.byAddr, a)
		}
	}
}

// resolved reports whether a name matching domains resolved to peer and
// has not expired.
func (s *podStore) resolved(now time.Time, peer netip.Addr, domains []compile.DomainPattern) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := range s.byAddr[peer] {
		if now.Before(e.addrs[peer]) && compile.DomainsMatch(domains, e.name) {
			return true
		}
	}
	return false
}

// retire marks the store gone: replies are no longer learned into it.
func (s *podStore) retire() {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
}

// takeAll empties a retired store and returns every address it held.
func (s *podStore) takeAll() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = true
	out := make([]netip.Addr, 0, len(s.byAddr))
	for a := range s.byAddr {
		out = append(out, a)
	}
	s.names, s.byAddr, s.links = map[string]*nameEntry{}, map[netip.Addr]map[*nameEntry]struct{}{}, 0
	s.lru.prev, s.lru.next = &s.lru, &s.lru
	return out
}

// elementBatch bounds the elements of one kernel write made outside a
// reply (deletions, re-writes after a program change).
const elementBatch = 1024

// writeChunks writes or deletes els in batches; it returns the first error.
func (l *Learner) writeChunks(ctx context.Context, els []Element, del bool) error {
	var first error
	for len(els) > 0 {
		n := min(len(els), elementBatch)
		wctx, cancel := context.WithTimeout(ctx, l.cfg.WriteTimeout)
		var err error
		if del {
			err = l.cfg.Writer.DeleteElements(wctx, els[:n])
		} else {
			err = l.cfg.Writer.WriteElements(wctx, els[:n])
		}
		cancel()
		if err != nil && first == nil {
			first = err
		}
		els = els[n:]
	}
	return first
}

// deleteElements deletes the pod's elements of addrs from the rules' sets.
func (l *Learner) deleteElements(ctx context.Context, e *podEntry, rules []compile.FQDNRule, addrs []netip.Addr, why string) {
	var els []Element
	for _, a := range addrs {
		pa, ok := e.addr(a.Is4())
		if !ok {
			continue
		}
		for i := range rules {
			els = append(els, Element{Set: rules[i].Set(a.Is4()), Pod: pa, Addr: a})
		}
	}
	if len(els) == 0 {
		return
	}
	if err := l.writeChunks(ctx, els, true); err != nil {
		l.cfg.Metrics.deleteFailures.Inc()
		l.cfg.Logger.Error(err, "Cannot delete learned elements; they stay until their timeout", "pod", e.key, "why", why, "elements", len(els))
		return
	}
	l.cfg.Logger.V(2).Info("Deleted learned elements", "pod", e.key, "why", why, "elements", len(els))
}

// OnProgram is the controller's hook after each publication
// (controller.Config.OnProgram; cur's transaction has committed): it
// brings what pods learned in line with cur.
//
//   - A pod that is no longer a local subject of any domainNames rule, or
//     whose addresses changed, loses its store, and its elements are
//     deleted from the sets of cur that its rules used: a pod given the
//     same address later inherits nothing.
//   - A pod that now has rules whose sets it had not (a new rule, or a
//     rule whose set was replaced, as when its domainNames change) gets
//     the store's unexpired answers that those rules match written into
//     them, with their remaining TTL: narrowing a rule keeps the names
//     that remain, and widening admits only what the pod resolved.
//
// The first call (the agent's first publication) also sweeps the sets of
// cur when the Writer is a Lister: elements that a previous agent process
// wrote for pods that are no longer subjects of the set's rule are
// deleted. An element of a pod deleted while no agent ran whose address a
// new subject of the same rule already holds cannot be told from the new
// pod's own: it stays until its timeout (at most --fqdn-max-ttl).
func (l *Learner) OnProgram(_, cur *compile.Program) {
	if cur == nil {
		return
	}
	first := !l.hooked.Swap(true)
	x := l.indexFor(cur)
	if first {
		l.sweep(context.Background(), x)
	}
	l.idxMu.Lock()
	dropped, retired := l.dropped, l.retired
	l.dropped, l.retired = nil, nil
	l.idxMu.Unlock()
	if l.cfg.Writer == nil {
		for _, e := range dropped {
			e.store.takeAll()
		}
		return
	}
	ctx := context.Background()
	sets := map[string]bool{}
	for _, e := range x.byKey {
		for i := range e.rules {
			sets[e.rules[i].SetV4], sets[e.rules[i].SetV6] = true, true
		}
	}
	for _, e := range dropped {
		addrs := e.store.takeAll()
		var rules []compile.FQDNRule
		for _, r := range e.rules {
			if sets[r.SetV4] && sets[r.SetV6] {
				rules = append(rules, r)
			}
		}
		l.deleteElements(ctx, e, rules, addrs, "pod is no longer a subject at this address")
	}
	for _, old := range retired {
		cur := old.next
		for cur.next != nil {
			cur = cur.next
		}
		if x.byKey[cur.key] != cur {
			continue // dropped since
		}
		var added []compile.FQDNRule
		for _, r := range cur.rules {
			if !slices.ContainsFunc(old.rules, func(o compile.FQDNRule) bool { return o.SetV4 == r.SetV4 && o.SetV6 == r.SetV6 }) {
				added = append(added, r)
			}
		}
		if len(added) > 0 {
			l.rewrite(ctx, cur, added)
		}
	}
}

// OnPodApplied is the controller's hook when it applies one pod's change
// to the kernel incrementally (controller.Config.OnPodApplied, hybrid
// mode), before the program that has the change is published. A local
// subject that is gone (pod nil), no longer eligible, or whose addresses
// changed loses what it learned at once: its store is emptied and marked
// gone (no reply adds to it again) and its elements are deleted from its
// rules' sets. Without it they would stay until the next publication
// (OnProgram, up to the controller's program refresh delay or twice its
// last build later), while a new pod given the address may already be in
// the kernel and would use them. Until that publication, replies to the
// address are not learned (the index still maps it to the retired entry):
// the new pod's lookups of that window are released unlearned.
func (l *Learner) OnPodApplied(key string, pod *compile.PodInfo) {
	x := l.index()
	if x == nil {
		return
	}
	e := x.byKey[key]
	if e == nil || pod != nil && pod.Eligible && slices.Equal(pod.IPs, e.ips) {
		return
	}
	addrs := e.store.takeAll()
	if l.cfg.Writer == nil {
		return
	}
	l.deleteElements(context.Background(), e, e.rules, addrs, "pod deleted or its addresses changed")
}

// sweep deletes, from the sets of x's rules, the elements whose pod address
// is not a local subject of the rule.
func (l *Learner) sweep(ctx context.Context, x *podIndex) {
	ls, ok := l.cfg.Writer.(Lister)
	if !ok {
		return
	}
	subjects := map[string]map[netip.Addr]bool{}
	for _, e := range x.byKey {
		for _, r := range e.rules {
			for _, set := range []string{r.SetV4, r.SetV6} {
				if subjects[set] == nil {
					subjects[set] = map[netip.Addr]bool{}
				}
				for _, a := range e.ips {
					subjects[set][a] = true
				}
			}
		}
	}
	for set, pods := range subjects {
		lctx, cancel := context.WithTimeout(ctx, l.cfg.WriteTimeout)
		els, err := ls.ListElements(lctx, set)
		cancel()
		if err != nil {
			l.cfg.Logger.Error(err, "Cannot read a learned set; elements of pods that left while no agent ran stay until their timeout", "set", set)
			continue
		}
		var stale []Element
		for _, e := range els {
			if !pods[e.Pod] {
				stale = append(stale, e)
			}
		}
		if len(stale) == 0 {
			continue
		}
		if err := l.writeChunks(ctx, stale, true); err != nil {
			l.cfg.Metrics.deleteFailures.Inc()
			l.cfg.Logger.Error(err, "Cannot delete learned elements of pods that are no longer subjects; they stay until their timeout", "set", set, "elements", len(stale))
			continue
		}
		l.cfg.Logger.Info("Deleted learned elements a previous agent wrote for pods that are no longer subjects", "set", set, "elements", len(stale))
	}
}

// rewrite writes the pod's unexpired answers that the rules match into
// their sets.
func (l *Learner) rewrite(ctx context.Context, e *podEntry, rules []compile.FQDNRule) {
	s := e.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return
	}
	now := l.cfg.Now()
	var els []Element
	for name, ne := range s.names {
		for i := range rules {
			if !compile.DomainsMatch(rules[i].Domains, name) {
				continue
			}
			for a, exp := range ne.addrs {
				pa, ok := e.addr(a.Is4())
				if !ok || !now.Before(exp) {
					continue
				}
				els = append(els, Element{Set: rules[i].Set(a.Is4()), Pod: pa, Addr: a, Timeout: max(exp.Sub(now), time.Millisecond)})
			}
		}
	}
	if len(els) == 0 {
		return
	}
	if err := l.writeChunks(ctx, els, false); err != nil {
		l.cfg.Logger.Error(err, "Cannot re-write learned answers into the program's new sets; the pod resolves again to reach them", "pod", e.key, "elements", len(els))
		return
	}
	l.cfg.Logger.V(2).Info("Re-wrote learned answers into new sets", "pod", e.key, "elements", len(els))
}
