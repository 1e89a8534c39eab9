package compile

import (
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Allocations of a full render's pod elements.
//
// A full render at 50k pods emits about 87k pod elements. Built one by one
// they were most of the render's garbage: a key slice, an address string
// and a comment per element, and each set's element slice grown by append
// (Go grows large slices by a quarter at a time, so a 50k-element set
// allocated several times its final size). The garbage is fresh heap pages
// during an agent's first sync. What is here builds the same elements,
// byte for byte, with fewer and larger allocations:
//
//   - a pod's address strings are made once per render of the pod and
//     every single-address key is a one-element window onto them; a full
//     render makes all pods' addresses as substrings of one string;
//   - a pod's comment is one string shared by all its elements (a full
//     render's are elements of one slice);
//   - the other keys come from a chunked arena during a full render;
//   - a full render sizes the known-pods and peer sets (most of the
//     elements) for their elements before emitting them, and gathers the
//     other sets' elements in chunks copied once into a slice of the
//     exact size;
//   - sorting permutes the elements in place, with the parsed sort keys in
//     scratch space reused from set to set.
//
// It also skips, for remote pods, the named-port users that resolve on
// local subjects only: asking each of them about each pod was a sixth of
// the render's CPU at 50k pods.
//
// Sharing is safe because nobody writes into an element's Key, Value or
// Comment once it is emitted: the tracker inserts, deletes and replaces
// whole elements, each set in its own element slice, and pkg/sets only
// reads (TestTrackerEditsKeepSharedElements). Every shared slice is capped at its length, so
// an append makes a copy instead of writing into a neighbour.

// podText is what all of one pod's elements share.
type podText struct {
	// addrs are the pod's addresses as text, index for index with Pod.IPs.
	addrs []string
	// comment is the pod's key, truncated to nftables' limit (nft
	// refuses a longer comment, and with it the whole transaction).
	comment *string
}

// podText renders a pod's address strings and comments.
func (r *renderer) podText(pod *Pod) podText {
	pt := podText{addrs: make([]string, len(pod.IPs)), comment: truncComment(pod.Key)}
	for i, ip := range pod.IPs {
		pt.addrs[i] = ip.String()
	}
	return pt
}

// podTexts are every pod's texts, made for a full render with a handful
// of allocations: all addresses are substrings of one string, the pods'
// address lists windows onto one slice, their comments elements of
// another. Elements keep them alive together, as they keep the ruleset.
type podTexts struct {
	addrs    []string
	comments []string
}

func newPodTexts(pods []Pod) podTexts {
	n, size := 0, 0
	for i := range pods {
		for _, ip := range pods[i].IPs {
			n++
			w := len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
			if ip.Is4() {
				w = len("255.255.255.255")
			}
			size += w + len(ip.Zone()) + 1
		}
	}
	var all strings.Builder
	all.Grow(size)
	ends := make([]int, n)
	var buf [64]byte
	k := 0
	for i := range pods {
		for _, ip := range pods[i].IPs {
			all.Write(appendAddrText(buf[:0], ip))
			ends[k] = all.Len()
			k++
		}
	}
	text := all.String()
	pt := podTexts{addrs: make([]string, n), comments: make([]string, len(pods))}
	start := 0
	for k, end := range ends {
		pt.addrs[k] = text[start:end]
		start = end
	}
	for i := range pods {
		pt.comments[i] = truncText(pods[i].Key)
	}
	return pt
}

// appendAddrText appends an address as netip.Addr.String writes it.
func appendAddrText(b []byte, ip netip.Addr) []byte {
	if !ip.IsValid() {
		return append(b, ip.String()...)
	}
	return ip.AppendTo(b)
}

// addrKey is the key of a one-address element: address i alone, capped so
// that an append copies.
func (pt *podText) addrKey(i int) []string { return pt.addrs[i : i+1 : i+1] }

// fullRender is what a full render keeps while it emits every pod's
// elements.
type fullRender struct {
	// arena serves the strings of keys (strs).
	arena []string
	// peerNamed lists the named-port users (indexes into renderer.named)
	// whose sets can hold a remote pod: those resolving on peers. The
	// others resolve on local subjects only, and a full render would
	// otherwise ask each of them about each remote pod.
	peerNamed []int
}

// strsChunk is how many strings the arena allocates at a time (16 KiB).
const strsChunk = 1024

// strs returns n empty strings for a key. During a full render they come
// from an arena: one allocation per strsChunk strings instead of one per
// key. Outside one (the tracker's edits) each key is its own allocation,
// so that an element the tracker keeps does not hold a chunk alive.
func (r *renderer) strs(n int) []string {
	f := r.full
	if f == nil {
		return make([]string, n)
	}
	if len(f.arena) < n {
		f.arena = make([]string, max(n, strsChunk))
	}
	s := f.arena[:n:n]
	f.arena = f.arena[n:]
	return s
}

// namedElements emits a pod's elements of the named-port sets that cover
// it, in the order of renderer.named.
func (r *renderer) namedElements(pod *Pod, pt *podText, emit func(set string, e knftables.Element)) {
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
	emit := func(set string, e knftables.Element) {
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
	texts := newPodTexts(r.prog.Pods)
	off := 0
	for i := range r.prog.Pods {
		pod := &r.prog.Pods[i]
		end := off + len(pod.IPs)
		pt := podText{addrs: texts.addrs[off:end:end], comment: &texts.comments[i]}
		r.podElementsWith(pod, &pt, emit)
		off = end
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
	chunks [][]knftables.Element
	n      int
}

const (
	minElementChunk = 16
	maxElementChunk = 1024
)

func (c *elementChunks) add(e knftables.Element) {
	k := len(c.chunks)
	if k == 0 || len(c.chunks[k-1]) == cap(c.chunks[k-1]) {
		size := minElementChunk
		if k > 0 {
			size = min(2*cap(c.chunks[k-1]), maxElementChunk)
		}
		c.chunks = append(c.chunks, make([]knftables.Element, 0, size))
		k++
	}
	c.chunks[k-1] = append(c.chunks[k-1], e)
	c.n++
}

// flush appends the gathered elements to the set's, in the order added.
func (c *elementChunks) flush() {
	out := make([]knftables.Element, len(c.set.Elements), len(c.set.Elements)+c.n)
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
func sortElements(es []knftables.Element) []knftables.Element {
	var so elementSorter
	return so.sort(es)
}

// elementSorter sorts sets' elements; its scratch space (the sort keys,
// parsed once per field, and the permutation) serves set after set.
type elementSorter struct {
	keys []fieldSortKey
	perm []int32
}

// sort is sortElements with the sorter's scratch space.
func (so *elementSorter) sort(es []knftables.Element) []knftables.Element {
	n := len(es)
	if n < 2 {
		return es
	}
	width := 0
	for i := range es {
		width = max(width, len(es[i].Key))
	}
	so.keys = slices.Grow(so.keys[:0], n*width)[:n*width]
	so.perm = slices.Grow(so.perm[:0], n)[:n]
	keys, perm := so.keys, so.perm
	for i := range es {
		for j, k := range es[i].Key {
			keys[i*width+j] = fieldKey(k)
		}
		perm[i] = int32(i)
	}
	slices.SortFunc(perm, func(a, b int32) int {
		ka, kb := es[a].Key, es[b].Key
		fa, fb := keys[int(a)*width:], keys[int(b)*width:]
		for x := 0; x < len(ka) && x < len(kb); x++ {
			if c := compareField(fa[x], fb[x], ka[x], kb[x]); c != 0 {
				return c
			}
		}
		if c := len(ka) - len(kb); c != 0 {
			return c
		}
		// Equal keys keep the order they were emitted in (the first
		// is kept), as a stable sort keeps them.
		return int(a) - int(b)
	})
	permute(es, perm)
	out := es[:0]
	for i := range es {
		if len(out) > 0 && slices.Equal(out[len(out)-1].Key, es[i].Key) {
			continue
		}
		out = append(out, es[i])
	}
	return out
}

// permute reorders es in place so that es[k] becomes the old es[perm[k]],
// following the permutation's cycles; it consumes perm.
func permute(es []knftables.Element, perm []int32) {
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
