package evaluate

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podJSON writes snapshotPods as encoding/json writes them, byte for byte,
// without its reflection: the pods are nearly all of a snapshot, and at
// 150,000 pods encoding/json spends close to half a second of CPU on them,
// right after the agent's first sync, which they then compete with. The
// file format, and so its checksum, is encoding/json's; the equivalence
// and fuzz tests hold the two together, and a field added to snapshotPod
// fails them until it is written here too.
type podJSON struct {
	keys []string // the labels' keys, sorted; reused from pod to pod
}

// appendPod appends sp's JSON, as json.Marshal would write it (HTML
// escaping on, json.Encoder's default; no trailing newline).
func (e *podJSON) appendPod(b []byte, sp *snapshotPod) []byte {
	b = append(b, `{"namespace":`...)
	b = appendJSONString(b, sp.Namespace)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, sp.Name)
	if len(sp.Labels) > 0 {
		b = append(b, `,"labels":`...)
		b = e.appendLabels(b, sp.Labels)
	}
	b = append(b, `,"created":`...)
	b = appendJSONTime(b, sp.CreationTimestamp)
	if sp.DeletionTimestamp != nil {
		b = append(b, `,"deleted":`...)
		b = appendJSONTime(b, *sp.DeletionTimestamp)
	}
	if sp.Node != "" {
		b = append(b, `,"node":`...)
		b = appendJSONString(b, sp.Node)
	}
	if sp.Eligible {
		b = append(b, `,"eligible":true`...)
	}
	if len(sp.IPs) > 0 {
		b = append(b, `,"ips":[`...)
		for i, a := range sp.IPs {
			if i > 0 {
				b = append(b, ',')
			}
			if a.Zone() != "" {
				// A zone is any string: escape it. Pods' addresses have none.
				b = appendJSONString(b, a.String())
				continue
			}
			// Digits, hex digits, dots and colons need no escaping; the zero
			// Addr's text is empty, as netip.Addr.MarshalText writes it.
			b = append(b, '"')
			b, _ = a.AppendText(b)
			b = append(b, '"')
		}
		b = append(b, ']')
	}
	if len(sp.Ports) > 0 {
		b = append(b, `,"ports":[`...)
		for i, p := range sp.Ports {
			if i > 0 {
				b = append(b, ',')
			}
			// compile.ContainerPort has no JSON tags: its Go field names.
			b = append(b, `{"Name":`...)
			b = appendJSONString(b, p.Name)
			b = append(b, `,"Protocol":`...)
			b = strconv.AppendUint(b, uint64(p.Protocol), 10)
			b = append(b, `,"Port":`...)
			b = strconv.AppendUint(b, uint64(p.Port), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendLabels appends a non-empty label map, its keys in encoding/json's
// order (byte-wise).
func (e *podJSON) appendLabels(b []byte, labels map[string]string) []byte {
	e.keys = e.keys[:0]
	for k := range labels {
		e.keys = append(e.keys, k)
	}
	slices.Sort(e.keys)
	b = append(b, '{')
	for i, k := range e.keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, labels[k])
	}
	clear(e.keys) // hold no pod's strings past its encoding
	return append(b, '}')
}

// appendJSONTime appends t as metav1.Time's MarshalJSON writes it: RFC 3339
// in UTC to the second, null for the zero time.
func appendJSONTime(b []byte, t metav1.Time) []byte {
	if t.IsZero() {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, time.RFC3339)
	return append(b, '"')
}

// jsonPlain[c] tells whether encoding/json writes the ASCII byte c as it
// is, with its HTML escaping on: not control characters, the quote, the
// backslash, nor <, > and & (written \u003c, \u003e, \u0026, so that the
// text is safe to embed in HTML).
var jsonPlain = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

// jsonShortEscape holds the two-character escapes encoding/json uses for
// the ASCII bytes it escapes; the others are written \u00XX.
var jsonShortEscape = [utf8.RuneSelf]byte{'"': '"', '\\': '\\', '\b': 'b', '\f': 'f', '\n': 'n', '\r': 'r', '\t': 't'}

const lowerHex = "0123456789abcdef"

// appendJSONString appends s as a JSON string exactly as encoding/json
// writes it with HTML escaping on: an invalid UTF-8 byte becomes \ufffd,
// and U+2028 and U+2029 are escaped (JavaScript reads them as line ends).
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	done := 0 // s[:done] is in b
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonPlain[c] {
				i++
				continue
			}
			b = append(b, s[done:i]...)
			if e := jsonShortEscape[c]; e != 0 {
				b = append(b, '\\', e)
			} else {
				b = append(b, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xf])
			}
			i++
			done = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[done:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[done:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', lowerHex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		done = i
	}
	b = append(b, s[done:]...)
	return append(b, '"')
}
