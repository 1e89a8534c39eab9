package evaluate

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// A restarted agent decodes its snapshot before it binds its queues, and
// encoding/json, decoding a large cluster's pods by reflection, takes most
// of a second over it. decodeDoc reads the document in the form
// encodeSnapshot writes: the pods (podJSON's form) by hand, each other
// field by encoding/json on its own. Anything else (an unknown or repeated
// field, a form the writer never uses) sends the whole document to
// encoding/json instead. Either way the result is encoding/json's: the
// decoding equivalence and fuzz tests hold the two together.

// errNotCanonical: the document is not in encodeSnapshot's form.
var errNotCanonical = errors.New("snapshot not in its writer's form")

// decodeDoc decodes a snapshot's document into d, as json.Unmarshal does.
func decodeDoc(b []byte, d *snapshotDoc) error {
	if fastDecodeDoc(b, d) == nil {
		return nil
	}
	*d = snapshotDoc{}
	return json.Unmarshal(b, d)
}

// fastDecodeDoc decodes the document if it is in encodeSnapshot's form:
// the pods by docReader, each other field by encoding/json on its own.
func fastDecodeDoc(b []byte, d *snapshotDoc) error {
	r := docReader{b: b}
	r.ws()
	r.byte('{')
	fields, pods := d.fields(), false // each taken once: a repeated field is not the writer's
	for r.err == nil {
		r.ws()
		key := r.str(false)
		r.ws()
		r.byte(':')
		r.ws()
		f, ok := fields[key]
		delete(fields, key)
		if r.err != nil {
			return errNotCanonical
		}
		if key == "pods" && !pods {
			pods = true
			d.Pods = r.pods()
		} else if ok {
			start := r.i
			r.skipValue()
			if r.err == nil && json.Unmarshal(b[start:r.i], f) != nil {
				return errNotCanonical
			}
		} else {
			return errNotCanonical
		}
		r.ws()
		if r.has("}") {
			break
		}
		r.byte(',')
	}
	r.ws()
	if r.err != nil || r.i != len(b) {
		return errNotCanonical
	}
	return nil
}

// fields maps the document's JSON field names but "pods" to its fields.
func (d *snapshotDoc) fields() map[string]any {
	return map[string]any{"version": &d.Version, "node": &d.Node, "written": &d.Written, "nodeIPs": &d.NodeIPs,
		"namespaces": &d.Namespaces, "podCIDRs": &d.PodCIDRs, "policies": &d.Policies,
		"clusterPolicies": &d.ClusterPolicies, "nodes": &d.Nodes}
}

// docReader reads a snapshot's document; the first error sticks, and
// every read after it is a no-op.
type docReader struct {
	b   []byte
	i   int
	err error
	// intern holds one copy of the strings many pods repeat (namespaces,
	// label keys and values, nodes, port names), bounded.
	intern  map[string]string
	scratch []byte
	labels  []string
}

// maxInterned bounds docReader.intern: past it, strings are copied.
const maxInterned = 1 << 14

func (r *docReader) fail() { r.err, r.i = errNotCanonical, len(r.b) }

func (r *docReader) ws() {
	for r.i < len(r.b) && (r.b[r.i] == ' ' || r.b[r.i] == '\n' || r.b[r.i] == '\t' || r.b[r.i] == '\r') {
		r.i++
	}
}

// has consumes lit if the input continues with it.
func (r *docReader) has(lit string) bool {
	if r.err == nil && len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
		r.i += len(lit)
		return true
	}
	return false
}

// lit consumes lit, which must follow.
func (r *docReader) lit(lit string) {
	if !r.has(lit) {
		r.fail()
	}
}

func (r *docReader) byte(c byte) {
	if r.err == nil && r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return
	}
	r.fail()
}

