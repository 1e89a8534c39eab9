package publish

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// syncedLease writes the Lease that says the leader's slices are current
// (Config.SyncedLeaseName): holder this replica, renewTime now. Only a
// leader whose slices are current writes it, so an agent that reads it
// renewed within its stale bound reads slices at most that old plus
// MaxBacklog, whoever leads and however long no one led.
type syncedLease struct {
	client              coordinationclient.LeasesGetter
	namespace, name, id string
	duration            time.Duration
}

// renew writes the Lease as renewed by this replica at now, creating it
// when absent.
func (l *syncedLease) renew(ctx context.Context, now time.Time) error {
	leases := l.client.Leases(l.namespace)
	cur, err := leases.Get(ctx, l.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cur = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.namespace, Name: l.name}}
		l.set(cur, now)
		_, err = leases.Create(ctx, cur, metav1.CreateOptions{})
		return wrap("create", l, err)
	}
	if err != nil {
		return wrap("get", l, err)
	}
	l.set(cur, now)
	_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
	return wrap("update", l, err)
}

func (l *syncedLease) set(lease *coordinationv1.Lease, now time.Time) {
	t := metav1.NewMicroTime(now)
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != l.id {
		lease.Spec.HolderIdentity = ptr.To(l.id)
		lease.Spec.AcquireTime = &t
		lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	}
	lease.Spec.RenewTime = &t
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(l.duration / time.Second))
}

func wrap(op string, l *syncedLease, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s Lease %s/%s: %w", op, l.namespace, l.name, err)
}

// keepSynced renews the synced Lease every period while the term's
// slices are current, until ctx ends.
func (t *term) keepSynced(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.caughtUp:
		case <-tick.C:
		}
		now := time.Now()
		if !t.current(now) {
			continue
		}
		if err := t.synced.renew(ctx, now); err != nil && ctx.Err() == nil {
			t.log.Error(err, "renewing the synced Lease")
		}
	}
}

// current says whether the slices are as the pods were at most MaxBacklog
// ago: the first full reconcile is written, no pod change or slice write
// has waited longer, and the pod watch has not failed for longer.
func (t *term) current(now time.Time) bool {
	limit := now.Add(-t.p.cfg.MaxBacklog)
	if f := t.pods.FailingSince(); !f.IsZero() && f.Before(limit) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.reconciled || (!t.first.IsZero() && t.first.Before(limit)) {
		return false
	}
	for _, at := range t.owed {
		if at.Before(limit) {
			return false
		}
	}
	return true
}
