package podstore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// SliceLimits bound what the slices may make an agent hold: a slice that
// would exceed them is left out whole (its pods unknown, so held), logged
// and counted.
type SliceLimits struct {
	// Slices is the most slices held.
	Slices int
	// Pods is the most pod entries held, over every slice.
	Pods int
}

// DefaultSliceLimits are the bounds without configuration: well above the
// 150,000 pods the agent is measured with, in slices of one pod each at
// worst (StatefulSets).
var DefaultSliceLimits = SliceLimits{Slices: 300_000, Pods: 300_000}

// errOverLimit says a slice was left out for the limits.
var errOverLimit = errors.New("over the limits")

// sliceSet is the pods the slices hold, each slice's and, by pod, which
// slices hold it: a pod moving from one slice to another is held by both
// for as long as the old one still names it, and is never absent in
// between whichever of the two writes comes first. A pod's value is its
// entry in the slice that last wrote it and still holds it.
type sliceSet struct {
	// node is the agent's own: its pods' entries are left out (the
	// node's own Pod watch knows them).
	node   string
	limits SliceLimits
	// slices are each slice's pods (by slice key, then pod key).
	slices map[string]map[string]*compile.PodInfo
	// holders are the slices that hold each pod, the last written last.
	holders map[string][]string
	// entries is the number of pod entries over every slice.
	entries int
}

func newSliceSet(node string, limits SliceLimits) *sliceSet {
	return &sliceSet{node: node, limits: limits,
		slices: map[string]map[string]*compile.PodInfo{}, holders: map[string][]string{}}
}

// get returns the pod with the key, nil if no slice holds it.
func (s *sliceSet) get(key string) *compile.PodInfo {
	h := s.holders[key]
	if len(h) == 0 {
		return nil
	}
	return s.slices[h[len(h)-1]][key]
}

// each calls f with every pod held.
func (s *sliceSet) each(f func(*compile.PodInfo)) {
	for key := range s.holders {
		f(s.get(key))
	}
}

// set makes the slice's pods those of sl (nil: the slice was deleted) and
// calls changed with the key of each pod whose value changed. Entries that
// do not validate are left out (unknown); the error says which, or that
// the slice was left out whole for the limits. Entries of the agent's own
// node are left out silently.
func (s *sliceSet) set(key string, sl *podslice.PodAddressSlice, changed func(key string)) error {
	var fresh map[string]*compile.PodInfo
	var err error
	if sl != nil {
		fresh, err = s.read(sl)
		if fresh == nil {
			// Nothing valid: the slice as if deleted.
			s.replace(key, nil, changed)
			return err
		}
		old := s.slices[key]
		if old == nil && len(s.slices) >= s.limits.Slices || s.entries-len(old)+len(fresh) > s.limits.Pods {
			s.replace(key, nil, changed)
			return fmt.Errorf("slice %s: %d pods: %w (%d slices, %d pods at most)",
				key, len(fresh), errOverLimit, s.limits.Slices, s.limits.Pods)
		}
		// A pod whose entry did not change keeps its value: the
		// controller is not told of it.
		for k, p := range fresh {
			if o := old[k]; o != nil && samePod(o, p) {
				fresh[k] = o
			}
		}
	}
	s.replace(key, fresh, changed)
	return err
}

// read converts a slice's valid entries not of the agent's node; nil if
// none. Each pod's resource version, which makes the inputs' fingerprint,
// is SliceEntryVersion's.
func (s *sliceSet) read(sl *podslice.PodAddressSlice) (map[string]*compile.PodInfo, error) {
	pods, err := podslice.PodInfos(sl)
	var fresh map[string]*compile.PodInfo
	for _, p := range pods {
		if p.Node == s.node && s.node != "" {
			continue
		}
		if fresh == nil {
			fresh = make(map[string]*compile.PodInfo, len(pods))
		}
		p.ResourceVersion = SliceEntryVersion(p)
		fresh[p.Key] = p
	}
	return fresh, err
}

// replace puts fresh in the slice's place (nil: none) and says which pods
// changed value.
func (s *sliceSet) replace(key string, fresh map[string]*compile.PodInfo, changed func(key string)) {
	old := s.slices[key]
	touched := make(map[string]*compile.PodInfo, max(len(old), len(fresh)))
	for k := range old {
		touched[k] = s.get(k)
	}
	for k := range fresh {
		if _, ok := touched[k]; !ok {
			touched[k] = s.get(k)
		}
	}
	s.entries += len(fresh) - len(old)
	if fresh == nil {
		delete(s.slices, key)
	} else {
		s.slices[key] = fresh
	}
	for k := range old {
		if _, kept := fresh[k]; !kept {
			s.drop(k, key)
		}
	}
	for k := range fresh {
		// The last writer goes last.
		h := slices.DeleteFunc(s.holders[k], func(h string) bool { return h == key })
		s.holders[k] = append(h, key)
	}
	for k, before := range touched {
		if after := s.get(k); after != before && (after == nil || before == nil || !samePod(before, after)) {
			changed(k)
		}
	}
}

// drop removes slice from the pod's holders.
func (s *sliceSet) drop(pod, slice string) {
	h := slices.DeleteFunc(s.holders[pod], func(h string) bool { return h == slice })
	if len(h) == 0 {
		delete(s.holders, pod)
		return
	}
	s.holders[pod] = h
}

// samePod reports whether two pods are the same to policies (resource
// versions aside).
func samePod(a, b *compile.PodInfo) bool {
	return a.Key == b.Key && a.Node == b.Node && a.Eligible == b.Eligible &&
		a.CreationTimestamp.Equal(&b.CreationTimestamp) &&
		(a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil) &&
		slices.Equal(a.IPs, b.IPs) && slices.Equal(a.Ports, b.Ports) && maps.Equal(a.Labels, b.Labels)
}

// SliceEntryVersion is the resource version a pod read from a slice takes:
// a hash of what its entry says (every field samePod compares), not the
// slice's resourceVersion. A pod's entry that did not change keeps its
// value through writes of its slice (the controller is not told), so the
// slice's version would depend on the slices' history; this one depends
// only on the slices as they are, so that anyone reading them (a test
// waiting for the agent's inputs fingerprint) computes the agent's
// fingerprint.
func SliceEntryVersion(p *compile.PodInfo) string {
	h := fnv.New64a()
	field := func(s string) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	field(p.Key)
	field(p.Node)
	field(strconv.FormatBool(p.Eligible))
	field(strconv.FormatInt(p.CreationTimestamp.UnixNano(), 10))
	field(strconv.FormatBool(p.DeletionTimestamp != nil))
	for _, ip := range p.IPs {
		field(ip.String())
	}
	field("")
	for _, pt := range p.Ports {
		field(pt.Name)
		field(strconv.Itoa(int(pt.Protocol)))
		field(strconv.Itoa(int(pt.Port)))
	}
	field("")
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		field(k)
		field(p.Labels[k])
	}
	return "slice-" + strconv.FormatUint(h.Sum64(), 16)
}
