// Package podstore keeps every pod of the cluster, in its stored form
// (*compile.PodInfo), in step with the API server, and says which pods
// changed.
//
// It does the job of client-go's reflector, DeltaFIFO, indexer and
// processor for the one resource that has as many objects as the cluster
// has pods, in one goroutine: a watch's events go straight into one map.
// client-go passes each of a start's 150,000 pods through a temporary
// store, a queue, an indexer and a listener's buffer, a hand-off between
// goroutines and a key computed each time; that was a quarter of the
// agent's start.
//
// The protocol is the reflector's. A sync streams every pod as the initial
// events of a watch (sendInitialEvents, resourceVersionMatch=NotOlderThan)
// and, at the bookmark that ends them, replaces the map whole; the same
// watch then carries the changes. A source that cannot stream initial
// events (an API server without WatchList) is listed instead, then
// watched from the list's resource version. A watch that ends cleanly
// (its timeout) is reopened from the last resource version seen; one that
// fails is followed by a sync from that version, or from the newest when
// the server no longer has it (410 Gone, "too large resource version").
// Failures back off, up to 30 s.
package podstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Source lists and watches every pod of the cluster.
type Source struct {
	// Watch opens a watch.
	Watch func(ctx context.Context, opts metav1.ListOptions) (Events, error)
	// List lists every pod, with the list's resource version.
	List func(ctx context.Context, opts metav1.ListOptions) (pods []*compile.PodInfo, resourceVersion string, err error)
	// InitialEvents says Watch may be asked for initial events (a real API
	// server). A source that would ignore the request (client-go's fake
	// clientset) is listed instead.
	InitialEvents bool
}

// Events is an open watch, read in the goroutine that reads the store's
// events (slim.EventReader).
type Events interface {
	// Next returns the next event's type and pod; a bookmark's pod has
	// no name (and, ending the initial events, the annotation that says
	// so). An ERROR event is returned as its error, the end of the watch
	// as io.EOF.
	Next() (watch.EventType, *compile.PodInfo, error)
	// Close ends the watch; a Next waiting returns.
	Close() error
}

// Store holds the pods. Get, List, Len and HasSynced are safe for
// concurrent use; Run fills it.
type Store struct {
	src      Source
	onChange func(key string)
	log      logr.Logger

	mu   sync.RWMutex
	pods map[string]*compile.PodInfo
	// sorted is every pod in key order, nil when it must be made again
	// (List): a sync that received the pods in that order (the API
	// server sends them so) keeps the order it read, and any later change
	// drops it.
	sorted []*compile.PodInfo
	synced atomic.Bool
	// failing is when the watch last began to fail (Unix nanoseconds;
	// zero while a watch is open): the store may miss changes since.
	failing atomic.Int64
	// onSynced, if set, is called from Run's goroutine when the store
	// first holds every pod (Sliced: the fallback's store is ready).
	onSynced func()

	// Run's own state.
	rv       string // the last resource version seen
	needSync bool   // the map may miss changes: sync before watching
	// minWatch and maxWatch bound each watch's timeout (randomized, so
	// that a node's agents do not reconnect together); backoff bounds
	// the wait after failures.
	minWatch, maxWatch time.Duration
	backoff            backoff
	// expiredRetried: the last failure was an unavailable resource
	// version, retried at once.
	expiredRetried bool
}

// New returns an empty store that Run fills from src. onChange is called,
// from Run's goroutine, with the key of each pod added, changed or deleted
// after the store first synced; the pods of the first sync are not
// changes (whoever reads the store then reads them all).
func New(src Source, onChange func(key string), log logr.Logger) *Store {
	return &Store{
		src: src, onChange: onChange, log: log,
		pods:     map[string]*compile.PodInfo{},
		needSync: true,
		minWatch: 5 * time.Minute, maxWatch: 10 * time.Minute,
		backoff: backoff{min: 800 * time.Millisecond, max: 30 * time.Second},
	}
}

// Get returns the pod with the key ("namespace/name"), nil if there is none.
func (s *Store) Get(key string) *compile.PodInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pods[key]
}

// List returns every pod in key order. The slice is shared with the
// store and later callers: it must not be modified.
func (s *Store) List() []*compile.PodInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sorted == nil {
		out := make([]*compile.PodInfo, 0, len(s.pods))
		for _, p := range s.pods {
			out = append(out, p)
		}
		slices.SortFunc(out, func(a, b *compile.PodInfo) int { return strings.Compare(a.Key, b.Key) })
		s.sorted = out
	}
	return slices.Clip(s.sorted)
}

