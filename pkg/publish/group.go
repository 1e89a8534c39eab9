package publish

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// slot is one slice as the publisher means it to be: pods of one
// namespace that share one label set.
type slot struct {
	namespace, name string
	// set identifies the label set within the namespace (setKey).
	set    string
	labels map[string]string
	pods   map[string]*compile.PodInfo // by pod name
}

// key is the slot's "namespace/name".
func (s *slot) key() string { return s.namespace + "/" + s.name }

// slice is the slot's content as a PodAddressSlice: its pods in name
// order, ports shared when every pod has the same.
func (s *slot) slice() *podslice.PodAddressSlice {
	names := make([]string, 0, len(s.pods))
	for n := range s.pods {
		names = append(names, n)
	}
	slices.Sort(names)
	out := &podslice.PodAddressSlice{PodLabels: s.labels, Pods: make([]podslice.PodEntry, 0, len(names))}
	out.Namespace, out.Name = s.namespace, s.name
	for _, n := range names {
		if e, ok := podslice.Entry(s.pods[n]); ok {
			out.Pods = append(out.Pods, e)
		}
	}
	podslice.SharePorts(out)
	return out
}

// grouping places pods in slots. A pod stays in its slot while it is
// published with the same labels, so that one pod's change touches one
// slot (two when its labels change); a pod that needs a slot goes to the
// first slot of its label set with room, or to a new one.
type grouping struct {
	byPod  map[string]*slot   // pod key -> its slot
	byName map[string]*slot   // slot key -> slot
	bySet  map[string][]*slot // namespace + set -> slots, oldest first
}

func newGrouping() *grouping {
	return &grouping{byPod: map[string]*slot{}, byName: map[string]*slot{}, bySet: map[string][]*slot{}}
}

// publishable says whether a pod has a slice entry.
func publishable(p *compile.PodInfo) bool { return p != nil && p.Eligible && len(p.IPs) > 0 }

// setKey is a label set's identity: every key and value, in key order,
// each ended by a NUL (which no label key or value may contain), so that
// two label sets have one key only if they are equal.
func setKey(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b []byte
	for _, k := range keys {
		b = append(b, k...)
		b = append(b, 0)
		b = append(b, labels[k]...)
		b = append(b, 0)
	}
	return string(b)
}

// namePrefix is the start of the names of a label set's slices: a hash of
// the set, so that names are stable across leaders and restarts. The name
// is never read back: two sets whose hashes collide get different shard
// numbers (newSlot), and a slice's label set is the one it carries.
func namePrefix(set string) string {
	h := sha256.Sum256([]byte(set))
	return "ps-" + hex.EncodeToString(h[:6]) + "-"
}

// place puts the pod with the key in its slot (p nil or not publishable:
// takes it out) and returns the slots it touched: the pod's old slot and
// its new one.
func (g *grouping) place(key string, p *compile.PodInfo) []*slot {
	old := g.byPod[key]
	if !publishable(p) {
		if old == nil {
			return nil
		}
		g.remove(key, old)
		return []*slot{old}
	}
	if old != nil && old.set == setKey(p.Labels) {
		old.pods[p.Name] = p
		return []*slot{old}
	}
	var touched []*slot
	if old != nil {
		g.remove(key, old)
		touched = append(touched, old)
	}
	s := g.withRoom(p.Namespace, p.Labels)
	s.pods[p.Name] = p
	g.byPod[key] = s
	return append(touched, s)
}

// remove takes the pod out of s, and s out of the grouping when empty.
func (g *grouping) remove(key string, s *slot) {
	delete(g.byPod, key)
	delete(s.pods, key[len(s.namespace)+1:])
	if len(s.pods) > 0 {
		return
	}
	delete(g.byName, s.key())
	sk := s.namespace + "/" + s.set
	g.bySet[sk] = slices.DeleteFunc(g.bySet[sk], func(o *slot) bool { return o == s })
	if len(g.bySet[sk]) == 0 {
		delete(g.bySet, sk)
	}
}

// withRoom is the first slot of the label set with room for a pod, a new
// one when all are full.
func (g *grouping) withRoom(namespace string, labels map[string]string) *slot {
	set := setKey(labels)
	for _, s := range g.bySet[namespace+"/"+set] {
		if len(s.pods) < podslice.MaxPods {
			return s
		}
	}
	prefix := namePrefix(set)
	for n := 0; ; n++ {
		name := prefix + strconv.Itoa(n)
		if g.byName[namespace+"/"+name] == nil {
			return g.newSlot(namespace, name, set, labels)
		}
	}
}

func (g *grouping) newSlot(namespace, name, set string, labels map[string]string) *slot {
	s := &slot{namespace: namespace, name: name, set: set, labels: labels, pods: map[string]*compile.PodInfo{}}
	g.byName[s.key()] = s
	g.bySet[namespace+"/"+set] = append(g.bySet[namespace+"/"+set], s)
	return s
}

// adopt keeps an existing slice's name for the pods it lists that still
// carry its labels and are not placed yet (a new leader taking over its
// predecessor's slices: nothing moves, nothing is rewritten that did not
// change). get reads a pod by key. The slice's pods whose labels differ are
// left for place, which gives them their own label set's slot.
func (g *grouping) adopt(s *podslice.PodAddressSlice, get func(key string) *compile.PodInfo) {
	if g.byName[s.Namespace+"/"+s.Name] != nil {
		return
	}
	set := setKey(s.PodLabels)
	var sl *slot
	for _, e := range s.Pods {
		key := s.Namespace + "/" + e.Name
		p := get(key)
		if !publishable(p) || g.byPod[key] != nil || setKey(p.Labels) != set {
			continue
		}
		if sl == nil {
			sl = g.newSlot(s.Namespace, s.Name, set, p.Labels)
		}
		if len(sl.pods) >= podslice.MaxPods {
			break
		}
		sl.pods[p.Name] = p
		g.byPod[key] = sl
	}
}
