package publish

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
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
	// owed is, per slice key to be written, when the oldest change it
	// waits for was seen; reconciled says the term's first full
	// reconcile is done. They decide whether the slices are current.
	owed       map[string]time.Time
	reconciled bool
	// synced is the Lease renewed while the slices are current; caughtUp
	// has it renewed at once when the first reconcile is written.
	synced   *syncedLease
	caughtUp chan struct{}
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
	cs, err := kubernetes.NewForConfig(p.rest)
	if err != nil {
		return nil, err
	}
	t := &term{
		p: p, log: log, w: w, g: newGrouping(), since: map[string]time.Time{},
		actual:    map[string]*podslice.PodAddressSlice{},
		dirtyPods: map[string]time.Time{}, dirtySlices: map[string]struct{}{},
		wake: make(chan struct{}, 1), owed: map[string]time.Time{}, caughtUp: make(chan struct{}, 1),
		synced: &syncedLease{client: cs.CoordinationV1(), namespace: p.cfg.LeaseNamespace, name: p.cfg.SyncedLeaseName,
			id: p.cfg.Identity, duration: p.cfg.LeaseDuration},
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
	t.mu.Lock()
	t.reconciled = true
	t.mu.Unlock()
	wg.Go(func() { t.keepSynced(ctx, t.p.cfg.RetryPeriod) })
	t.caughtUp <- struct{}{}
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
// meant. The slices that receive a pod are written first: an agent keeps
// a pod while any slice holds it, so a pod moving between slices is never
// absent from what it reads.
func (t *term) flush(ctx context.Context) {
	t.mu.Lock()
	pods, dirty, since := t.dirtyPods, t.dirtySlices, t.first
	t.dirtyPods, t.dirtySlices, t.first = map[string]time.Time{}, map[string]struct{}{}, time.Time{}
	t.mu.Unlock()
	if since.IsZero() {
		since = time.Now()
	}
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
	t.mu.Lock()
	for k := range dirty {
		keys = append(keys, k)
		if _, ok := t.owed[k]; !ok {
			t.owed[k] = since
		}
	}
	t.mu.Unlock()
	slices.Sort(keys)
	gained, ok := map[string]bool{}, true
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		if t.gains(k) {
			gained[k] = true
			ok = t.syncKeeping(ctx, k) && ok
		}
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		if !ok && !gained[k] {
			// A slice that receives a pod is not written yet: the
			// slices that may lose one wait for its retry.
			time.AfterFunc(retryAfter, func() { t.markSlice(k) })
			continue
		}
		t.sync(ctx, k)
	}
	t.p.metrics.Slices.Set(float64(len(t.g.byName)))
	t.p.metrics.Pods.Set(float64(len(t.g.byPod)))
}

// gains says whether the slice with the key is meant to hold a pod its
// published version does not.
func (t *term) gains(key string) bool {
	s := t.g.byName[key]
	if s == nil {
		return false
	}
	t.mu.Lock()
	have := t.actual[key]
	t.mu.Unlock()
	held := map[string]bool{}
	if have != nil {
		for _, e := range have.Pods {
			held[e.Name] = true
		}
	}
	for name, p := range s.pods {
		if !held[name] && publishable(p) {
			return true
		}
	}
	return false
}

// syncKeeping writes a slice that receives pods with its published
// entries of pods that moved to another slice still kept (what a pod
// swapping slices with another needs: neither slice may drop its pod
// before the other holds it); the second pass of flush drops them. It
// says whether the slice is written.
func (t *term) syncKeeping(ctx context.Context, key string) bool {
	s := t.g.byName[key]
	t.mu.Lock()
	have := t.actual[key]
	t.mu.Unlock()
	if have == nil {
		return t.sync(ctx, key)
	}
	want := s.slice()
	unshare(want)
	for _, e := range have.Pods {
		if _, meant := s.pods[e.Name]; meant {
			continue
		}
		if moved := t.g.byPod[have.Namespace+"/"+e.Name]; moved != nil && moved != s {
			if e.Ports == nil {
				e.Ports = have.Ports
			}
			want.Pods = append(want.Pods, e)
		}
	}
	if len(want.Pods) > podslice.MaxPods {
		// No room to keep them: the write of the pods' new slices,
		// made before the second pass, still comes first for every
		// slice but this one.
		return t.sync(ctx, key)
	}
	slices.SortFunc(want.Pods, func(a, b podslice.PodEntry) int { return strings.Compare(a.Name, b.Name) })
	podslice.SharePorts(want)
	if err := t.put(ctx, key, want, have); err != nil {
		t.failed(ctx, key, s, err)
		return false
	}
	return true
}

// unshare gives each entry of s the slice's ports it stands for.
func unshare(s *podslice.PodAddressSlice) {
	for i := range s.Pods {
		if s.Pods[i].Ports == nil {
			s.Pods[i].Ports = s.Ports
		}
	}
	s.Ports = nil
}

// sync writes the slice with the key if it is not as meant: creates,
// replaces or deletes it, with the resourceVersion last seen. It says
// whether the slice is as meant.
func (t *term) sync(ctx context.Context, key string) bool {
	s := t.g.byName[key]
	t.mu.Lock()
	have := t.actual[key]
	t.mu.Unlock()
	var err error
	switch {
	case s != nil:
		err = t.put(ctx, key, s.slice(), have)
	case have != nil:
		if err = t.w.Delete(ctx, have.Namespace, have.Name, have.ResourceVersion); err == nil || apierrors.IsNotFound(err) {
			err = nil
			t.forget(key, have.ResourceVersion)
		}
	}
	return t.written(ctx, key, s, err)
}

// put writes want as the slice with the key unless have (the slice as
// last seen, nil: none) already says it.
func (t *term) put(ctx context.Context, key string, want, have *podslice.PodAddressSlice) error {
	if have != nil && sameContent(want, have) {
		return nil
	}
	rv := ""
	if have != nil {
		rv = have.ResourceVersion
	}
	got, err := t.w.Put(ctx, want, rv)
	if err == nil {
		t.record(key, got, false)
	}
	return err
}

// written ends a sync: the slice's delay observed and its debt paid, or
// the failure handled. It says whether the write was made.
func (t *term) written(ctx context.Context, key string, s *slot, err error) bool {
	if err != nil {
		t.failed(ctx, key, s, err)
		return false
	}
	if at, ok := t.since[key]; ok {
		t.p.metrics.WriteDelay.Observe(time.Since(at).Seconds())
		delete(t.since, key)
	}
	t.mu.Lock()
	delete(t.owed, key)
	t.mu.Unlock()
	return true
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