// Len is the number of pods.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.pods)
}

// HasSynced reports whether the store has held every pod of the cluster
// once (it stays true through later re-syncs).
func (s *Store) HasSynced() bool { return s.synced.Load() }

// FailingSince is when the store's watch began to fail, zero while it
// follows the pods (or has not tried yet): the store may lack every change
// made since.
func (s *Store) FailingSince() time.Time {
	if n := s.failing.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Run keeps the store in step until ctx ends.
func (s *Store) Run(ctx context.Context) {
	var w Events
	for ctx.Err() == nil {
		if w == nil {
			var err error
			w, err = s.open(ctx)
			if err != nil {
				s.failing.CompareAndSwap(0, time.Now().UnixNano())
				s.failed(ctx, "opening the pod watch", err)
				continue
			}
			s.failing.Store(0)
		}
		start := time.Now()
		events, err := s.follow(w)
		w.Close()
		w = nil
		switch {
		case ctx.Err() != nil:
		case err != nil:
			s.needSync = true
			s.failing.CompareAndSwap(0, time.Now().UnixNano())
			s.failed(ctx, "watching pods", err)
		case events == 0 && time.Since(start) < time.Second:
			// Closed at once, again and again, would spin.
			s.failed(ctx, "watching pods", errors.New("the watch closed at once without events"))
		default:
			s.backoff.reset()
			s.expiredRetried = false
		}
	}
}

// open syncs when needed (returning the sync's watch, or nil after a list)
// and otherwise, or after a list, watches from the last resource version.
func (s *Store) open(ctx context.Context) (Events, error) {
	if s.needSync {
		w, err := s.sync(ctx)
		if err != nil || w != nil {
			return w, err
		}
	}
	return s.watch(ctx, metav1.ListOptions{ResourceVersion: s.rv, AllowWatchBookmarks: true, TimeoutSeconds: s.timeout()})
}

// watch opens a watch that ctx's end closes.
func (s *Store) watch(ctx context.Context, opts metav1.ListOptions) (Events, error) {
	w, err := s.src.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &closing{Events: w, stop: context.AfterFunc(ctx, func() { w.Close() })}, nil
}

// closing is a watch that ctx's end closes, until it is closed itself
// (then the watch and its buffers are let go).
type closing struct {
	Events
	stop func() bool
}

func (c *closing) Close() error {
	c.stop()
	return c.Events.Close()
}

// failed logs a failure, forgets the resource version if the server no
// longer has it (and then, the first time, retries at once: the newest
// state is always there), and waits the backoff.
func (s *Store) failed(ctx context.Context, what string, err error) {
	if isExpired(err) {
		s.rv = ""
		s.needSync = true
		if !s.expiredRetried {
			s.expiredRetried = true
			s.log.Info("Pod watch's resource version unavailable; reading every pod anew", "step", what, "err", err.Error())
			return
		}
	}
	d := s.backoff.next()
	s.log.Info("Pod watch failed; retrying", "step", what, "err", err.Error(), "retryIn", d.Round(time.Millisecond))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// isExpired reports an error after which the last resource version is no
// use: the server's history no longer reaches it, or it is ahead of what
// the server has.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) ||
		apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

func (s *Store) timeout() *int64 {
	d := s.minWatch + time.Duration(rand.Int64N(int64(s.maxWatch-s.minWatch)+1))
	secs := int64(d.Seconds())
	return &secs
}

// sync reads every pod anew and replaces the map: from a watch's initial
// events (the watch is returned, to follow), or from a list when the
// source cannot stream them or the server refused to.
func (s *Store) sync(ctx context.Context) (Events, error) {
	if s.src.InitialEvents {
		opts := metav1.ListOptions{ResourceVersion: s.rv, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
			SendInitialEvents: new(true), AllowWatchBookmarks: true, TimeoutSeconds: s.timeout()}
		start := time.Now()
		w, err := s.watch(ctx, opts)
		if err == nil {
			fresh, sorted, rv, err := s.collect(w, s.Len())
			if err != nil {
				w.Close()
				return nil, err
			}
			s.replace(fresh, sorted, rv)
			s.log.Info("Pods read from a watch's initial events", "pods", len(fresh), "resourceVersion", rv, "took", time.Since(start).Round(time.Millisecond))
			return w, nil
		}
		if ctx.Err() != nil || isExpired(err) {
			return nil, err
		}
		// An API server without WatchList refuses the request: list.
		s.log.V(2).Info("Pod watch with initial events refused; listing", "err", err.Error())
	}
	start := time.Now()
	opts := metav1.ListOptions{ResourceVersion: s.rv}
	if opts.ResourceVersion == "" {
		// The newest state, from the API server's watch cache.
		opts.ResourceVersion = "0"
	}
	pods, rv, err := s.src.List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	fresh := make(map[string]*compile.PodInfo, len(pods))
	sorted := inKeyOrder{}
	for _, p := range pods {
		fresh[p.Key] = p
		sorted.add(p)
	}
	s.replace(fresh, sorted.list(len(fresh)), rv)
	s.log.Info("Pods listed", "pods", len(fresh), "resourceVersion", rv, "took", time.Since(start).Round(time.Millisecond))
	return nil, nil
}

// collect reads a watch's initial events up to the bookmark that ends
// them, and returns the pods by key and, when they came in key order, as
// they came. sizeHint presizes the map.
func (s *Store) collect(w Events, sizeHint int) (map[string]*compile.PodInfo, []*compile.PodInfo, string, error) {
	fresh := make(map[string]*compile.PodInfo, sizeHint)
	sorted := inKeyOrder{pods: make([]*compile.PodInfo, 0, sizeHint)}
	for {
		typ, p, err := w.Next()
		if err == io.EOF {
			return nil, nil, "", errors.New("the watch ended before its initial events did")
		}
		if err != nil {
			return nil, nil, "", err
		}
		switch typ {
		case watch.Added, watch.Modified:
			fresh[p.Key] = p
			sorted.add(p)
		case watch.Deleted:
			delete(fresh, p.Key)
			sorted.broken = true
		case watch.Bookmark:
			if p.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
				return fresh, sorted.list(len(fresh)), p.ResourceVersion, nil
			}
		}
	}
}

// inKeyOrder collects pods as long as each comes after the last in key
// order.
type inKeyOrder struct {
	pods   []*compile.PodInfo
	broken bool
}

func (o *inKeyOrder) add(p *compile.PodInfo) {
	if o.broken || len(o.pods) > 0 && o.pods[len(o.pods)-1].Key >= p.Key {
		o.broken, o.pods = true, nil
		return
	}
	o.pods = append(o.pods, p)
}

// list is the pods in key order, nil if they did not come so (or are not
// all n pods kept).
func (o *inKeyOrder) list(n int) []*compile.PodInfo {
	if o.broken || len(o.pods) != n {
		return nil
	}
	return o.pods
}

// replace makes fresh the store's pods, at resource version rv, and says
// what changed since the previous sync; sorted is fresh in key order, or
// nil.
func (s *Store) replace(fresh map[string]*compile.PodInfo, sorted []*compile.PodInfo, rv string) {
	s.mu.Lock()
	old := s.pods
	s.pods, s.sorted = fresh, sorted
	s.mu.Unlock()
	s.rv = rv
	s.needSync = false
	if !s.synced.Load() {
		s.synced.Store(true)
		if s.onSynced != nil {
			s.onSynced()
		}
		return
	}
	for k, o := range old {
		if n := fresh[k]; n == nil || n.ResourceVersion != o.ResourceVersion {
			s.onChange(k)
		}
	}
	for k := range fresh {
		if old[k] == nil {
			s.onChange(k)
		}
	}
}

// follow applies a watch's events until it ends, and returns how many it
// read. An ERROR event ends it with the error it carries.
func (s *Store) follow(w Events) (int, error) {
	for n := 0; ; n++ {
		typ, p, err := w.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		s.rv = p.ResourceVersion
		switch typ {
		case watch.Added, watch.Modified:
			s.mu.Lock()
			s.pods[p.Key], s.sorted = p, nil
			s.mu.Unlock()
			s.onChange(p.Key)
		case watch.Deleted:
			s.mu.Lock()
			delete(s.pods, p.Key)
			s.sorted = nil
			s.mu.Unlock()
			s.onChange(p.Key)
		}
	}
}

// backoff is an exponential delay with jitter.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.min
	case b.cur < b.max:
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur/2 + time.Duration(rand.Int64N(int64(b.cur/2)+1))
}

func (b *backoff) reset() { b.cur = 0 }
