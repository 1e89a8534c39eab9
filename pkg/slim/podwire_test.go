package slim

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// protobufSerializer is the API's own protobuf serializer (what the API
// server encodes with and client-go decodes with).
func protobufSerializer(t testing.TB) runtime.Serializer {
	t.Helper()
	for _, info := range scheme.Codecs.SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeProtobuf {
			return info.Serializer
		}
	}
	t.Fatal("no protobuf serializer")
	return nil
}

// wirePods are pods as an API server returns them, in the shapes the
// compiler distinguishes: fat ones (managed fields, statuses, sidecars),
// dual-stack, host-network, terminal, being deleted, without an address,
// with an address only in podIP, unlabelled, and a watch bookmark.
func wirePods() []*corev1.Pod {
	in := compiletest.Cluster(60, 10, 3)
	var out []*corev1.Pod
	del := metav1.NewTime(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	for i, p := range in.Pods {
		p = fatPod(p, i)
		switch i % 9 {
		case 1:
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00::%x", i+1)})
		case 2:
			p.Spec.HostNetwork = true
		case 3:
			p.Status.Phase = corev1.PodSucceeded
		case 4:
			p.DeletionTimestamp = &del
		case 5:
			p.Status.PodIPs, p.Status.PodIP = nil, ""
		case 6:
			p.Status.PodIP, p.Status.PodIPs = p.Status.PodIPs[0].IP, nil
		case 7:
			p.Labels = nil
		case 8:
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00::%x", i+1)}, p.Status.PodIPs[0]}
			p.Spec.Containers[0].Ports[0].Protocol = ""
		}
		out = append(out, p)
	}
	out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "12345",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	return out
}

var podInfoCmp = []cmp.Option{cmpopts.EquateComparable(netip.Addr{})}

// TestDecodePodEqualsTransform holds the two ways a pod reaches its stored
// form equal: the API's protobuf decoded into a corev1.Pod and then Pod
// (the informers' Transform), and decodePod from the same bytes.
func TestDecodePodEqualsTransform(t *testing.T) {
	ser := protobufSerializer(t)
	for _, p := range wirePods() {
		var buf bytes.Buffer
		p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		if err := ser.Encode(p, &buf); err != nil {
			t.Fatal(err)
		}
		std, _, err := ser.Decode(buf.Bytes(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		sp := std.(*corev1.Pod)
		want := podEvent(sp, sp.Annotations[metav1.InitialEventsAnnotationKey])
		apiVersion, kind, raw, err := unwrap(buf.Bytes())
		if err != nil || apiVersion != "v1" || kind != "Pod" {
			t.Fatalf("pod %s/%s: unwrapped %s %s, %v", p.Namespace, p.Name, apiVersion, kind, err)
		}
		got, err := decodePod(raw)
		if err != nil {
			t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
		}
		if diff := cmp.Diff(want, got, podInfoCmp...); diff != "" {
			t.Errorf("pod %s/%s: decodePod differs from Pod(decoded) (-Pod +decodePod):\n%s", p.Namespace, p.Name, diff)
		}
	}
}

// FuzzDecodePod: whatever the bytes, decodePod does not panic, and where
// the generated code decodes them, decodePod does too, to the same stored
// form. (It may accept more: it does not look inside the fields it skips.)
func FuzzDecodePod(f *testing.F) {
	for _, p := range wirePods()[:12] {
		b, err := p.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodePod(b)
		var p corev1.Pod
		if p.Unmarshal(b) != nil {
			return
		}
		want := podEvent(&p, p.Annotations[metav1.InitialEventsAnnotationKey])
		if err != nil {
			// The generated code checks a map entry's fields against the
			// end of the whole message, not of the entry, so it takes some
			// malformed bytes that decodePod refuses. decodePod must then
			// decode the well-formed encoding of what the generated code
			// read, to the same stored form.
			canon, merr := p.Marshal()
			if merr != nil {
				t.Fatalf("re-encoding %x: %v", b, merr)
			}
			if got, err = decodePod(canon); err != nil {
				t.Fatalf("generated code decodes %x, decodePod fails on it and on its re-encoding %x: %v", b, canon, err)
			}
		}
		if diff := cmp.Diff(want, got, podInfoCmp...); diff != "" {
			t.Fatalf("%x: (-generated +decodePod):\n%s", b, diff)
		}
	})
}

// BenchmarkDecodePod compares the two paths on a fat pod.
func BenchmarkDecodePod(b *testing.B) {
	ser := protobufSerializer(b)
	p := wirePods()[0]
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	var buf bytes.Buffer
	if err := ser.Encode(p, &buf); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	b.Run("generated+Pod", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			obj, _, err := ser.Decode(data, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			_ = Pod(obj.(*corev1.Pod))
		}
	})
	b.Run("decodePod", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _, raw, err := unwrap(data)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := decodePod(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecoderStringCacheBounded: label values are a namespace user's to
// choose, one new value a pod; the decoder's cache of repeated strings
// stays within maxCachedStrings whatever it reads, and what it decodes
// stays right after it is emptied.
func TestDecoderStringCacheBounded(t *testing.T) {
	s := &scratch{strs: strCache{}}
	for i := range 3 * maxCachedStrings {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%d", i),
			Labels: map[string]string{"app": "web", "unique": fmt.Sprintf("v%d", i)}}}
		raw, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		s.reset()
		if err := s.readPod(raw); err != nil {
			t.Fatal(err)
		}
		if got := s.pod.Labels["unique"]; got != fmt.Sprintf("v%d", i) || s.pod.Labels["app"] != "web" || s.pod.Namespace != "ns" {
			t.Fatalf("pod %d decoded as %s %v", i, s.pod.Namespace, s.pod.Labels)
		}
		if len(s.strs) > maxCachedStrings {
			t.Fatalf("after %d pods the cache holds %d strings, more than %d", i+1, len(s.strs), maxCachedStrings)
		}
	}
}
