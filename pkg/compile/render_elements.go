package compile

import (
	"net/netip"
	"slices"
)

// Allocations of a full render's pod elements.
//
// A full render at 50k pods emits about 87k pod elements, most of the
// render's garbage when built one by one. What is here builds them with
// fewer and larger allocations:
//
//   - elements are typed (Element): a pod's address is in the element,
//     no text is made for it;
//   - a pod's comment is one string shared by all its elements (a full
//     render's are elements of one slice);
//   - a full render sizes the known-pods and peer sets (most of the
//     elements) for their elements before emitting them, and gathers the
//     other sets' elements in chunks copied once into a slice of the
//     exact size;
//   - sorting permutes the elements in place, with the permutation in
//     scratch space reused from set to set.
//
// It also skips, for remote pods, the named-port users that resolve on
// local subjects only: asking each of them about each pod was a sixth of
// the render's CPU at 50k pods.
//
// Sharing a comment is safe because nobody writes into an element once it
// is emitted: the tracker inserts, deletes and replaces whole elements,
// each set in its own element slice, and pkg/sets only reads
// (TestTrackerEditsKeepSharedElements).

// podText is what all of one pod's elements share: the pod's key,
// truncated to nftables' limit (nft refuses a longer comment, and with it
// the whole transaction).
type podText struct {
	comment *string
}

// podText makes a pod's comment.
func (r *renderer) podText(pod *Pod) podText {
	return podText{comment: truncComment(pod.Key)}
}

// podComments are every pod's comments, made for a full render as the
// elements of one slice. Elements keep them alive together, as they keep
// the ruleset.
func podComments(pods []Pod) []string {
	out := make([]string, len(pods))
	for i := range pods {
		out[i] = truncText(pods[i].Key)
	}
	return out
}

// appendAddrText appends an address as netip.Addr.String writes it.
func appendAddrText(b []byte, ip netip.Addr) []byte {
	if !ip.IsValid() {
		return append(b, ip.String()...)
	}
	return ip.AppendTo(b)
}

// fullRender is what a full render keeps while it emits every pod's
// elements.
type fullRender struct {
	// peerNamed lists the named-port users (indexes into renderer.named)
	// whose sets can hold a remote pod: those resolving on peers. The
	// others resolve on local subjects only, and a full render would
	// otherwise ask each of them about each remote pod.
	peerNamed []int
}

// namedElements emits a pod's elements of the named-port sets that cover
// it, in the order of renderer.named.
func (r *renderer) namedElements(pod *Pod, pt *podText, emit func(set string, e Element)) {
	if r.full != nil && !pod.Local {
		for _, i := range r.full.peerNamed {
			if r.named[i].covers(pod) {
				r.named[i].elements(r, pod, pt, emit)
			}
		}
		return
	}
	for i := range r.named {
		if r.named[i].covers(pod) {
			r.named[i].elements(r, pod, pt, emit)
		}
	}
}

// allPodElements adds every pod's elements to the sets and maps rendered
// so far, after the elements they have.
func (r *renderer) allPodElements() {
	r.presizePodSets()
	// Sets sized for their elements take them directly; the others (and
	// any set whose room runs out) gather them in chunks.
	pending := map[*Set]*elementChunks{}
	emit := func(set string, e Element) {
		s := r.rs.Sets[set]
		if len(s.Elements) < cap(s.Elements) {
			s.Elements = append(s.Elements, e)
			return
		}
		c := pending[s]
		if c == nil {
			c = &elementChunks{set: s}
			pending[s] = c
		}
		c.add(e)
	}
	r.full = &fullRender{}
	for i := range r.named {
		if r.named[i].subject == nil {
			r.full.peerNamed = append(r.full.peerNamed, i)
		}
	}
	comments := podComments(r.prog.Pods)
	for i := range r.prog.Pods {
		pt := podText{comment: &comments[i]}
		r.podElementsWith(&r.prog.Pods[i], &pt, emit)
	}
	r.full = nil
	for _, c := range pending {
		c.flush()
	}
}

