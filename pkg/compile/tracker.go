package compile

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Tracker keeps one node's desired ruleset current as pods come, go and
// change, in time proportional to the change: a pod change recomputes only
// the selections the pod can be in (the selectors of its namespace and the
// namespace selectors, the policies of its namespace, the
// ClusterNetworkPolicy subjects) and yields the element additions and
// deletions of the sets and maps it touches. A NetworkPolicy change
// recompiles that policy alone (ApplyPolicy, tracker_policy.go), and so
// does a ClusterNetworkPolicy change (ApplyClusterPolicy,
// tracker_cluster.go). A Namespace's labels place its pods again
// (ApplyNamespace, tracker_namespace.go). Everything else (nodes, node
// addresses, configuration) goes through Rebuild, the full Build and
// Render, which stays the reference: for the same objects, the tracked
// ruleset equals the rebuilt one.
//
// A pod change is tracked in place unless it changes the ruleset's shape:
// the first local pod of a combination of policies (a chain to create) or
// the last one (a chain to delete). ApplyPod then replaces the Ruleset
// with one that shares the previous one's sets and chains (reshape), and
// returns the element changes of the shared sets. For an address that
// another pod also claims (ownership is decided over all pods), and for a
// ClusterNetworkPolicy combination that ApplyClusterPolicy would not track
// either (domainNames rules), it returns why (a Fallback) and
// the caller rebuilds.
//
// Program follows pod changes: after ApplyPod it returns a new program,
// equal to Build of the same objects, derived from the one it returned
// before (tracker_program.go), which is never written. It does not follow
// ApplyPolicy, ApplyClusterPolicy and ApplyNamespace: after one, Program returns the last
// published program, which lags the tracked ruleset until the next Rebuild
// or until it adopts a program built off the tracker from the same objects
// (Stale tells; Adopt, tracker_adopt.go). ApplyPod updates
// the Ruleset's sets in place (and replaces the Ruleset when it changes
// its shape); ApplyPolicy, ApplyClusterPolicy and ApplyNamespace replace it with a new one
// that shares what did not change, and do not write the sets they share. It is owned
// by the tracker and whoever applies it (a Syncer), both driven from one
// goroutine. Not safe for concurrent use.
type Tracker struct {
	cfg   RenderConfig
	cache *Cache

	// prog is the last Rebuild's program, which the indexes below
	// (pods by namespace) number pods by.
	prog *Program
	// pub is the program Program returned last: prog, then the programs
	// derived from it for pod changes; pending holds the pods changed
	// since, by key, with their new state (nil: deleted), and srcInfos
	// the pods of pub's input (tracker_program.go).
	pub      *Program
	pending  map[string]*PodInfo
	srcInfos []*PodInfo
	// cur is the program the tracked ruleset is rendered from: prog until
	// a policy change is applied, then the tracker's own copy of it
	// (tracker_policy.go), which the published prog never sees.
	cur *Program
	b   *builder
	r   *renderer
	// pods holds, by key, each tracked pod's view and claimed addresses
	// (one map for both: a map entry per pod of the cluster is much of
	// the tracker's memory).
	pods map[string]trackedPod
	// moved lists, by namespace, the keys of the pods added, changed or
	// deleted since the last build: with the build's pods of a namespace,
	// every pod a namespace can hold (podsIn).
	moved map[string]map[string]bool
	// claims counts, per address, the eligible pods that list it.
	claims map[netip.Addr]int
	// comboUse counts the local pods using each combination chain, fqdnUse
	// the local subjects of domainNames rules (the DNS capture exists while
	// there is one).
	comboUse map[string]int
	fqdnUse  int
	// stagedUse counts the local subjects of staged policies (the staged
	// log exists while there is one).
	stagedUse int
	// Where a pod can be placed: selectors by namespace (no namespace
	// selector), selectors with a namespace selector, NetworkPolicies by
	// namespace.
	selByNS   map[string][]SelectorID
	nsSels    []SelectorID
	polsByNS  map[string][]PolicyID
	comboSels map[SelectorID][]int // selector -> indices in r.combos
	// selAddrs holds the member addresses of the selectors a tier-skip set
	// names, by pod key.
	selAddrs map[SelectorID]map[string][]netip.Addr
	// nodeAddrs holds every node address the program knows.
	nodeAddrs map[netip.Addr]bool
	// stale is set by a policy or namespace change: Program lags until a
	// Rebuild or an Adopt.
	stale bool
	// adopted, when set, is the program built off the tracker that pub
	// was derived from (Adopt): the pods changed since are placed in its
	// numbering, not the tracked program's.
	adopted *ProgramBase
	// gen is the Generation.
	gen uint64
	// nsOwned is set once the builder's namespace labels are the
	// tracker's own copy (ApplyNamespace); cow, during a namespace change,
	// names the sets already copied from the ruleset a Syncer holds.
	nsOwned bool
	cow     map[string]bool
	pol     policyState
	cpol    clusterState
	costs   trackedCosts
	shares  trackedShares
}

