package podstore

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// LeaseWatch follows the publisher's Lease until ctx ends, calling seen
// with it on each change (nil: it does not exist), at least once as soon
// as its state is known.
type LeaseWatch func(ctx context.Context, seen func(*coordinationv1.Lease))

// InformLease watches the Lease namespace/name with an informer of that
// one object.
func InformLease(cs kubernetes.Interface, namespace, name string) LeaseWatch {
	return func(ctx context.Context, seen func(*coordinationv1.Lease)) {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }))
		inf := f.Coordination().V1().Leases().Informer()
		lease := func(o any) *coordinationv1.Lease {
			l, _ := o.(*coordinationv1.Lease)
			if l != nil && l.Name != name {
				return nil
			}
			return l
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { seen(lease(o)) },
			UpdateFunc: func(_, o any) { seen(lease(o)) },
			DeleteFunc: func(any) { seen(nil) },
		})
		if err != nil {
			return
		}
		f.Start(ctx.Done())
		defer f.Shutdown()
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return
		}
		// The handlers may not have run yet: say what the cache holds.
		o, ok, _ := inf.GetIndexer().GetByKey(namespace + "/" + name)
		if ok {
			seen(lease(o))
		} else {
			seen(nil)
		}
		<-ctx.Done()
	}
}

// leaseClock decides whether the publisher is there: its Lease was renewed
// within staleAfter. Renewals are timed by the agent's clock when it sees
// them, so that the nodes' and the publisher's clocks need not agree; only
// the first renewal seen is timed by the Lease's renewTime (never later
// than now).
type leaseClock struct {
	staleAfter time.Duration

	mu    sync.Mutex
	known bool
	// renewed is when the last renewal was seen (zero: the Lease is
	// absent or held by nobody); renewTime is the Lease's as last seen.
	renewed   time.Time
	renewTime time.Time
	holder    string
}

func (c *leaseClock) seen(l *coordinationv1.Lease, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known = true
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		c.renewed, c.renewTime, c.holder = time.Time{}, time.Time{}, ""
		return
	}
	rt, holder := l.Spec.RenewTime.Time, *l.Spec.HolderIdentity
	if rt.Equal(c.renewTime) && holder == c.holder {
		return
	}
	if c.renewTime.IsZero() {
		c.renewed = rt
		if rt.After(now) {
			c.renewed = now
		}
	} else {
		c.renewed = now
	}
	c.renewTime, c.holder = rt, holder
}

// fresh reports whether the Lease's state is known and the publisher's
// last renewal is within staleAfter of now.
func (c *leaseClock) fresh(now time.Time) (known, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known, !c.renewed.IsZero() && now.Sub(c.renewed) < c.staleAfter
}
