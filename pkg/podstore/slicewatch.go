package podstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// SliceSource lists and watches the PodAddressSlices of every namespace.
type SliceSource struct {
	List  func(ctx context.Context, opts metav1.ListOptions) (*podslice.PodAddressSliceList, error)
	Watch func(ctx context.Context, opts metav1.ListOptions) (SliceEvents, error)
}

// SliceEvents is an open watch of slices.
type SliceEvents interface {
	// Next returns the next event; an ERROR event is returned as its
	// error, the end of the watch as io.EOF.
	Next() (watch.EventType, *podslice.PodAddressSlice, error)
	Close() error
}

// RESTSliceSource reads slices as JSON (a custom resource has no
// protobuf) through c, any client of the API server: the paths are
// absolute. Only the publisher's slices are read (podslice.ManagedByLabel).
func RESTSliceSource(c rest.Interface) SliceSource {
	const path = "/apis/" + podslice.Group + "/" + podslice.Version + "/" + podslice.Resource
	req := func(opts metav1.ListOptions) *rest.Request {
		opts.LabelSelector = podslice.ManagedByLabel + "=" + podslice.Publisher
		r := c.Get().AbsPath(path).SetHeader("Accept", "application/json")
		for k, v := range listParams(opts) {
			r = r.Param(k, v)
		}
		if opts.TimeoutSeconds != nil {
			r = r.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
		}
		return r
	}
	return SliceSource{
		List: func(ctx context.Context, opts metav1.ListOptions) (*podslice.PodAddressSliceList, error) {
			body, err := req(opts).DoRaw(ctx)
			if err != nil {
				return nil, err
			}
			var l podslice.PodAddressSliceList
			if err := json.Unmarshal(body, &l); err != nil {
				return nil, fmt.Errorf("decoding the slices: %w", err)
			}
			return &l, nil
		},
		Watch: func(ctx context.Context, opts metav1.ListOptions) (SliceEvents, error) {
			opts.Watch = true
			body, err := req(opts).Stream(ctx)
			if err != nil {
				return nil, err
			}
			return &jsonSliceEvents{body: body, dec: json.NewDecoder(body)}, nil
		},
	}
}

func listParams(o metav1.ListOptions) map[string]string {
	p := map[string]string{"labelSelector": o.LabelSelector}
	if o.ResourceVersion != "" {
		p["resourceVersion"] = o.ResourceVersion
	}
	if o.Watch {
		p["watch"] = "true"
		p["allowWatchBookmarks"] = fmt.Sprint(o.AllowWatchBookmarks)
	}
	if o.TimeoutSeconds != nil {
		p["timeoutSeconds"] = fmt.Sprint(*o.TimeoutSeconds)
	}
	return p
}

// jsonSliceEvents reads a JSON watch stream: one {"type","object"} after
// another.
type jsonSliceEvents struct {
	body io.ReadCloser
	dec  *json.Decoder
}

func (e *jsonSliceEvents) Next() (watch.EventType, *podslice.PodAddressSlice, error) {
	var ev struct {
		Type   watch.EventType `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := e.dec.Decode(&ev); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return "", nil, io.EOF
		}
		return "", nil, fmt.Errorf("slice watch: %w", err)
	}
	if ev.Type == watch.Error {
		var st metav1.Status
		if err := json.Unmarshal(ev.Object, &st); err != nil {
			return "", nil, fmt.Errorf("slice watch: an ERROR event: %w", err)
		}
		return "", nil, apierrors.FromObject(&st)
	}
	var sl podslice.PodAddressSlice
	if err := json.Unmarshal(ev.Object, &sl); err != nil {
		return "", nil, fmt.Errorf("slice watch: a %s event: %w", ev.Type, err)
	}
	return ev.Type, &sl, nil
}

func (e *jsonSliceEvents) Close() error { return e.body.Close() }

// sliceWatch keeps a sliceSet in step with the API server: list, then
// watch from the list's resource version; reopened from the last resource
// version after a watch's timeout, listed anew after a failure (from the
// newest state when the server no longer has the last resource version),
// with podstore's backoff.
type sliceWatch struct {
	src SliceSource
	// apply receives the list's slices (replace: every slice at once) or
	// one event's slice (nil: deleted), under the owner's lock.
	replace func(items []podslice.PodAddressSlice)
	apply   func(key string, sl *podslice.PodAddressSlice)
	log     func(msg string, kv ...any)

	rv                 string
	needList           bool
	minWatch, maxWatch time.Duration
	backoff            backoff
	expiredRetried     bool
}

func (w *sliceWatch) run(ctx context.Context) {
	w.needList = true
	for ctx.Err() == nil {
		if w.needList {
			if err := w.list(ctx); err != nil {
				w.failed(ctx, "listing slices", err)
				continue
			}
		}
		ev, err := w.src.Watch(ctx, metav1.ListOptions{ResourceVersion: w.rv, AllowWatchBookmarks: true, TimeoutSeconds: w.timeout()})
		if err != nil {
			w.needList = true
			w.failed(ctx, "watching slices", err)
			continue
		}
		stop := context.AfterFunc(ctx, func() { ev.Close() })
		start := time.Now()
		n, err := w.follow(ev)
		stop()
		ev.Close()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			w.needList = true
			w.failed(ctx, "watching slices", err)
		case n == 0 && time.Since(start) < time.Second:
			w.failed(ctx, "watching slices", errors.New("the watch closed at once without events"))
		default:
			w.backoff.reset()
			w.expiredRetried = false
		}
	}
}

func (w *sliceWatch) list(ctx context.Context) error {
	opts := metav1.ListOptions{ResourceVersion: w.rv}
	if opts.ResourceVersion == "" {
		opts.ResourceVersion = "0"
	}
	l, err := w.src.List(ctx, opts)
	if err != nil {
		return err
	}
	w.replace(l.Items)
	w.rv, w.needList = l.ResourceVersion, false
	w.log("Pod address slices listed", "slices", len(l.Items), "resourceVersion", l.ResourceVersion)
	return nil
}

func (w *sliceWatch) follow(ev SliceEvents) (int, error) {
	for n := 0; ; n++ {
		typ, sl, err := ev.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		w.rv = sl.ResourceVersion
		switch typ {
		case watch.Added, watch.Modified:
			w.apply(sl.Namespace+"/"+sl.Name, sl)
		case watch.Deleted:
			w.apply(sl.Namespace+"/"+sl.Name, nil)
		}
	}
}

func (w *sliceWatch) failed(ctx context.Context, what string, err error) {
	if isExpired(err) {
		w.rv, w.needList = "", true
		if !w.expiredRetried {
			w.expiredRetried = true
			w.log("Slice watch's resource version unavailable; listing anew", "step", what, "err", err.Error())
			return
		}
	}
	d := w.backoff.next()
	w.log("Slice watch failed; retrying", "step", what, "err", err.Error(), "retryIn", d.Round(time.Millisecond))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *sliceWatch) timeout() *int64 {
	s := Store{minWatch: w.minWatch, maxWatch: w.maxWatch}
	return s.timeout()
}