// presizePodSets gives the sets that get most of the pod elements, the
// known-pods and peer sets, room for exactly the elements podElements
// emits into them: one per address of every pod (known-pods), of every
// member (a selector's peer set).
func (r *renderer) presizePodSets() {
	known := r.cfg.QueuesUnknownPods()
	var knownN [2]int
	perSel := make([][2]int, len(r.peerSets))
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		var n [2]int
		for _, ip := range pod.IPs {
			n[famIndex(ip.Is4())]++
		}
		if known {
			knownN[0] += n[0]
			knownN[1] += n[1]
		}
		for _, sid := range pod.MemberOf {
			if int(sid) < len(perSel) {
				perSel[sid][0] += n[0]
				perSel[sid][1] += n[1]
			}
		}
	}
	need := map[*Set]int{}
	add := func(name string, n int) {
		if s := r.rs.Sets[name]; s != nil && n > 0 {
			need[s] += n
		}
	}
	if known {
		add(knownPodsSet(true), knownN[0])
		add(knownPodsSet(false), knownN[1])
	}
	for sid, names := range r.peerSets {
		for f, name := range names {
			if name != "" {
				add(name, perSel[sid][f])
			}
		}
	}
	for s, n := range need {
		s.Elements = slices.Grow(s.Elements, n)
	}
}

// elementChunks gathers one set's elements without regrowing a slice: the
// chunks double up to maxElementChunk elements and are copied once, by
// flush, into the set's elements.
type elementChunks struct {
	set    *Set
	chunks [][]Element
	n      int
}

const (
	minElementChunk = 16
	maxElementChunk = 1024
)

func (c *elementChunks) add(e Element) {
	k := len(c.chunks)
	if k == 0 || len(c.chunks[k-1]) == cap(c.chunks[k-1]) {
		size := minElementChunk
		if k > 0 {
			size = min(2*cap(c.chunks[k-1]), maxElementChunk)
		}
		c.chunks = append(c.chunks, make([]Element, 0, size))
		k++
	}
	c.chunks[k-1] = append(c.chunks[k-1], e)
	c.n++
}

// flush appends the gathered elements to the set's, in the order added.
func (c *elementChunks) flush() {
	out := make([]Element, len(c.set.Elements), len(c.set.Elements)+c.n)
	copy(out, c.set.Elements)
	for _, ch := range c.chunks {
		out = append(out, ch...)
	}
	c.set.Elements = out
	c.chunks = nil
}

// sortElements orders elements by key, addresses numerically, and drops
// duplicates (two port names of one pod may resolve to the same number),
// keeping the first one emitted. It sorts es in place.
func sortElements(es []Element) []Element {
	var so elementSorter
	return so.sort(es)
}

// elementSorter sorts sets' elements; its scratch space (the permutation)
// serves set after set.
type elementSorter struct {
	perm []int32
}

// sort is sortElements with the sorter's scratch space.
func (so *elementSorter) sort(es []Element) []Element {
	n := len(es)
	if n < 2 {
		return es
	}
	so.perm = slices.Grow(so.perm[:0], n)[:n]
	perm := so.perm
	for i := range perm {
		perm[i] = int32(i)
	}
	slices.SortFunc(perm, func(a, b int32) int {
		if c := compareElements(&es[a], &es[b]); c != 0 {
			return c
		}
		// Equal keys keep the order they were emitted in (the first
		// is kept), as a stable sort keeps them.
		return int(a) - int(b)
	})
	permute(es, perm)
	out := es[:0]
	for i := range es {
		if len(out) > 0 && out[len(out)-1].SameKey(&es[i]) {
			continue
		}
		out = append(out, es[i])
	}
	return out
}

// permute reorders es in place so that es[k] becomes the old es[perm[k]],
// following the permutation's cycles; it consumes perm.
func permute(es []Element, perm []int32) {
	for i := range perm {
		if perm[i] < 0 || int(perm[i]) == i {
			continue
		}
		saved, j := es[i], i
		for {
			k := int(perm[j])
			perm[j] = -1
			if k == i {
				es[j] = saved
				break
			}
			es[j] = es[k]
			j = k
		}
	}
}
