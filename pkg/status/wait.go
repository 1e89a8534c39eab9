package status

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Wait returns once every node the agents cover enforces the policy's
// current version (deleted false) or its deletion, with the row that
// says so; when ctx ends first, the last row and an error naming the
// lagging nodes. It watches the agents' pods and the NodeEnforcements:
// it sees each node's commit as soon as the node writes it.
func Wait(ctx context.Context, c Clients, a Agents, ref PolicyRef, deleted bool) (Row, error) {
	t, exists, err := Resolve(ctx, c, ref, deleted)
	if err != nil {
		return Row{Target: t}, err
	}
	if deleted && exists {
		if t.ResourceVersion, err = waitGone(ctx, c, t); err != nil {
			return Row{Target: t}, err
		}
	}
	podRes := c.Dynamic.Resource(PodsGVR).Namespace(a.Namespace)
	pods := cache.NewSharedIndexInformer(plainList(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = a.Selector
			return podRes.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = a.Selector
			return podRes.Watch(ctx, o)
		},
	}), &unstructured.Unstructured{}, 0, cache.Indexers{})
	res := c.Dynamic.Resource(GVR)
	reports := cache.NewSharedIndexInformer(plainList(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, o)
		},
	}), &unstructured.Unstructured{}, 0, cache.Indexers{})
	changed := make(chan struct{}, 1)
	signal := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick(changed) },
		UpdateFunc: func(any, any) { kick(changed) },
		DeleteFunc: func(any) { kick(changed) },
	}
	for _, inf := range []cache.SharedIndexInformer{pods, reports} {
		if _, err := inf.AddEventHandler(signal); err != nil {
			return Row{Target: t}, err
		}
		go inf.RunWithContext(ctx)
	}
	if err := synced(ctx, pods.HasSynced, reports.HasSynced); err != nil {
		return Row{Target: t}, fmt.Errorf("listing the agents' pods and NodeEnforcements: %w", err)
	}
	var row Row
	for {
		cl, err := fromStores(pods.GetStore(), reports.GetStore())
		if err != nil {
			return row, err
		}
		if row = cl.Evaluate(t); row.Done() {
			return row, nil
		}
		select {
		case <-ctx.Done():
			return row, &LaggingError{Row: row}
		case <-changed:
		}
	}
}

// plainList makes an informer start with a LIST served from the API
// server's cache rather than a streamed watch-list, which first waits for
// etcd to prove that cache fresh (up to about 100 ms, most of a wait). A
// list a little behind only makes Wait wait for the events after it:
// watermarks only rise, so an older view never says done sooner.
func plainList(lw *cache.ListWatch) cache.ListerWatcher { return plainListWatch{lw} }

type plainListWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported tells client-go's reflector to list.
func (plainListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// LaggingError is Wait's error when its time ran out.
type LaggingError struct{ Row Row }

func (e *LaggingError) Error() string {
	if e.Row.Nodes == 0 {
		return "no node runs an agent"
	}
	s := fmt.Sprintf("%d of %d nodes do not enforce it yet:", len(e.Row.Lagging), e.Row.Nodes)
	for _, l := range e.Row.Lagging {
		s += "\n  " + l.Node + ": " + l.Why
	}
	return s
}

// synced waits for the informers' first lists. client-go's
// WaitForCacheSync looks every 100 ms, most of a wait's time when every
// node already enforces the policy.
func synced(ctx context.Context, fs ...cache.InformerSynced) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		done := true
		for _, f := range fs {
			done = done && f()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func fromStores(pods, reports cache.Store) (*Cluster, error) {
	var ps []AgentPod
	for _, o := range pods.List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			ps = append(ps, AgentPodOf(u))
		}
	}
	var us []*unstructured.Unstructured
	for _, o := range reports.List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			us = append(us, u)
		}
	}
	return assemble(ps, us)
}

// waitGone watches the policy until it is deleted and returns the
// deletion's resourceVersion.
func waitGone(ctx context.Context, c Clients, t Target) (string, error) {
	o := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", t.Ref.Name).String(), ResourceVersion: t.ResourceVersion}
	res, err := c.policies(t.Ref)
	if err != nil {
		return "", err
	}
	w, err := res.Watch(ctx, o)
	if err != nil {
		return "", fmt.Errorf("watching %s: %w", t.Ref, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s still exists", t.Ref)
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch ended (a timeout of the server's): look again.
				nt, exists, err := Resolve(ctx, c, t.Ref, true)
				if err != nil || !exists {
					return nt.ResourceVersion, err
				}
				return waitGone(ctx, c, nt)
			}
			if ev.Type != watch.Deleted {
				continue
			}
			if m, err := metaOf(ev.Object); err == nil {
				return m.GetResourceVersion(), nil
			}
			nt, _, err := Resolve(ctx, c, t.Ref, true)
			return nt.ResourceVersion, err
		}
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	if m, ok := o.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("%T has no metadata", o)
}
