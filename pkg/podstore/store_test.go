package podstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// script is a Source whose every call is answered by the test, in order.
type script struct {
	t     *testing.T
	calls chan call
}

// call is one Watch or List the store made, waiting for its answer.
type call struct {
	list   bool
	opts   metav1.ListOptions
	answer chan answer
}

type answer struct {
	w    watch.Interface
	pods []*compile.PodInfo
	rv   string
	err  error
}

func newScript(t *testing.T) *script { return &script{t: t, calls: make(chan call)} }

func (s *script) source(initialEvents bool) Source {
	do := func(ctx context.Context, list bool, opts metav1.ListOptions) answer {
		c := call{list: list, opts: opts, answer: make(chan answer, 1)}
		select {
		case s.calls <- c:
		case <-ctx.Done():
			return answer{err: ctx.Err()}
		}
		select {
		case a := <-c.answer:
			return a
		case <-ctx.Done():
			return answer{err: ctx.Err()}
		}
	}
	return Source{
		InitialEvents: initialEvents,
		Watch: func(ctx context.Context, opts metav1.ListOptions) (Events, error) {
			a := do(ctx, false, opts)
			if a.err != nil {
				return nil, a.err
			}
			return watchEvents{a.w}, nil
		},
		List: func(ctx context.Context, opts metav1.ListOptions) ([]*compile.PodInfo, string, error) {
			a := do(ctx, true, opts)
			return a.pods, a.rv, a.err
		},
	}
}

// next returns the store's next call, failing the test after a while.
func (s *script) next() call {
	s.t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(10 * time.Second):
		s.t.Fatal("the store made no call")
		return call{}
	}
}

// expectWatch takes the next call, which must be a watch from rv (with
// initial events or not), and answers it with a fresh fake watch.
func (s *script) expectWatch(rv string, initial bool) *watch.FakeWatcher {
	s.t.Helper()
	c := s.next()
	if c.list {
		s.t.Fatalf("the store listed (%+v), want a watch from %q", c.opts, rv)
	}
	gotInitial := c.opts.SendInitialEvents != nil && *c.opts.SendInitialEvents
	if c.opts.ResourceVersion != rv || gotInitial != initial || !c.opts.AllowWatchBookmarks || c.opts.TimeoutSeconds == nil {
		s.t.Fatalf("watch options %+v, want resourceVersion %q, initial events %v, bookmarks, a timeout", c.opts, rv, initial)
	}
	if initial && c.opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		s.t.Fatalf("initial events asked with resourceVersionMatch %q", c.opts.ResourceVersionMatch)
	}
	w := watch.NewFakeWithChanSize(100, false)
	c.answer <- answer{w: w}
	return w
}

func pod(name, rv string) *compile.PodInfo {
	p := &compile.PodInfo{ResourceVersion: rv}
	p.SetKey("ns", name)
	return p
}

func bookmark(rv string, end bool) *compile.PodInfo {
	p := &compile.PodInfo{ResourceVersion: rv}
	if end {
		p.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return p
}

// recorder collects the store's change notifications.
type recorder struct {
	mu   sync.Mutex
	keys []string
}

func (r *recorder) note(key string) { r.mu.Lock(); r.keys = append(r.keys, key); r.mu.Unlock() }

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	slices.Sort(k)
	return k
}

func start(t *testing.T, src Source) (*Store, *recorder) {
	t.Helper()
	rec := &recorder{}
	s := New(src, rec.note, logr.Discard())
	s.backoff = backoff{min: time.Millisecond, max: 2 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, rec
}

// eventually waits for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func keys(s *Store) []string {
	var out []string
	for _, p := range s.List() {
		out = append(out, p.Key+"@"+p.ResourceVersion)
	}
	slices.Sort(out)
	return out
}

func expired() error {
	return apierrors.NewResourceExpired("too old resource version: 5 (20)")
}