// skipValue moves past one JSON value, which encoding/json then checks.
func (r *docReader) skipValue() {
	depth := 0
	for r.err == nil && r.i < len(r.b) {
		switch c := r.b[r.i]; c {
		case '"':
			r.rawStr()
		case '{', '[':
			depth++
			r.i++
		case '}', ']':
			if depth == 0 {
				return
			}
			depth--
			r.i++
		case ',', ' ', '\n', '\t', '\r':
			if depth == 0 {
				return
			}
			r.i++
		default:
			r.i++
		}
	}
}

// rawStr moves past a JSON string and returns its contents, escapes and
// all, and whether there are escapes (or bytes past ASCII) in it.
func (r *docReader) rawStr() (raw []byte, plain bool) {
	r.byte('"')
	start, plain := r.i, true
	for r.err == nil {
		if r.i >= len(r.b) {
			r.fail()
			break
		}
		switch c := r.b[r.i]; {
		case c == '"':
			r.i++
			return r.b[start : r.i-1], plain
		case c == '\\':
			plain = false
			r.i += 2
		case c >= utf8.RuneSelf:
			plain = false
			r.i++
		case c < ' ':
			r.fail() // JSON has no raw control characters in strings
		default:
			r.i++
		}
	}
	return nil, false
}

// strBytes reads a JSON string and returns its value, valid only until
// the next read: it may be r's scratch buffer. Escapes of UTF-16
// surrogates and invalid UTF-8, which encoding/json reads as U+FFFD and
// podJSON never writes, are errors.
func (r *docReader) strBytes() []byte {
	raw, plain := r.rawStr()
	if plain || r.err != nil {
		return raw
	}
	out := r.scratch[:0]
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c >= utf8.RuneSelf:
			ru, size := utf8.DecodeRune(raw[i:])
			if ru == utf8.RuneError && size == 1 {
				r.fail()
				return nil
			}
			out = append(out, raw[i:i+size]...)
			i += size
			continue
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(raw) {
			r.fail()
			return nil
		}
		switch e := raw[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			ru, ok := hex4(raw[i+2:])
			if !ok || utf16.IsSurrogate(ru) {
				r.fail()
				return nil
			}
			out = utf8.AppendRune(out, ru)
			i += 4
		default:
			r.fail()
			return nil
		}
		i += 2
	}
	r.scratch = out
	return out
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var ru rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		ru = ru<<4 | rune(c)
	}
	return ru, true
}

// str reads a JSON string; intern: one copy for all equal strings.
func (r *docReader) str(intern bool) string {
	b := r.strBytes()
	if !intern || r.err != nil {
		return string(b)
	}
	if s, ok := r.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	if r.intern == nil {
		r.intern = make(map[string]string)
	}
	if len(r.intern) < maxInterned {
		r.intern[s] = s
	}
	return s
}

// uint reads a decimal number of at most max, in JSON's form (no leading
// zeros).
func (r *docReader) uint(max uint64) uint64 {
	start, n := r.i, uint64(0)
	for r.err == nil && r.i < len(r.b) && '0' <= r.b[r.i] && r.b[r.i] <= '9' {
		if n = n*10 + uint64(r.b[r.i]-'0'); n > max {
			r.fail()
		}
		r.i++
	}
	if r.err == nil && (r.i == start || r.b[start] == '0' && r.i-start > 1) {
		r.fail()
	}
	return n
}

