package sets

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
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
	// Grouped by set, in the order the sets first appear: one message per
	// set (or per 60 KiB of elements).
	var order []string
	for _, e := range els {
		if !e.Pod.IsValid() || !e.Addr.IsValid() || e.Pod.Is4() != e.Addr.Is4() {
			return fmt.Errorf("set %s: element %v . %v mixes families or lacks an address", e.Set, e.Pod, e.Addr)
		}
		if !slices.Contains(order, e.Set) {
			order = append(order, e.Set)
		}
	}
	b := w.newBatch(len(els))
	for _, set := range order {
		for _, e := range els {
			if e.Set == set {
				el := timedElement(e)
				b.add(set, unix.NFT_MSG_NEWSETELEM, &el)
			}
		}
	}
	return w.write(ctx, b)
}

// timedElement is the kernel element: the two addresses, the timeout.
func timedElement(e TimedElement) nlElement {
	ms := uint64(e.Timeout / time.Millisecond)
	if ms == 0 {
		ms = 1
	}
	n := e.Pod.BitLen() / 8
	el := nlElement{keyLen: uint8(2 * n), timeoutMS: ms}
	putAddr(el.keyBuf[:n], e.Pod)
	putAddr(el.keyBuf[n:2*n], e.Addr)
	return el
}