// TestStreamThenFollow: the initial events fill the store without
// notifications, the same watch's changes notify, a watch that ends is
// reopened from the last resource version seen (a bookmark's included).
func TestStreamThenFollow(t *testing.T) {
	sc := newScript(t)
	s, rec := start(t, sc.source(true))
	w := sc.expectWatch("", true)
	w.Add(pod("a", "1"))
	w.Add(pod("b", "2"))
	w.Modify(pod("a", "3"))
	if s.HasSynced() {
		t.Fatal("synced before the bookmark that ends the initial events")
	}
	w.Action(watch.Bookmark, bookmark("5", true))
	eventually(t, "the first sync", s.HasSynced)
	if got, want := keys(s), []string{"ns/a@3", "ns/b@2"}; !slices.Equal(got, want) {
		t.Fatalf("after the initial events: %v, want %v", got, want)
	}
	w.Modify(pod("b", "6"))
	w.Delete(pod("a", "7"))
	w.Add(pod("c", "8"))
	w.Action(watch.Bookmark, bookmark("9", false))
	eventually(t, "the changes", func() bool { return s.Get("ns/c") != nil })
	if got, want := rec.take(), []string{"ns/a", "ns/b", "ns/c"}; !slices.Equal(got, want) {
		t.Errorf("notified %v, want %v (not the initial events)", got, want)
	}
	if got, want := keys(s), []string{"ns/b@6", "ns/c@8"}; !slices.Equal(got, want) {
		t.Errorf("after the changes: %v, want %v", got, want)
	}
	w.Stop() // the watch's timeout
	w = sc.expectWatch("9", false)
	w.Add(pod("d", "10"))
	eventually(t, "the reopened watch's change", func() bool { return s.Get("ns/d") != nil })
	if got := rec.take(); !slices.Equal(got, []string{"ns/d"}) {
		t.Errorf("notified %v, want [ns/d]", got)
	}
}

// TestResyncNotifiesDifferences: after a watch fails, the store syncs
// again; pods deleted, changed or added meanwhile are notified, pods
// unchanged are not. A resource version the server no longer has
// (expired) is forgotten: the next sync starts from the newest.
func TestResyncNotifiesDifferences(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		fromRV string
	}{
		{"expired", expired(), ""},
		{"internal error", apierrors.NewInternalError(errors.New("etcd hiccup")), "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScript(t)
			s, rec := start(t, sc.source(true))
			w := sc.expectWatch("", true)
			for i, n := range []string{"keep", "gone", "changed"} {
				w.Add(pod(n, string(rune('1'+i))))
			}
			w.Action(watch.Bookmark, bookmark("4", true))
			eventually(t, "the first sync", s.HasSynced)
			w.Error(statusOf(tc.err))
			w = sc.expectWatch(tc.fromRV, true)
			w.Add(pod("keep", "1"))
			w.Add(pod("changed", "7"))
			w.Add(pod("new", "8"))
			w.Action(watch.Bookmark, bookmark("9", true))
			eventually(t, "the re-sync", func() bool { return s.Get("ns/new") != nil })
			if got, want := rec.take(), []string{"ns/changed", "ns/gone", "ns/new"}; !slices.Equal(got, want) {
				t.Errorf("notified %v, want %v", got, want)
			}
			if got, want := keys(s), []string{"ns/changed@7", "ns/keep@1", "ns/new@8"}; !slices.Equal(got, want) {
				t.Errorf("after the re-sync: %v, want %v", got, want)
			}
		})
	}
}

func statusOf(err error) *metav1.Status {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		panic(err)
	}
	return &se.ErrStatus
}

