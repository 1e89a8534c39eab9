package nftnl

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestDeleteTimed: DeleteTimed removes the given elements of a dynamic set,
// leaves the others, and is no error for an element the set lacks;
// ListTimed reads what is left.
func TestDeleteTimed(t *testing.T) {
	ns, f := scratchNetns(t)
	nftIn(t, ns, "add table inet t\nadd set inet t learned-v4 { type ipv4_addr . ipv4_addr ; flags timeout ; }\n", "-f", "-")
	w := NewConn("t", int(f.Fd()))
	defer w.Close()
	ctx := context.Background()
	el := func(pod, addr string) TimedElement {
		return TimedElement{Set: "learned-v4", Pod: netip.MustParseAddr(pod), Addr: netip.MustParseAddr(addr), Timeout: time.Minute}
	}
	if err := w.AddTimed(ctx, []TimedElement{el("10.0.0.1", "192.0.2.1"), el("10.0.0.1", "192.0.2.2"), el("10.0.0.2", "192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteTimed(ctx, []TimedElement{el("10.0.0.1", "192.0.2.1"), el("10.0.0.1", "192.0.2.2"), el("10.0.0.9", "192.0.2.9")}); err != nil {
		t.Fatalf("DeleteTimed, one element absent: %v", err)
	}
	if got, err := w.ListTimed(ctx, "learned-v4"); err != nil || len(got) != 1 || got[0].Pod != netip.MustParseAddr("10.0.0.2") || got[0].Addr != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("ListTimed = %+v, %v; want 10.0.0.2 . 192.0.2.1", got, err)
	}
	got := nftIn(t, ns, "", "list", "set", "inet", "t", "learned-v4")
	if strings.Contains(got, "10.0.0.1 .") || strings.Contains(got, "10.0.0.9") || !strings.Contains(got, "10.0.0.2 . 192.0.2.1 timeout 1m") {
		t.Errorf("after deleting 10.0.0.1's elements (and an absent one):\n%s", got)
	}
}