// trackedPod is what the tracker holds about a pod.
type trackedPod struct {
	// view is the pod as tracked now (Program.Pods as of the last build,
	// then updated): only what the render reads is filled in. Nil for a
	// pod the program does not hold (no address of its own).
	view *Pod
	// claimed lists the pod's addresses, owned or not (nil unless it takes
	// part in policies).
	claimed []netip.Addr
}

// view returns the tracked view of the pod (nil: none).
func (t *Tracker) view(key string) *Pod { return t.pods[key].view }

// setView records the pod's view (nil: none).
func (t *Tracker) setView(key string, v *Pod) {
	e := t.pods[key]
	e.view = v
	t.storePod(key, e)
}

// storePod records what the tracker holds about a pod, nothing when it
// holds nothing.
func (t *Tracker) storePod(key string, e trackedPod) {
	if e.view == nil && e.claimed == nil {
		delete(t.pods, key)
		return
	}
	t.pods[key] = e
}

// NewTracker returns a tracker for the render configuration; call Rebuild
// before ApplyPod.
func NewTracker(cfg RenderConfig) (*Tracker, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Tracker{cfg: cfg, cache: NewCache()}, nil
}

// Program is the program the tracked ruleset enforces: the last Rebuild's,
// or the one derived from it for the pod changes applied since; after a
// policy change (Stale), the last one it returned.
func (t *Tracker) Program() *Program {
	if len(t.pending) > 0 && !t.stale && t.pub != nil {
		t.pub = t.derive()
		t.srcInfos = t.pub.Source.PodInfos
		t.pending = nil
	}
	return t.pub
}

// Pending is how many pods changed since the program Program returned
// last: Program derives the next one from them (0: it returns that one).
func (t *Tracker) Pending() int { return len(t.pending) }

// Ruleset is the tracked ruleset (nil before the first Rebuild).
func (t *Tracker) Ruleset() *Ruleset {
	if t.r == nil {
		return nil
	}
	return t.r.rs
}

// Stale reports whether policy changes were applied since the last
// Rebuild: the ruleset is current, Program is not.
func (t *Tracker) Stale() bool { return t.stale }

// Reset drops what the tracker holds of the last build (its indexes of
// every pod: tens of megabytes at a hundred thousand pods), which a
// Rebuild does not read: released before a rebuild, and collected, they
// do not add to its peak. The programs and the applied ruleset live on
// with their other owners. Until the next Rebuild the tracker has no
// ruleset (Ruleset is nil), so its caller rebuilds.
func (t *Tracker) Reset() {
	cfg, cache, gen := t.cfg, t.cache, t.gen
	*t = Tracker{cfg: cfg, cache: cache, gen: gen + 1}
}