// time reads a metav1.Time as its UnmarshalJSON does (in the local
// zone), null or in the form its MarshalJSON writes: RFC 3339 in UTC to
// the second.
func (r *docReader) time() metav1.Time {
	if r.has("null") {
		return metav1.Time{}
	}
	raw, plain := r.rawStr()
	if !plain || len(raw) != len("2006-01-02T15:04:05Z") || raw[4] != '-' || raw[7] != '-' || raw[10] != 'T' ||
		raw[13] != ':' || raw[16] != ':' || raw[19] != 'Z' {
		r.fail()
		return metav1.Time{}
	}
	num := func(from, to int) int {
		n := 0
		for _, c := range raw[from:to] {
			if c < '0' || c > '9' {
				r.fail()
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	y, mo, d, h, mi, s := num(0, 4), time.Month(num(5, 7)), num(8, 10), num(11, 13), num(14, 16), num(17, 19)
	t := time.Date(y, mo, d, h, mi, s, 0, time.UTC)
	if r.err != nil || mo < 1 || mo > 12 || d < 1 || t.Day() != d || h > 23 || mi > 59 || s > 59 {
		r.fail()
		return metav1.Time{}
	}
	return metav1.NewTime(t.Local())
}

// minPodJSON is the length of the shortest pod podJSON writes, with the
// newline and comma after it.
const minPodJSON = len(`{"namespace":"","name":"","created":null}` + "\n,")

// pods reads the pods array, in podJSON's form.
func (r *docReader) pods() []snapshotPod {
	r.byte('[')
	// Each pod ends a line (so do the document's other items): the lines
	// left bound the pods, and so does the shortest pod.
	rest := r.b[r.i:]
	pods := make([]snapshotPod, 0, min(bytes.Count(rest, []byte{'\n'}), len(rest)/minPodJSON)+1)
	for r.err == nil {
		r.ws()
		pods = append(pods, snapshotPod{})
		r.pod(&pods[len(pods)-1])
		r.ws()
		if r.has("]") {
			break
		}
		r.byte(',')
	}
	return pods
}

// pod reads a pod as podJSON writes it: its fields in order, the optional
// ones absent when empty.
func (r *docReader) pod(sp *snapshotPod) {
	r.lit(`{"namespace":`)
	sp.Namespace = r.str(true)
	r.lit(`,"name":`)
	sp.Name = r.str(false)
	if r.has(`,"labels":`) {
		sp.Labels = r.labelMap()
	}
	r.lit(`,"created":`)
	sp.CreationTimestamp = r.time()
	if r.has(`,"deleted":`) && !r.has("null") {
		t := r.time()
		sp.DeletionTimestamp = &t
	}
	if r.has(`,"node":`) {
		sp.Node = r.str(true)
	}
	sp.Eligible = r.has(`,"eligible":true`)
	if r.has(`,"ips":[`) {
		for r.err == nil {
			var a netip.Addr
			if s := r.strBytes(); len(s) > 0 && r.err == nil {
				var err error
				if a, err = netip.ParseAddr(string(s)); err != nil {
					r.fail()
				}
			}
			sp.IPs = append(sp.IPs, a)
			if r.has("]") {
				break
			}
			r.byte(',')
		}
	}
	if r.has(`,"ports":[`) {
		sp.Ports = r.ports()
	}
	r.byte('}')
}

// labelMap reads a non-empty label map. Keys are set in the document's
// order, the last of equal keys winning, as encoding/json sets them (keys
// podJSON wrote as \ufffd can repeat).
func (r *docReader) labelMap() map[string]string {
	r.byte('{')
	kv := r.labels[:0]
	for r.err == nil {
		k := r.str(true)
		r.byte(':')
		v := r.str(true)
		kv = append(kv, k, v)
		if r.has("}") {
			break
		}
		r.byte(',')
	}
	r.labels = kv
	defer clear(kv)
	if r.err != nil {
		return nil
	}
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// ports reads a non-empty list of compile.ContainerPorts.
func (r *docReader) ports() []compile.ContainerPort {
	var out []compile.ContainerPort
	for r.err == nil {
		var p compile.ContainerPort
		r.lit(`{"Name":`)
		p.Name = r.str(true)
		r.lit(`,"Protocol":`)
		p.Protocol = compile.Protocol(r.uint(255))
		r.lit(`,"Port":`)
		p.Port = uint16(r.uint(65535))
		r.byte('}')
		out = append(out, p)
		if r.has("]") {
			break
		}
		r.byte(',')
	}
	return out
}
