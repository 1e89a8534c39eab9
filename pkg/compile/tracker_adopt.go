package compile

import (
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// The program after policy changes, built off the tracker. A policy change
// leaves the program behind the tracked ruleset (Stale); building it again
// is a full build, which the caller can run on another goroutine from the
// same objects (BuildBase: pure, it reads the tracker not at all) while
// the tracker goes on applying changes. When none was applied in between,
// the built program is the one a Rebuild would make, and Adopt makes it
// the tracker's published program without building or rendering anything.
//
// The tracker numbers selectors and policies its own way after policy
// changes (new selectors come last, deleted ones stay), a full build in
// its canonical order. The adopted program keeps the build's numbering,
// so the programs derived from it for later pod changes (tracker_program.go)
// place the changed pods with the build's matchers (the base's placer),
// not the tracker's: each derived program equals a full build of its
// objects, as after a Rebuild.

// ProgramBase is a program built from scratch, with what deriving programs
// from it needs: where a pod stands in its numbering, and its input's pods
// sorted by key. Immutable once built; safe to hand to another goroutine.
type ProgramBase struct {
	prog  *Program
	pl    placer
	infos []*PodInfo
}

// BuildBase builds the program of in from scratch, as Build does, for a
// tracker to Adopt. It reads no tracker and writes nothing in shared, so
// it may run on any goroutine.
func BuildBase(in Input) *ProgramBase {
	b := newBuilder(in)
	pods := (*Cache)(nil).infos(in)
	prog := b.buildFrom(in, pods)
	return &ProgramBase{prog: prog, pl: newPlacer(prog, b), infos: sortedInfos(pods)}
}

// Program is the base's program (the one Build makes of its input).
func (pb *ProgramBase) Program() *Program { return pb.prog }

// Adopt makes the base's program the tracker's published program (Program
// returns it, and derives the next ones from it for pod changes) and ends
// Stale. The caller guarantees that the base was built from the objects
// the tracker has applied, no more and no fewer: every change applied
// since the base's input was read makes it another state's program, which
// must not be adopted. The tracked ruleset is left as it is. Adopt does
// nothing before the first Rebuild.
func (t *Tracker) Adopt(pb *ProgramBase) {
	if t.r == nil || pb == nil {
		return
	}
	t.pub, t.srcInfos, t.pending, t.stale = pb.prog, pb.infos, nil, false
	t.adopted = pb
}

// Generation counts the changes of the tracked state: Resets and
// Rebuilds, applied pod changes, and policy changes that change the
// program (an edit that compiles to what it was does not). A program built
// from the objects the tracker had applied when it was n is the tracked
// state's program while it is still n: the condition of Adopt.
func (t *Tracker) Generation() uint64 { return t.gen }

// derivedView is a changed pod's place in the next derived program: the
// tracker's view, or, after an Adopt, the pod placed in the adopted
// build's numbering (nil when the program does not hold it, as for the
// tracker's views: no address of its own).
func (t *Tracker) derivedView(key string) *Pod {
	if t.adopted == nil {
		return t.view(key)
	}
	pi := t.pending[key]
	if pi == nil || !pi.takesPart() || len(pi.IPs) == 0 {
		return nil
	}
	return t.adopted.pl.place(pi)
}

// derivation is where derive places pods: the adopted build's placer, or
// the tracker's.
func (t *Tracker) derivation() placer {
	if t.adopted != nil {
		return t.adopted.pl
	}
	return t.placement()
}

// placer places a pod in a program: the selectors it belongs to and the
// policies that select it, with the matchers of the builder that numbered
// the program's selectors and policies.
type placer struct {
	p *Program
	b *builder
	// selByNS are the selectors without a namespace selector, by
	// namespace; nsSels those with one; polsByNS the NetworkPolicies, by
	// namespace.
	selByNS  map[string][]SelectorID
	nsSels   []SelectorID
	polsByNS map[string][]PolicyID
}

// newPlacer indexes the selectors and NetworkPolicies of p, which b built.
func newPlacer(p *Program, b *builder) placer {
	pl := placer{p: p, b: b, selByNS: map[string][]SelectorID{}, polsByNS: map[string][]PolicyID{}}
	for id, m := range b.selMatch {
		if m.nsSel == nil {
			pl.selByNS[m.ns] = append(pl.selByNS[m.ns], SelectorID(id))
		} else {
			pl.nsSels = append(pl.nsSels, SelectorID(id))
		}
	}
	for id := range p.Policies {
		ns := p.Policies[id].Namespace
		pl.polsByNS[ns] = append(pl.polsByNS[ns], PolicyID(id))
	}
	return pl
}

// place computes where a pod stands in the placer's program.
func (pl placer) place(pod *PodInfo) *Pod {
	p, b := pl.p, pl.b
	local := p.Node == "" || pod.Node == p.Node
	v := &Pod{PodInfo: pod, IPs: pod.IPs, Subject: subjectFor(local), Local: local}
	nsl, ok := b.nsLabels[pod.Namespace]
	if !ok {
		nsl = labels.Set{NamespaceNameLabel: pod.Namespace}
	}
	podLabels := labels.Set(pod.Labels)
	for _, sid := range pl.selByNS[pod.Namespace] {
		if b.selMatch[sid].podSel.Matches(podLabels) {
			v.MemberOf = append(v.MemberOf, sid)
		}
	}
	for _, sid := range pl.nsSels {
		m := &b.selMatch[sid]
		if m.nsSel.Matches(nsl) && m.podSel.Matches(podLabels) {
			v.MemberOf = append(v.MemberOf, sid)
		}
	}
	slices.Sort(v.MemberOf)
	if !v.Local {
		return v
	}
	v.StagedSubject = b.stagedDirs(pod.Namespace, pod.Labels)
	for _, id := range pl.polsByNS[pod.Namespace] {
		pol := &p.Policies[id]
		if !b.targets[id].Matches(podLabels) {
			continue
		}
		if pol.IsolatesIngress {
			v.IngressPolicies = append(v.IngressPolicies, id)
		}
		if pol.IsolatesEgress {
			v.EgressPolicies = append(v.EgressPolicies, id)
		}
	}
	for i := range p.ClusterPolicies {
		if b.subjects[i].matchesLabels(nsl, pod.Labels) {
			v.addClusterPolicy(&p.ClusterPolicies[i], ClusterPolicyID(i))
		}
	}
	p.orderClusterPolicies(v)
	return v
}