// Rebuild builds and renders from scratch and starts tracking from there;
// it starts with Reset, and a failed Rebuild leaves no ruleset.
func (t *Tracker) Rebuild(in Input) (*Program, *Ruleset, error) {
	t.Reset()
	b := newBuilder(in)
	pods := t.cache.infos(in)
	prog := b.buildFrom(in, pods)
	r, err := newRenderer(prog, t.cfg)
	if err != nil {
		return nil, nil, err
	}
	r.render()
	t.prog, t.cur, t.b, t.r, t.stale = prog, prog, b, r, false
	t.pub, t.srcInfos, t.pending = prog, sortedInfos(pods), nil
	t.pol = policyState{}
	t.cpol = clusterState{}
	t.index(pods)
	t.indexCosts()
	// The copy of the program that NetworkPolicy changes edit, made now,
	// in the rebuild, rather than by the next policy change: at ten
	// thousand policies it is milliseconds, the most of such a change.
	t.ownProgram()
	return prog, r.rs, nil
}

func (t *Tracker) index(pods []*PodInfo) {
	p := t.prog
	t.pods = make(map[string]trackedPod, len(p.Pods))
	t.moved = nil
	t.claims = make(map[netip.Addr]int, len(p.Pods))
	t.comboUse = map[string]int{}
	for _, pi := range pods {
		if pi.takesPart() {
			if _, dup := t.pods[pi.Key]; dup {
				continue
			}
			t.pods[pi.Key] = trackedPod{claimed: pi.IPs}
			for _, ip := range pi.IPs {
				t.claims[ip]++
			}
		}
	}
	t.fqdnUse = 0
	for i := range p.Pods {
		pod := &p.Pods[i]
		e := t.pods[pod.Key]
		e.view = pod
		t.pods[pod.Key] = e
		for _, c := range t.combos(pod) {
			t.comboUse[c.name]++
		}
		if t.r.fqdnSubject(pod) {
			t.fqdnUse++
		}
	}
	t.indexStaged()
	t.nodeAddrs = map[netip.Addr]bool{}
	for _, ip := range p.NodeIPs {
		t.nodeAddrs[ip] = true
	}
	for _, ips := range p.NodeAddrs {
		for _, ip := range ips {
			t.nodeAddrs[ip] = true
		}
	}
	pl := newPlacer(p, t.b)
	t.selByNS, t.nsSels, t.polsByNS = pl.selByNS, pl.nsSels, pl.polsByNS
	t.comboSels = map[SelectorID][]int{}
	t.selAddrs = map[SelectorID]map[string][]netip.Addr{}
	for ci, c := range t.r.combos {
		for _, id := range c.ids {
			rules := p.ClusterPolicies[id].Rules(c.d)
			for i := range rules {
				for _, sid := range rules[i].Selectors {
					if !slices.Contains(t.comboSels[sid], ci) {
						t.comboSels[sid] = append(t.comboSels[sid], ci)
					}
					if t.selAddrs[sid] == nil {
						m := map[string][]netip.Addr{}
						for _, pid := range p.Selectors[sid].Members {
							m[p.Pods[pid].Key] = p.Pods[pid].IPs
						}
						t.selAddrs[sid] = m
					}
				}
			}
		}
	}
}

// fqdnSubjectOf reports whether a pod is a subject of a ClusterNetworkPolicy
// with domainNames egress rules, whether or not the ruleset captures DNS
// (a first such pod changes its shape).
func (t *Tracker) fqdnSubjectOf(pod *Pod) bool {
	if !pod.Local || !t.cfg.LearnsDNS() {
		return false
	}
	for _, ids := range [][]ClusterPolicyID{pod.AdminEgress, pod.BaselineEgress} {
		for _, id := range ids {
			cp := &t.cur.ClusterPolicies[id]
			for i := range cp.Egress {
				if !cp.Egress[i].Disabled && len(cp.Egress[i].Domains) > 0 {
					return true
				}
			}
		}
	}
	return false
}

// namedCombo is a combination chain and its name.
type namedCombo struct {
	combo
	name string
}

