package publish

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

// retryAfter is the wait before a write that failed for another reason
// than a stale read is tried again.
const retryAfter = time.Second

// term is one term of leadership: the pods, the slices as last read or
// written, the grouping, and the writes that bring the slices to the
// grouping. Everything ends with the term; the next starts from a list.
type term struct {
	p        *Publisher
	log      logr.Logger
	w        *Writer
	pods     *podstore.Store
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	g        *grouping
	// since is, per slice key, the first pod event not yet written.
	since map[string]time.Time

	mu sync.Mutex
	// actual is every slice as last seen (watched or written), by key.
	actual map[string]*podslice.PodAddressSlice
	// dirtyPods (pod key -> first event) and dirtySlices are what
	// changed since the last flush, first the time of the oldest.
	dirtyPods   map[string]time.Time
	dirtySlices map[string]struct{}
	first       time.Time
	wake        chan struct{}
}

func newTerm(p *Publisher, log logr.Logger) (*term, error) {
	wc := rest.CopyConfig(p.rest)
	wc.QPS, wc.Burst = p.cfg.WriteQPS, p.cfg.WriteBurst
	w, err := NewWriter(wc, p.metrics)
	if err != nil {
		return nil, err
	}
	pc, err := slim.NewPodClient(p.rest)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(p.rest)
	if err != nil {
		return nil, err
	}
	t := &term{
		p: p, log: log, w: w, g: newGrouping(), since: map[string]time.Time{},
		actual:    map[string]*podslice.PodAddressSlice{},
		dirtyPods: map[string]time.Time{}, dirtySlices: map[string]struct{}{},
		wake: make(chan struct{}, 1),
	}
	t.pods = podstore.New(podstore.RESTSource(pc), t.podChanged, log.WithName("pods"))
	t.factory = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	t.informer = t.factory.ForResource(podslice.GVR).Informer()
	_, err = t.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    t.sliceSeen,
		UpdateFunc: func(_, obj any) { t.sliceSeen(obj) },
		DeleteFunc: t.sliceGone,
	})
	return t, err
}

// run publishes until ctx ends: once the pods and the slices are read,
// every slice is brought to the pods, then each batch of changes.
func (t *term) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { t.pods.Run(ctx) })
	t.factory.Start(ctx.Done())
	defer func() {
		cancel()
		t.factory.Shutdown()
		wg.Wait()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), t.pods.HasSynced, t.informer.HasSynced) {
		return
	}
	t.reconcileAll()
	t.flush(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		}
		t.mu.Lock()
		first := t.first
		t.mu.Unlock()
		if wait := time.Until(first.Add(t.p.cfg.Window)); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		t.flush(ctx)
	}
}

// reconcileAll places every pod, its predecessor's slices adopted first,
// and marks every slice, published or meant, to be brought in step.
func (t *term) reconcileAll() {
	t.mu.Lock()
	keys := make([]string, 0, len(t.actual))
	for k := range t.actual {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if s := t.actual[k]; s.Labels[podslice.ManagedByLabel] == podslice.Publisher {
			t.g.adopt(s, t.pods.Get)
		}
		t.dirtySlices[k] = struct{}{}
	}
	t.mu.Unlock()
	for _, p := range t.pods.List() {
		t.g.place(p.Key, p)
	}
	t.mu.Lock()
	for k := range t.g.byName {
		t.dirtySlices[k] = struct{}{}
	}
	t.mu.Unlock()
}

// flush applies the pod changes gathered to the grouping and writes every
// slice they touched, or that changed under the publisher, that is not as
// meant.
func (t *term) flush(ctx context.Context) {
	t.mu.Lock()
	pods, dirty := t.dirtyPods, t.dirtySlices
	t.dirtyPods, t.dirtySlices, t.first = map[string]time.Time{}, map[string]struct{}{}, time.Time{}
	t.mu.Unlock()
	for key, at := range pods {
		for _, s := range t.g.place(key, t.pods.Get(key)) {
			k := s.key()
			dirty[k] = struct{}{}
			if old, ok := t.since[k]; !ok || at.Before(old) {
				t.since[k] = at
			}
		}
	}
	keys := make([]string, 0, len(dirty))
	for k := range dirty {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		t.sync(ctx, k)
	}
	t.p.metrics.Slices.Set(float64(len(t.g.byName)))
	t.p.metrics.Pods.Set(float64(len(t.g.byPod)))
}

