package bench

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
)

// protobufWatchStream encodes events as the API server writes a protobuf
// watch: its stream serializer and framer, each object in the protobuf
// envelope inside a WatchEvent.
func protobufWatchStream(t *testing.T, events []watch.Event) []byte {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok || info.StreamSerializer == nil {
		t.Fatal("no protobuf stream serializer")
	}
	var out bytes.Buffer
	enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&out), info.StreamSerializer.Serializer)
	for _, ev := range events {
		var obj bytes.Buffer
		if err := info.Serializer.Encode(ev.Object, &obj); err != nil {
			t.Fatal(err)
		}
		we := &metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: obj.Bytes()}}
		if err := enc.Encode(we); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func watchPod(name string) *corev1.Pod {
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
}

func bookmark(end bool) *corev1.Pod {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42"}}
	if end {
		p.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return p
}

func TestReadWatchFramesCountsTheAPIServersStream(t *testing.T) {
	stream := protobufWatchStream(t, []watch.Event{
		{Type: watch.Added, Object: watchPod("a")},
		{Type: watch.Added, Object: watchPod("b")},
		{Type: watch.Bookmark, Object: bookmark(false)},
		{Type: watch.Added, Object: watchPod("c")},
		{Type: watch.Bookmark, Object: bookmark(true)},
		{Type: watch.Modified, Object: watchPod("a")},
		{Type: watch.Modified, Object: watchPod("b")},
		{Type: watch.Deleted, Object: watchPod("c")},
		{Type: watch.Bookmark, Object: bookmark(true)}, // a second end closes nothing twice
	})
	w := newWatchCounts()
	if err := readWatchFrames(bytes.NewReader(stream), w); err != nil {
		t.Fatalf("readWatchFrames: %v", err)
	}
	if a, m, d := w.added.Load(), w.modified.Load(), w.deleted.Load(); a != 3 || m != 2 || d != 1 {
		t.Errorf("added, modified, deleted = %d, %d, %d; want 3, 2, 1", a, m, d)
	}
	if got := w.payload.Load(); got != int64(len(stream)) {
		t.Errorf("payload = %d bytes, want the stream's %d", got, len(stream))
	}
	select {
	case <-w.synced:
	default:
		t.Error("the bookmark ending the initial events did not mark the watch synced")
	}
}

func TestReadWatchFramesNotSyncedBeforeTheEndBookmark(t *testing.T) {
	stream := protobufWatchStream(t, []watch.Event{
		{Type: watch.Added, Object: watchPod("a")},
		{Type: watch.Bookmark, Object: bookmark(false)},
	})
	w := newWatchCounts()
	if err := readWatchFrames(bytes.NewReader(stream), w); err != nil {
		t.Fatalf("readWatchFrames: %v", err)
	}
	select {
	case <-w.synced:
		t.Error("synced by a bookmark without the initial-events-end annotation")
	default:
	}
}

func TestReadWatchFramesRefusesBrokenStreams(t *testing.T) {
	good := protobufWatchStream(t, []watch.Event{{Type: watch.Added, Object: watchPod("a")}})
	huge := binary.BigEndian.AppendUint32(nil, maxWatchFrame+1)
	garbage := append(binary.BigEndian.AppendUint32(nil, 3), 0xff, 0xff, 0xff)
	for name, stream := range map[string][]byte{
		"truncated frame":  good[:len(good)-1],
		"truncated length": good[:2],
		"oversized frame":  huge,
		"not a WatchEvent": garbage,
		"empty event":      binary.BigEndian.AppendUint32(nil, 0),
	} {
		w := newWatchCounts()
		if err := readWatchFrames(bytes.NewReader(stream), w); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSumMetric(t *testing.T) {
	text := strings.Join([]string{
		"# HELP go_memstats_alloc_bytes Number of bytes allocated and still in use.",
		"go_memstats_alloc_bytes 5e+07",
		"go_memstats_alloc_bytes_total 1.5e+09",
		`apiserver_watch_events_sizes_sum{group="",kind="Pod",version="v1"} 700`,
		`apiserver_watch_events_sizes_sum{group="discovery.k8s.io",kind="EndpointSlice",version="v1"} 300`,
	}, "\n")
	for name, want := range map[string]float64{
		"go_memstats_alloc_bytes_total":    1.5e9,
		"go_memstats_alloc_bytes":          5e7,
		"apiserver_watch_events_sizes_sum": 1000,
	} {
		got, err := sumMetric(text, name)
		if err != nil || got != want {
			t.Errorf("sumMetric(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := sumMetric(text, "go_memstats"); err == nil {
		t.Error("a metric name's prefix matched another metric")
	}
}

func TestFitLine(t *testing.T) {
	a, b, ok := fitLine([]float64{100, 250, 500, 1000}, []float64{3 + 0.02*100, 3 + 0.02*250, 3 + 0.02*500, 3 + 0.02*1000})
	if !ok || math.Abs(a-3) > 1e-9 || math.Abs(b-0.02) > 1e-12 {
		t.Errorf("fitLine = %v + %v x (%v), want 3 + 0.02 x", a, b, ok)
	}
	if _, _, ok := fitLine([]float64{5, 5}, []float64{1, 2}); ok {
		t.Error("a line through one x")
	}
}

// jsonWatchStream encodes events as the API server writes a JSON watch of
// a custom resource: one WatchEvent object after the other.
func jsonWatchStream(t *testing.T, events []watch.Event) []byte {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok || info.StreamSerializer == nil {
		t.Fatal("no JSON stream serializer")
	}
	var out bytes.Buffer
	enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&out), info.StreamSerializer.Serializer)
	for _, ev := range events {
		var obj bytes.Buffer
		if err := info.Serializer.Encode(ev.Object, &obj); err != nil {
			t.Fatal(err)
		}
		if err := enc.Encode(&metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: obj.Bytes()}}); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func TestReadJSONWatchCountsAndSyncs(t *testing.T) {
	stream := jsonWatchStream(t, []watch.Event{
		{Type: watch.Added, Object: watchPod("a")},
		{Type: watch.Bookmark, Object: bookmark(false)},
		{Type: watch.Added, Object: watchPod("b")},
		{Type: watch.Bookmark, Object: bookmark(true)},
		{Type: watch.Modified, Object: watchPod("a")},
		{Type: watch.Deleted, Object: watchPod("b")},
	})
	w := newWatchCounts()
	if err := readJSONWatch(bytes.NewReader(stream), w); err != nil {
		t.Fatalf("readJSONWatch: %v", err)
	}
	if a, m, d := w.added.Load(), w.modified.Load(), w.deleted.Load(); a != 2 || m != 1 || d != 1 {
		t.Errorf("added, modified, deleted = %d, %d, %d; want 2, 1, 1", a, m, d)
	}
	if got := w.payload.Load(); got != int64(len(stream)) {
		t.Errorf("payload = %d bytes, want the stream's %d", got, len(stream))
	}
	select {
	case <-w.synced:
	default:
		t.Error("the bookmark ending the initial events did not mark the watch synced")
	}
	early := newWatchCounts()
	if err := readJSONWatch(bytes.NewReader(jsonWatchStream(t, []watch.Event{{Type: watch.Bookmark, Object: bookmark(false)}})), early); err != nil {
		t.Fatalf("readJSONWatch: %v", err)
	}
	select {
	case <-early.synced:
		t.Error("synced by a bookmark without the initial-events-end annotation")
	default:
	}
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Message: "too old"}
	if err := readJSONWatch(bytes.NewReader(jsonWatchStream(t, []watch.Event{{Type: watch.Error, Object: status}})), newWatchCounts()); err == nil {
		t.Error("an ERROR event read as no error")
	}
}

func TestRetryableOnlyBeforeTheInitialEvents(t *testing.T) {
	w := newWatchCounts()
	failed := &watchErrorEvent{msg: "Too large resource version"}
	if !retryable(failed, w) {
		t.Error("a watch that failed before its initial events is not opened again")
	}
	if retryable(nil, w) {
		t.Error("a watch that ended without error is opened again")
	}
	close(w.synced)
	if retryable(failed, w) {
		t.Error("a watch that failed after its initial events is opened again: its losses would go unseen")
	}
}