// combos lists the combination chains a local pod is dispatched to (none
// for nil).
func (t *Tracker) combos(pod *Pod) []namedCombo {
	if pod == nil || !pod.Local || t.cfg.Mode == ModeQueue {
		return nil
	}
	var out []namedCombo
	podCombos(pod, func(c combo) { out = append(out, namedCombo{c, c.name(t.cur)}) })
	return out
}

// hasCombo reports whether a list of combination chains has one by name.
func hasCombo(cs []namedCombo, name string) bool {
	for _, c := range cs {
		if c.name == name {
			return true
		}
	}
	return false
}

// SetDelta is the element changes of one set or map.
type SetDelta struct {
	Set         string
	Add, Delete []Element
}

// Delta is the element changes of one or more pod changes, by set.
type Delta []SetDelta

// Elements counts the element additions and deletions.
func (d Delta) Elements() (added, deleted int) {
	for i := range d {
		added += len(d[i].Add)
		deleted += len(d[i].Delete)
	}
	return added, deleted
}

// ApplyPod tracks a change of the pod with key "namespace/name": its new
// state, or nil when it was deleted. It updates the ruleset's sets in
// place and returns the element changes; when the pod creates or deletes
// an isolation chain, Ruleset then returns a new ruleset sharing those
// sets (the caller writes both, with Syncer.ApplyDelta). A Fallback other
// than NoFallback tells why the change needs a Rebuild (nothing was
// changed then).
func (t *Tracker) ApplyPod(key string, pod *corev1.Pod) (Delta, Fallback) {
	var pi *PodInfo
	if pod != nil {
		if pi = t.cache.pods[pod]; pi == nil {
			pi = NewPodInfo(pod)
		}
	}
	return t.ApplyPodInfo(key, pi)
}

// ApplyPodInfo is ApplyPod for a pod already read.
func (t *Tracker) ApplyPodInfo(key string, pod *PodInfo) (Delta, Fallback) {
	if t.r == nil {
		return nil, FallbackNotBuilt
	}
	old := t.view(key)
	var ips []netip.Addr
	if pod != nil && pod.takesPart() {
		ips = pod.IPs
	}
	if f := t.contested(key, ips); f != NoFallback {
		return nil, f
	}
	var cur *Pod
	if len(ips) > 0 {
		cur = t.place(pod)
	}
	oldCombos, newCombos := t.combos(old), t.combos(cur)
	reshaped, f := t.reshapes(old, cur, oldCombos, newCombos)
	if f != NoFallback {
		return nil, f
	}
	fqdnDelta, f := t.fqdnChange(old, cur)
	if f != NoFallback {
		return nil, f
	}
	stagedDelta, f := t.stagedChange(old, cur)
	if f != NoFallback {
		return nil, f
	}
	if f := t.checkCharges(key, old, cur); f != NoFallback {
		return nil, f
	}

	changes := setChanges{}
	before := t.elementsOf(old)
	after := t.elementsOf(cur)
	for id, e := range before {
		if _, ok := after[id]; !ok {
			d := changes.at(e.set)
			d.Delete = append(d.Delete, e.e)
		}
	}
	for id, e := range after {
		if _, ok := before[id]; !ok {
			d := changes.at(e.set)
			d.Add = append(d.Add, e.e)
		}
	}
	t.notePod(key, ips, old, cur, oldCombos, newCombos, fqdnDelta)
	t.notePending(key, pod)
	t.notePodCharges()
	t.stagedUse += stagedDelta
	// Then the tier-skip sets that list the pod's selectors.
	t.updateCombos(key, old, cur, changes)

	var delta Delta
	if reshaped {
		delta = t.reshape(old, cur, oldCombos, newCombos, changes)
		return delta, NoFallback
	}
	for _, n := range slices.Sorted(maps.Keys(changes)) {
		d := changes[n]
		if len(d.Add) == 0 && len(d.Delete) == 0 {
			continue
		}
		t.applySet(t.r.rs, n, d)
		delta = append(delta, *d)
	}
	return delta, NoFallback
}

