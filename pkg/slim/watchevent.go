package slim

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Watch events from the wire. A protobuf watch stream is a sequence of
// length-prefixed metav1.WatchEvent messages, each carrying its object's
// bytes. The generated Unmarshal copies those bytes into the event (a
// pod's worth of garbage per event, every pod of the cluster when the
// agent starts) only for the object to be decoded from the copy and
// dropped. readWatchEvent reads the event in place instead: the object's
// bytes alias the EventReader's frame buffer, which holds them until the
// next event is read, after the object was decoded (and the pod decoder
// copies what it keeps).

// readWatchEvent reads a WatchEvent message into ev, its object's bytes
// not copied.
func readWatchEvent(b []byte, ev *v1.WatchEvent) error {
	*ev = v1.WatchEvent{}
	p := pb{b: b, msg: "WatchEvent"}
	for p.next() {
		switch p.f {
		case 1:
			ev.Type = eventType(p.sub())
		case 2:
			// A repeated message field merges, as the generated code
			// decodes it: an object without its raw bytes keeps the
			// earlier one's.
			raw, found, err := readRawExtension(p.sub())
			p.fail(err)
			if found {
				ev.Object.Raw = raw
			}
		default:
			p.skipField()
		}
	}
	return p.err
}

// readRawExtension reads a RawExtension message's bytes, not copied;
// found says the message had them.
func readRawExtension(b []byte) (raw []byte, found bool, err error) {
	p := pb{b: b, msg: "RawExtension"}
	for p.next() {
		if p.f == 1 {
			raw, found = p.sub(), true
		} else {
			p.skipField()
		}
	}
	return raw, found, p.err
}

// eventType returns the event type b spells, without allocating for the
// types the API sends.
func eventType(b []byte) string {
	for _, t := range [...]watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Bookmark, watch.Error} {
		if string(b) == string(t) {
			return string(t)
		}
	}
	return string(b)
}
