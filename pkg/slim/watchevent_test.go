package slim

import (
	"bytes"
	"io"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// protobufStream is the API's protobuf stream serializer (watch events).
func protobufStream(t testing.TB) *runtime.StreamSerializerInfo {
	t.Helper()
	for _, info := range podSerializers(scheme.Codecs.WithoutConversion()).SupportedMediaTypes() {
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

// TestEventDecoderInPlace: eventDecoder reads what the generated code
// reads from each event, and the object's bytes are those of the frame,
// not a copy of them.
func TestEventDecoderInPlace(t *testing.T) {
	for _, want := range wireEvents(t) {
		b, err := want.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var got metav1.WatchEvent
		obj, _, err := eventDecoder{}.Decode(b, nil, &got)
		if err != nil || obj != &got {
			t.Fatalf("Decode = %T, %v", obj, err)
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

// TestWatchStreamDecodesPods runs client-go's own watch decoding (frame
// reader, stream decoder, watch decoder) over a stream of the API's
// events with the pod client's serializers: each event arrives as the
// generated code would have decoded it, pods as stored forms, and an
// object decoded from a frame stays intact when the frame buffer is
// reused for the next events.
func TestWatchStreamDecodesPods(t *testing.T) {
	ss := protobufStream(t)
	evs := wireEvents(t)
	var stream bytes.Buffer
	fw := ss.Framer.NewFrameWriter(&stream)
	for i := range evs {
		if err := ss.Serializer.Encode(&evs[i], fw); err != nil {
			t.Fatal(err)
		}
	}
	objects := podSerializers(scheme.Codecs.WithoutConversion()).SupportedMediaTypes()
	var objDec runtime.Decoder
	for _, info := range objects {
		if info.MediaType == runtime.ContentTypeProtobuf {
			objDec = info.Serializer
		}
	}
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(ss.Framer.NewFrameReader(io.NopCloser(&stream)), ss.Serializer), objDec)
	var got []runtime.Object
	for range evs {
		typ, obj, err := dec.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if string(typ) != evs[len(got)].Type {
			t.Errorf("event %d: type %s, want %s", len(got), typ, evs[len(got)].Type)
		}
		got = append(got, obj)
	}
	if _, _, err := dec.Decode(); err != io.EOF {
		t.Errorf("after the last event: %v, want EOF", err)
	}
	// Every object, read after all frames went through the buffer.
	ser := protobufSerializer(t)
	for i, obj := range got {
		want, _, err := podDecoder{ser}.Decode(bytes.Clone(evs[i].Object.Raw), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := want.(*compile.PodInfo); !ok && evs[i].Type != string(watch.Error) {
			t.Fatalf("event %d: %T", i, want)
		}
		if diff := cmp.Diff(want, obj, podInfoCmp...); diff != "" {
			t.Errorf("event %d (-want +got):\n%s", i, diff)
		}
	}
}

// FuzzWatchEvent: whatever the bytes, eventDecoder does not panic, and
// where the generated code decodes them, eventDecoder reads the same type
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