// setChanges collects element changes by set.
type setChanges map[string]*SetDelta

// at returns the changes of a set, created empty.
func (c setChanges) at(set string) *SetDelta {
	d := c[set]
	if d == nil {
		d = &SetDelta{Set: set}
		c[set] = d
	}
	return d
}

// contested tells whether a pod's addresses, before (as tracked) and after
// (ips), are contested: address ownership is decided over all pods, and a
// node address in the pod ranges is known as the node's only while no pod
// holds it.
func (t *Tracker) contested(key string, ips []netip.Addr) Fallback {
	claimed := t.pods[key].claimed
	for _, ip := range claimed {
		if t.nodeAddrs[ip] {
			return FallbackNodeAddress
		}
		if t.claims[ip] > 1 {
			return FallbackAddressShared
		}
	}
	for _, ip := range ips {
		if t.nodeAddrs[ip] {
			return FallbackNodeAddress
		}
		if t.claims[ip] > 0 && !slices.Contains(claimed, ip) {
			return FallbackAddressShared
		}
	}
	return NoFallback
}

// reshapes reports whether a pod change changes the ruleset's shape: a
// combination chain the pod enters that no local pod uses yet must be
// created, one it leaves as its last local pod deleted, with the policy
// chains it jumps to (reshape). A ClusterNetworkPolicy combination is left
// to the full build for policies with domainNames rules, as
// ApplyClusterPolicy leaves them.
func (t *Tracker) reshapes(old, cur *Pod, oldCombos, newCombos []namedCombo) (bool, Fallback) {
	reshaped := false
	for _, c := range newCombos {
		if !hasCombo(oldCombos, c.name) && t.comboUse[c.name] == 0 {
			if f := t.clusterComboTrackable(c.combo, cur); f != NoFallback {
				return false, f
			}
			reshaped = true
		}
	}
	for _, c := range oldCombos {
		if !hasCombo(newCombos, c.name) && t.comboUse[c.name] <= 1 {
			if f := t.clusterComboTrackable(c.combo, old); f != NoFallback {
				return false, f
			}
			reshaped = true
		}
	}
	return reshaped, NoFallback
}

// fqdnChange returns how a pod change moves the number of DNS capture
// subjects. The DNS capture exists while a local pod is a domainNames
// subject, and lists the subjects of the policies the last build saw with
// one.
func (t *Tracker) fqdnChange(old, cur *Pod) (int, Fallback) {
	fqdnDelta := 0
	if old != nil && t.r.fqdnSubject(old) {
		fqdnDelta--
	}
	if cur != nil {
		if t.fqdnSubjectOf(cur) != t.r.fqdnSubject(cur) {
			return 0, FallbackDNSCapture
		}
		if t.r.fqdnSubject(cur) {
			fqdnDelta++
		}
	}
	if t.fqdnUse > 0 && t.fqdnUse+fqdnDelta == 0 {
		return 0, FallbackDNSCapture
	}
	return fqdnDelta, NoFallback
}

// notePod records a pod change: the combinations' and DNS capture's uses,
// the address claims, the pod's view.
func (t *Tracker) notePod(key string, ips []netip.Addr, old, cur *Pod, oldCombos, newCombos []namedCombo, fqdnDelta int) {
	t.fqdnUse += fqdnDelta
	for _, c := range oldCombos {
		t.comboUse[c.name]--
	}
	for _, c := range newCombos {
		t.comboUse[c.name]++
	}
	for _, ip := range t.pods[key].claimed {
		if t.claims[ip]--; t.claims[ip] == 0 {
			delete(t.claims, ip)
		}
	}
	e := trackedPod{view: cur}
	if len(ips) > 0 {
		e.claimed = ips
		for _, ip := range ips {
			t.claims[ip]++
		}
	}
	t.storePod(key, e)
	t.notePodMoved(key)
}

