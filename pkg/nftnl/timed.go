package nftnl

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
func (w *Conn) AddTimed(ctx context.Context, els []TimedElement) error {
	return w.writeTimed(ctx, els, false)
}

// DeleteTimed deletes the elements (their Timeout is ignored) in one
// netlink batch, committed as one transaction or not at all. An element
// that is not in its set is no error: each is first added without a
// timeout (no change to one that exists), then deleted, in the same batch,
// which works on kernels without NFT_MSG_DESTROYSETELEM (6.3). The sets
// must exist.
func (w *Conn) DeleteTimed(ctx context.Context, els []TimedElement) error {
	return w.writeTimed(ctx, els, true)
}

func (w *Conn) writeTimed(ctx context.Context, els []TimedElement, del bool) error {
	// Grouped by set, in the order the sets first appear: one message per
	// set and operation (or per 60 KiB of elements).
	var order []string
	for _, e := range els {
		if !e.Pod.IsValid() || !e.Addr.IsValid() || e.Pod.Is4() != e.Addr.Is4() {
			return fmt.Errorf("set %s: element %v . %v mixes families or lacks an address", e.Set, e.Pod, e.Addr)
		}
		if !slices.Contains(order, e.Set) {
			order = append(order, e.Set)
		}
	}
	n := len(els)
	if del {
		n *= 2
	}
	b := w.NewBatch(n)
	for _, set := range order {
		ops := []uint16{unix.NFT_MSG_NEWSETELEM}
		if del {
			ops = append(ops, unix.NFT_MSG_DELSETELEM)
		}
		for _, op := range ops {
			for _, e := range els {
				if e.Set == set {
					el := timedElement(e)
					if del {
						el.timeoutMS = 0
					}
					b.add(set, op, &el)
				}
			}
		}
	}
	return w.Write(ctx, b)
}

// ListTimed returns the elements of a set of "address . address" keys (a
// dynamic set of DNS learning), without their timeouts.
func (w *Conn) ListTimed(ctx context.Context, set string) ([]TimedElement, error) {
	var out []TimedElement
	err := w.SetElements(ctx, set, func(e *KernelElement) {
		var pod, addr netip.Addr
		switch len(e.key) {
		case 8:
			pod, addr = netip.AddrFrom4([4]byte(e.key[:4])), netip.AddrFrom4([4]byte(e.key[4:]))
		case 32:
			pod, addr = netip.AddrFrom16([16]byte(e.key[:16])), netip.AddrFrom16([16]byte(e.key[16:]))
		default:
			return
		}
		out = append(out, TimedElement{Set: set, Pod: pod, Addr: addr})
	})
	return out, err
}

// timedElement is the kernel element: the two addresses, the timeout.
func timedElement(e TimedElement) Element {
	ms := uint64(e.Timeout / time.Millisecond)
	if ms == 0 {
		ms = 1
	}
	n := e.Pod.BitLen() / 8
	el := Element{keyLen: uint8(2 * n), timeoutMS: ms}
	putAddr(el.keyBuf[:n], e.Pod)
	putAddr(el.keyBuf[n:2*n], e.Addr)
	return el
}
