package slim

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// EventReader reads the response of a pod watch, one event at a time, in
// the goroutine that asks: each pod straight into its stored form. The
// response is protobuf (a 4-byte big-endian length before each
// metav1.WatchEvent message) or JSON (one object per event), told apart by
// its first byte ('{' would be a length of two gigabytes).
//
// client-go's watch decodes each event in a goroutine of its own and hands
// it over a channel: a wake-up per event, every pod of the cluster when
// the agent starts. Reading in place of the consumer costs none.
type EventReader struct {
	body io.ReadCloser
	r    *bufio.Reader
	// js is the JSON decoder, once the response turned out to be JSON.
	js *json.Decoder
	// frame is the protobuf frame buffer, reused.
	frame []byte
}

// maxFrame bounds one event: the API server stores objects of at most
// 1.5 MiB (etcd's default request limit), and sends them as stored.
const maxFrame = 16 << 20

// NewEventReader reads the watch response body.
func NewEventReader(body io.ReadCloser) *EventReader {
	return &EventReader{body: body, r: bufio.NewReaderSize(body, 64<<10)}
}

// Next returns the next event: its type and pod (a bookmark's pod has no
// name; the one ending the initial events keeps its annotation). An ERROR
// event is returned as the API error it carries; io.EOF is a clean end.
func (e *EventReader) Next() (watch.EventType, *compile.PodInfo, error) {
	if e.js == nil {
		first, err := e.r.Peek(1)
		if err != nil {
			return "", nil, err
		}
		if first[0] == '{' {
			e.js = json.NewDecoder(e.r)
		}
	}
	if e.js != nil {
		return e.nextJSON()
	}
	return e.nextProtobuf()
}

// Close ends the watch; a Next waiting for data returns.
func (e *EventReader) Close() error { return e.body.Close() }

func (e *EventReader) nextProtobuf() (watch.EventType, *compile.PodInfo, error) {
	var n [4]byte
	if _, err := io.ReadFull(e.r, n[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return "", nil, fmt.Errorf("pod watch: a frame's length cut short: %w", err)
		}
		return "", nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxFrame {
		return "", nil, fmt.Errorf("pod watch: a frame of %d bytes (at most %d)", size, maxFrame)
	}
	if cap(e.frame) < int(size) {
		e.frame = make([]byte, size)
	}
	frame := e.frame[:size]
	if _, err := io.ReadFull(e.r, frame); err != nil {
		return "", nil, fmt.Errorf("pod watch: a frame cut short: %w", err)
	}
	return decodeEvent(frame)
}

// decodeEvent reads one protobuf WatchEvent message.
func decodeEvent(frame []byte) (watch.EventType, *compile.PodInfo, error) {
	var ev metav1.WatchEvent
	if err := readWatchEvent(frame, &ev); err != nil {
		return "", nil, err
	}
	apiVersion, kind, raw, err := unwrap(ev.Object.Raw)
	if err != nil {
		return "", nil, err
	}
	typ := watch.EventType(ev.Type)
	switch {
	case typ == watch.Error && kind == "Status":
		var s metav1.Status
		if err := s.Unmarshal(raw); err != nil {
			return "", nil, fmt.Errorf("pod watch: an ERROR event's Status: %w", err)
		}
		return typ, nil, apierrors.FromObject(&s)
	case typ != watch.Error && apiVersion == "v1" && kind == "Pod":
		pod, err := decodePod(raw)
		return typ, pod, err
	}
	return "", nil, fmt.Errorf("pod watch: a %s event carrying %s %s", typ, apiVersion, kind)
}

func (e *EventReader) nextJSON() (watch.EventType, *compile.PodInfo, error) {
	var ev struct {
		Type   watch.EventType `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := e.js.Decode(&ev); err != nil {
		return "", nil, err
	}
	if ev.Type == watch.Error {
		var s metav1.Status
		if err := json.Unmarshal(ev.Object, &s); err != nil {
			return "", nil, fmt.Errorf("pod watch: an ERROR event's Status: %w", err)
		}
		return ev.Type, nil, apierrors.FromObject(&s)
	}
	var p corev1.Pod
	if err := json.Unmarshal(ev.Object, &p); err != nil {
		return "", nil, fmt.Errorf("pod watch: a %s event's pod: %w", ev.Type, err)
	}
	if p.APIVersion != "v1" || p.Kind != "Pod" {
		return "", nil, fmt.Errorf("pod watch: a %s event carrying %s %s", ev.Type, p.APIVersion, p.Kind)
	}
	return ev.Type, podEvent(&p, p.Annotations[metav1.InitialEventsAnnotationKey]), nil
}