// place computes where a pod stands in the tracked program: the
// selectors it belongs to and the policies that select it.
func (t *Tracker) place(pod *PodInfo) *Pod { return t.placement().place(pod) }

// placement is where the tracker places pods: the tracked program's
// numbering, with the last build's matchers and the policy changes since.
func (t *Tracker) placement() placer {
	return placer{p: t.cur, b: t.b, selByNS: t.selByNS, nsSels: t.nsSels, polsByNS: t.polsByNS}
}

type setElement struct {
	set string
	e   Element
}

// elementsOf lists what a pod contributes to the ruleset, by set and
// element identity.
func (t *Tracker) elementsOf(pod *Pod) map[string]setElement {
	out := map[string]setElement{}
	if pod == nil {
		return out
	}
	t.r.podElements(pod, func(set string, e Element) {
		out[set+" "+ElementID(&e)] = setElement{set, e}
	})
	return out
}

// updateCombos refreshes the tier-skip sets naming a selector whose members
// or their addresses changed with this pod.
func (t *Tracker) updateCombos(key string, old, cur *Pod, changes setChanges) {
	var touched []int
	check := func(p *Pod) {
		if p == nil {
			return
		}
		for _, sid := range p.MemberOf {
			m, ok := t.selAddrs[sid]
			if !ok {
				continue
			}
			in := cur != nil && cur.InSelector(sid)
			was, had := m[key]
			if in && had && slices.Equal(was, cur.IPs) {
				continue
			}
			if in {
				m[key] = cur.IPs
			} else {
				delete(m, key)
			}
			for _, ci := range t.comboSels[sid] {
				if !slices.Contains(touched, ci) {
					touched = append(touched, ci)
				}
			}
		}
	}
	check(old)
	check(cur)
	for _, ci := range touched {
		c := t.r.combos[ci]
		if t.comboAddrChanges(c, old, cur, changes) {
			continue
		}
		ranges, _ := comboRanges(t.cur, c.d, c.ids, t.selectorAddrs)
		for _, v4 := range []bool{true, false} {
			name := c.sets[famIndex(v4)]
			want := comboElements(ranges, v4)
			have := t.r.rs.Sets[name].Elements
			d := changes.at(name)
			// A combo's ranges come from ClusterNetworkPolicy networks
			// lists, as long as their authors make them: compared by key
			// through a map, not pairwise.
			haveKeys, wantKeys := elementKeys(have), elementKeys(want)
			for i := range have {
				if !wantKeys[elementKey(&have[i])] {
					d.Delete = append(d.Delete, have[i])
				}
			}
			for i := range want {
				if !haveKeys[elementKey(&want[i])] {
					d.Add = append(d.Add, want[i])
				}
			}
		}
	}
}

// comboAddrChanges changes a tier-skip set for one pod's change without
// listing the combination's other addresses: only the pod's addresses can
// enter or leave the set (an address another pod also claims is a
// fallback before this), so each whose coverage changed merges with the
// elements next to it or splits the element holding it, which is what
// normalizing all the ranges again gives. It reports false, having
// changed nothing, where that does not apply: a combination matching
// every peer, or more than one address of a family changing at once.
func (t *Tracker) comboAddrChanges(c comboSet, old, cur *Pod, changes setChanges) bool {
	sels, static, ok := comboSources(t.cur, c.d, c.ids)
	if !ok {
		return false
	}
	covered := func(a netip.Addr) bool {
		for _, rg := range static {
			if rg.From.Is4() == a.Is4() && rg.From.Compare(a) <= 0 && a.Compare(rg.To) <= 0 {
				return true
			}
		}
		if cur == nil || !slices.Contains(cur.IPs, a) {
			return false
		}
		return slices.ContainsFunc(sels, cur.InSelector)
	}
	type change struct {
		addr netip.Addr
		in   bool
	}
	var moves [2][]change
	seen := map[netip.Addr]bool{}
	for _, p := range []*Pod{old, cur} {
		if p == nil {
			continue
		}
		for _, a := range p.IPs {
			if seen[a] {
				continue
			}
			seen[a] = true
			fam := famIndex(a.Is4())
			in := covered(a)
			if elementHolding(t.r.rs.Sets[c.sets[fam]].Elements, a) >= 0 != in {
				moves[fam] = append(moves[fam], change{a, in})
			}
		}
	}
	if len(moves[0]) > 1 || len(moves[1]) > 1 {
		return false
	}
	for fam, m := range moves {
		if len(m) == 0 {
			continue
		}
		name := c.sets[fam]
		del, add := rangeSetDelta(t.r.rs.Sets[name].Elements, m[0].addr, m[0].in)
		d := changes.at(name)
		d.Delete = append(d.Delete, del...)
		d.Add = append(d.Add, add...)
	}
	return true
}

