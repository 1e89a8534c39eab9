package slim

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// protobufStream is the API's protobuf stream serializer (watch events).
func protobufStream(t testing.TB) *runtime.StreamSerializerInfo {
	t.Helper()
	for _, info := range scheme.Codecs.WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeProtobuf {
			return info.StreamSerializer
		}
	}
	t.Fatal("no protobuf stream serializer")
	return nil
}

// wireEvents are watch events as the API server sends them: every pod of
// wirePods (the bookmark among them), a deletion, an error's Status.
func wireEvents(t testing.TB) []metav1.WatchEvent {
	ser := protobufSerializer(t)
	encode := func(obj runtime.Object) []byte {
		var buf bytes.Buffer
		if err := ser.Encode(obj, &buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	var evs []metav1.WatchEvent
	for i, p := range wirePods() {
		p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		typ := []watch.EventType{watch.Added, watch.Modified, watch.Deleted}[i%3]
		if p.Name == "" {
			typ = watch.Bookmark
		}
		evs = append(evs, metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: encode(p)}})
	}
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired}
	return append(evs, metav1.WatchEvent{Type: string(watch.Error), Object: runtime.RawExtension{Raw: encode(status)}})
}

// TestReadWatchEventInPlace: readWatchEvent reads what the generated code
// reads from each event, and the object's bytes are those of the frame,
// not a copy of them.
func TestReadWatchEventInPlace(t *testing.T) {
	for _, want := range wireEvents(t) {
		b, err := want.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var got metav1.WatchEvent
		if err := readWatchEvent(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Type != want.Type || !bytes.Equal(got.Object.Raw, want.Object.Raw) {
			t.Errorf("decoded %s event of %d bytes, want %s of %d", got.Type, len(got.Object.Raw), want.Type, len(want.Object.Raw))
		}
		start, end := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(got.Object.Raw))); p < start || p >= end {
			t.Errorf("%s event: the object's bytes were copied out of the frame", got.Type)
		}
	}
}

// TestEventReaderDecodesPods reads a protobuf stream of the API's events
// (framed by the API's own stream serializer) with an EventReader: each
// event's type, its pod as decodePod stores it from the same bytes (an
// object decoded from a frame stays intact when the frame buffer is
// reused for the next events), the ERROR event as the API error it
// carries, then the end.
func TestEventReaderDecodesPods(t *testing.T) {
	ss := protobufStream(t)
	evs := wireEvents(t)
	var stream bytes.Buffer
	fw := ss.Framer.NewFrameWriter(&stream)
	for i := range evs {
		if err := ss.Serializer.Encode(&evs[i], fw); err != nil {
			t.Fatal(err)
		}
	}
	r := NewEventReader(io.NopCloser(&stream))
	var got []*compile.PodInfo
	for i := range evs[:len(evs)-1] {
		typ, pod, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if string(typ) != evs[i].Type {
			t.Errorf("event %d: type %s, want %s", i, typ, evs[i].Type)
		}
		got = append(got, pod)
	}
	if typ, _, err := r.Next(); typ != watch.Error || !apierrors.IsResourceExpired(err) {
		t.Errorf("the ERROR event: %s, %v; want the Status's error (expired)", typ, err)
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Errorf("after the last event: %v, want EOF", err)
	}
	for i, pod := range got {
		_, _, raw, err := unwrap(evs[i].Object.Raw)
		if err != nil {
			t.Fatal(err)
		}
		want, err := decodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, pod, podInfoCmp...); diff != "" {
			t.Errorf("event %d (-want +got):\n%s", i, diff)
		}
	}
}

// TestEventReaderRejects: a frame longer than any object, a frame cut
// short, and an event carrying something else than a pod are errors.
func TestEventReaderRejects(t *testing.T) {
	ev := wireEvents(t)[0]
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	frame := func(b []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...) }
	ns := &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	var nsBuf bytes.Buffer
	if err := protobufSerializer(t).Encode(ns, &nsBuf); err != nil {
		t.Fatal(err)
	}
	notPod, err := (&metav1.WatchEvent{Type: "ADDED", Object: runtime.RawExtension{Raw: nsBuf.Bytes()}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		stream     []byte
	}{
		// Refused from its length, before anything is read or allocated.
		{"too long", "at most", append(binary.BigEndian.AppendUint32(nil, maxFrame+1), b...)},
		{"cut short", "cut short", frame(b)[:len(b)/2]},
		{"namespace", "v1 Namespace", frame(notPod)},
	} {
		if _, _, err := NewEventReader(io.NopCloser(bytes.NewReader(tc.stream))).Next(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// FuzzWatchEvent: whatever the bytes, readWatchEvent does not panic, and
// where the generated code decodes them, it reads the same type
// and object bytes.
func FuzzWatchEvent(f *testing.F) {
	for _, ev := range wireEvents(f)[:6] {
		b, err := ev.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got metav1.WatchEvent
		err := readWatchEvent(b, &got)
		var want metav1.WatchEvent
		if want.Unmarshal(b) != nil {
			return
		}
		if err != nil {
			t.Fatalf("generated code decodes %x, readWatchEvent fails: %v", b, err)
		}
		if got.Type != want.Type || !bytes.Equal(got.Object.Raw, want.Object.Raw) {
			t.Fatalf("%x: read %q %x, generated %q %x", b, got.Type, got.Object.Raw, want.Type, want.Object.Raw)
		}
	})
}

// FuzzEventReader: whatever a watch response holds, the reader returns
// events or an error, never panics, and ends (each call consumes input).
func FuzzEventReader(f *testing.F) {
	var stream bytes.Buffer
	ss := protobufStream(f)
	fw := ss.Framer.NewFrameWriter(&stream)
	for _, ev := range wireEvents(f)[:4] {
		if err := ss.Serializer.Encode(&ev, fw); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(stream.Bytes())
	f.Add([]byte(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"b"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewEventReader(io.NopCloser(bytes.NewReader(b)))
		for range len(b) + 1 {
			if _, _, err := r.Next(); err != nil {
				return
			}
		}
		t.Fatalf("%d bytes read as more than %d events", len(b), len(b))
	})
}