// sync writes the slice with the key if it is not as meant: creates,
// replaces or deletes it, with the resourceVersion last seen.
func (t *term) sync(ctx context.Context, key string) {
	s := t.g.byName[key]
	t.mu.Lock()
	have := t.actual[key]
	t.mu.Unlock()
	var err error
	switch {
	case s == nil && have == nil:
	case s == nil:
		if err = t.w.Delete(ctx, have.Namespace, have.Name, have.ResourceVersion); err == nil || apierrors.IsNotFound(err) {
			err = nil
			t.forget(key, have.ResourceVersion)
		}
	default:
		want := s.slice()
		if have != nil && sameContent(want, have) {
			break
		}
		rv := ""
		if have != nil {
			rv = have.ResourceVersion
		}
		var got *podslice.PodAddressSlice
		if got, err = t.w.Put(ctx, want, rv); err == nil {
			t.record(key, got, false)
		}
	}
	if err == nil {
		if at, ok := t.since[key]; ok {
			t.p.metrics.WriteDelay.Observe(time.Since(at).Seconds())
			delete(t.since, key)
		}
		return
	}
	t.failed(ctx, key, s, err)
}

// failed handles a failed write: a stale read (conflict, gone, already
// there) is read again and the slice written at once; anything else is
// tried again after a while.
func (t *term) failed(ctx context.Context, key string, s *slot, err error) {
	if ctx.Err() != nil {
		return
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err) {
		t.log.V(2).Info("slice changed since it was read: reading it again", "slice", key, "err", err)
		ns, name := splitKey(key)
		cur, gerr := t.w.Get(ctx, ns, name)
		if gerr == nil {
			t.record(key, cur, true)
			t.markSlice(key)
			return
		}
		err = errors.Join(err, gerr)
	}
	t.log.Error(err, "writing a slice; trying again", "slice", key, "after", retryAfter, "pods", podCount(s))
	time.AfterFunc(retryAfter, func() { t.markSlice(key) })
}

func podCount(s *slot) int {
	if s == nil {
		return 0
	}
	return len(s.pods)
}

func splitKey(key string) (namespace, name string) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

// record keeps s (nil: none) as the slice with the key, unless what is
// kept is newer; force keeps it anyway (a fresh read).
func (t *term) record(key string, s *podslice.PodAddressSlice, force bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s == nil {
		delete(t.actual, key)
		return
	}
	if old := t.actual[key]; force || old == nil || newer(s.ResourceVersion, old.ResourceVersion) {
		t.actual[key] = s
	}
}

// forget drops the slice with the key unless what is kept is newer than
// resourceVersion rv (written again since).
func (t *term) forget(key, rv string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.actual[key]; old != nil && !newer(old.ResourceVersion, rv) {
		delete(t.actual, key)
	}
}

func (t *term) podChanged(key string) {
	t.mu.Lock()
	if _, ok := t.dirtyPods[key]; !ok {
		now := time.Now()
		t.dirtyPods[key] = now
		if t.first.IsZero() {
			t.first = now
		}
	}
	t.mu.Unlock()
	t.poke()
}

func (t *term) markSlice(key string) {
	t.mu.Lock()
	t.dirtySlices[key] = struct{}{}
	if t.first.IsZero() {
		t.first = time.Now()
	}
	t.mu.Unlock()
	t.poke()
}

func (t *term) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// sliceSeen keeps a watched slice and, when it is newer than what the
// publisher last wrote (someone else's write), has it checked.
func (t *term) sliceSeen(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s, err := fromUnstructured(u)
	if err != nil {
		// A slice the publisher cannot read is rewritten or deleted: keep
		// its version so that the write is made against it.
		t.log.Error(err, "reading a watched slice")
		s = &podslice.PodAddressSlice{}
		s.Namespace, s.Name, s.ResourceVersion = u.GetNamespace(), u.GetName(), u.GetResourceVersion()
	}
	key := s.Namespace + "/" + s.Name
	t.mu.Lock()
	old := t.actual[key]
	isNew := old == nil || newer(s.ResourceVersion, old.ResourceVersion)
	if isNew {
		t.actual[key] = s
	}
	t.mu.Unlock()
	if isNew {
		t.markSlice(key)
	}
}

func (t *term) sliceGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	key := u.GetNamespace() + "/" + u.GetName()
	t.forget(key, u.GetResourceVersion())
	t.markSlice(key)
}