// TestListWhenInitialEventsRefused: an API server that refuses a watch
// with initial events is listed (from its watch cache), then watched from
// the list's resource version; a source that cannot stream them is
// listed at once.
func TestListWhenInitialEventsRefused(t *testing.T) {
	for _, initial := range []bool{true, false} {
		sc := newScript(t)
		s, rec := start(t, sc.source(initial))
		if initial {
			c := sc.next()
			if c.list || c.opts.SendInitialEvents == nil {
				t.Fatalf("first call %+v, want a watch with initial events", c)
			}
			c.answer <- answer{err: apierrors.NewInvalid(schema.GroupKind{Kind: "ListOptions"}, "", nil)}
		}
		c := sc.next()
		if !c.list || c.opts.ResourceVersion != "0" {
			t.Fatalf("call %+v, want a list from the watch cache (resourceVersion 0)", c)
		}
		c.answer <- answer{pods: []*compile.PodInfo{pod("a", "1"), pod("b", "2")}, rv: "3"}
		w := sc.expectWatch("3", false)
		if !s.HasSynced() || s.Len() != 2 {
			t.Fatalf("after the list: synced %v, %d pods", s.HasSynced(), s.Len())
		}
		w.Delete(pod("a", "4"))
		eventually(t, "the deletion", func() bool { return s.Len() == 1 })
		if got := rec.take(); !slices.Equal(got, []string{"ns/a"}) {
			t.Errorf("notified %v, want [ns/a]", got)
		}
	}
}

// TestFailuresBackOffAndRetry: a watch that cannot be opened, and initial
// events cut short, are retried; an expired resource version on reopening
// a watch leads to a sync from the newest.
func TestFailuresBackOffAndRetry(t *testing.T) {
	sc := newScript(t)
	s, _ := start(t, sc.source(true))
	w := sc.expectWatch("", true)
	w.Add(pod("a", "1"))
	w.Stop() // cut short: no bookmark
	w = sc.expectWatch("", true)
	w.Add(pod("a", "1"))
	w.Action(watch.Bookmark, bookmark("2", true))
	eventually(t, "the first sync", s.HasSynced)
	w.Stop()
	c := sc.next()
	if c.opts.ResourceVersion != "2" || c.opts.SendInitialEvents != nil {
		t.Fatalf("reopening: %+v", c.opts)
	}
	c.answer <- answer{err: expired()}
	w = sc.expectWatch("", true)
	w.Action(watch.Bookmark, bookmark("5", true))
	eventually(t, "the re-sync", func() bool { return s.Len() == 0 })
}

// TestListInKeyOrder: List returns the pods in key order whether the
// initial events came in that order (as the API server sends them, kept
// as they came) or not, after changes, and after a list.
func TestListInKeyOrder(t *testing.T) {
	names := func(s *Store) []string {
		var out []string
		for _, p := range s.List() {
			out = append(out, p.Key)
		}
		return out
	}
	sorted := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("ns/p-%03d", i))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		order func(i, n int) int
	}{
		{"in key order", func(i, n int) int { return i }},
		{"reversed", func(i, n int) int { return n - 1 - i }},
		{"shuffled", func(i, n int) int { return (i * 37) % n }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 100
			sc := newScript(t)
			s, _ := start(t, sc.source(true))
			w := sc.expectWatch("", true)
			for i := range n {
				w.Add(pod(fmt.Sprintf("p-%03d", tc.order(i, n)), "1"))
			}
			w.Action(watch.Bookmark, bookmark("2", true))
			eventually(t, "the first sync", s.HasSynced)
			if got, want := names(s), sorted(n); !slices.Equal(got, want) {
				t.Fatalf("after the initial events: %v, want %v", got, want)
			}
			w.Add(pod("p-100", "3"))
			w.Delete(pod("p-000", "4"))
			w.Add(pod("a", "5"))
			eventually(t, "the changes", func() bool { return s.Get("ns/a") != nil })
			if got, want := names(s), append([]string{"ns/a"}, sorted(n + 1)[1:]...); !slices.Equal(got, want) {
				t.Fatalf("after changes: %v, want %v", got, want)
			}
		})
	}
	sc := newScript(t)
	s, _ := start(t, sc.source(false))
	c := sc.next()
	if !c.list {
		t.Fatalf("first call %+v, want a list", c)
	}
	c.answer <- answer{pods: []*compile.PodInfo{pod("c", "1"), pod("a", "1"), pod("b", "1")}, rv: "2"}
	sc.expectWatch("2", false)
	if got, want := names(s), []string{"ns/a", "ns/b", "ns/c"}; !slices.Equal(got, want) {
		t.Fatalf("after a list: %v, want %v", got, want)
	}
}
