package podstore

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func lease(holder string, renew time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &t}}
}

// TestLeaseClock: the publisher is there while its Lease was renewed
// within the bound, timed by the agent's clock when it sees a renewal (a
// publisher's clock ahead or behind changes nothing after the first);
// an absent Lease, or one held by nobody, is stale at once.
func TestLeaseClock(t *testing.T) {
	t0 := time.Unix(10_000, 0)
	check := func(step string, c *leaseClock, now time.Time, wantKnown, wantFresh bool) {
		t.Helper()
		if known, fresh := c.fresh(now); known != wantKnown || fresh != wantFresh {
			t.Errorf("%s: known %v fresh %v, want %v %v", step, known, fresh, wantKnown, wantFresh)
		}
	}
	c := &leaseClock{staleAfter: 45 * time.Second}
	check("nothing seen", c, t0, false, false)
	// First sight of a Lease renewed a minute ago: stale.
	c.seen(lease("p-0", t0.Add(-time.Minute)), t0)
	check("renewed a minute before the first sight", c, t0, true, false)
	// A renewal seen now, stamped an hour behind (the publisher's clock):
	// fresh, for 45 s of the agent's clock.
	c.seen(lease("p-0", t0.Add(-time.Hour)), t0)
	check("renewal seen", c, t0.Add(44*time.Second), true, true)
	check("no renewal for 45 s", c, t0.Add(45*time.Second), true, false)
	// The same renewTime again is no renewal.
	c.seen(lease("p-0", t0.Add(-time.Hour)), t0.Add(50*time.Second))
	check("the same renewal again", c, t0.Add(50*time.Second), true, false)
	// A first sight stamped in the future counts from now, not later.
	c2 := &leaseClock{staleAfter: 45 * time.Second}
	c2.seen(lease("p-0", t0.Add(time.Hour)), t0)
	check("stamped ahead", c2, t0.Add(46*time.Second), true, false)
	// Released (no holder) or deleted: stale at once.
	c2.seen(lease("", t0), t0)
	check("released", c2, t0, true, false)
	c2.seen(lease("p-1", t0), t0)
	check("taken again", c2, t0.Add(time.Second), true, true)
	c2.seen(nil, t0.Add(2*time.Second))
	check("deleted", c2, t0.Add(2*time.Second), true, false)
}