// elementHolding is the index of the range element holding a, or -1.
func elementHolding(es []Element, a netip.Addr) int {
	for i := range es {
		if es[i].Addr.Is4() == a.Is4() && es[i].Addr.Compare(a) <= 0 && a.Compare(es[i].LastAddr()) <= 0 {
			return i
		}
	}
	return -1
}

// rangeSetDelta changes a set of normalized ranges (no two overlapping or
// adjacent) for one address entering it (in) or leaving it: entering, it
// merges with the ranges ending just before and starting just after it;
// leaving, the range holding it splits around it.
func rangeSetDelta(es []Element, a netip.Addr, in bool) (del, add []Element) {
	if !in {
		i := elementHolding(es, a)
		if i < 0 {
			return nil, nil
		}
		e := es[i]
		del = append(del, e)
		if e.Addr.Compare(a) < 0 {
			add = append(add, RangeElement(IPRange{From: e.Addr, To: a.Prev()}))
		}
		if a.Compare(e.LastAddr()) < 0 {
			add = append(add, RangeElement(IPRange{From: a.Next(), To: e.LastAddr()}))
		}
		return del, add
	}
	from, to := a, a
	prev, next := a.Prev(), a.Next()
	for i := range es {
		e := &es[i]
		if e.Addr.Is4() != a.Is4() {
			continue
		}
		if prev.IsValid() && e.LastAddr() == prev {
			from = e.Addr
			del = append(del, *e)
		} else if next.IsValid() && e.Addr == next {
			to = e.LastAddr()
			del = append(del, *e)
		}
	}
	return del, append(add, RangeElement(IPRange{From: from, To: to}))
}

func (t *Tracker) selectorAddrs(sid SelectorID, f func(netip.Addr)) {
	for _, ips := range t.selAddrs[sid] {
		for _, a := range ips {
			f(a)
		}
	}
}

// apply removes and inserts elements, keeping the set sorted as Render
// sorts it.
func (s *Set) apply(d *SetDelta) {
	for j := range d.Delete {
		if i, found := slices.BinarySearchFunc(s.Elements, &d.Delete[j], searchElement); found {
			s.Elements = slices.Delete(s.Elements, i, i+1)
		}
	}
	for _, e := range d.Add {
		i, found := slices.BinarySearchFunc(s.Elements, &e, searchElement)
		if found {
			s.Elements[i] = e
			continue
		}
		s.Elements = slices.Insert(s.Elements, i, e)
	}
}

// searchElement orders a set's elements against a sought one as
// sortElements orders them.
func searchElement(a Element, b *Element) int { return compareElements(&a, b) }

// elementKeys is the set of the elements' keys (elementKey).
func elementKeys(es []Element) map[string]bool {
	ks := make(map[string]bool, len(es))
	for i := range es {
		ks[elementKey(&es[i])] = true
	}
	return ks
}

// elementKey is an element's key as one string.
func elementKey(e *Element) string { return string(e.AppendKey(nil)) }
