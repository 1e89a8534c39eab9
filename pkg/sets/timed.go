package sets

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// TimedElement is one "address . address" element of a set with the
// timeout flag (DNS learning's fqdn sets: pod address . learned address),
// added with its own timeout.
type TimedElement struct {
	Set       string
	Pod, Addr netip.Addr
	// Timeout is rounded down to milliseconds; at least 1 ms is written.
	Timeout time.Duration
}

// AddTimed adds the elements in one netlink batch, committed by the kernel
// as one transaction or not at all, and returns once it is committed. An
// element already present gets the new timeout (the kernel refreshes it).
// Pod and Addr of an element must be of one family, the set's.
func (w *NetlinkElements) AddTimed(ctx context.Context, els []TimedElement) error {
	bySet := map[string]int{}
	var changes []setChanges
	for _, e := range els {
		if !e.Pod.IsValid() || !e.Addr.IsValid() || e.Pod.Is4() != e.Addr.Is4() {
			return fmt.Errorf("set %s: element %v . %v mixes families or lacks an address", e.Set, e.Pod, e.Addr)
		}
		ms := uint64(e.Timeout / time.Millisecond)
		if ms == 0 {
			ms = 1
		}
		key := append(e.Pod.AsSlice(), e.Addr.AsSlice()...)
		i, ok := bySet[e.Set]
		if !ok {
			i = len(changes)
			bySet[e.Set] = i
			changes = append(changes, setChanges{set: e.Set})
		}
		changes[i].add = append(changes[i].add, nlElement{key: key, timeoutMS: ms})
	}
	return w.write(ctx, changes)
}
