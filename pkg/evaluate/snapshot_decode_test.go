package evaluate

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// documentOf returns the document (what follows the checksum line) of the
// snapshot of input in with pods as its pods.
func documentOf(tb testing.TB, in compile.Input, pods []snapshotPod) []byte {
	tb.Helper()
	in.PodInfos, in.Pods = nil, nil
	for i := range pods {
		in.PodInfos = append(in.PodInfos, pods[i].info())
	}
	var w bytes.Buffer
	if _, err := encodeSnapshot(&w, "node-1", in); err != nil {
		tb.Fatal(err)
	}
	return w.Bytes()
}

// checkDecodeDoc fails tb unless decodeDoc reads doc as json.Unmarshal
// does (both fail, or both give the same document), and returns whether
// the fast reader took it.
func checkDecodeDoc(tb testing.TB, doc []byte) (fast bool) {
	tb.Helper()
	var want, got, fastDoc snapshotDoc
	werr := json.Unmarshal(doc, &want)
	gerr := decodeDoc(doc, &got)
	ferr := fastDecodeDoc(doc, &fastDoc)
	if (werr == nil) != (gerr == nil) {
		tb.Fatalf("document %.300q: encoding/json: %v, decodeDoc: %v, fast reader: %v", doc, werr, gerr, ferr)
	}
	if ferr == nil && werr != nil {
		tb.Fatalf("the fast reader took a document encoding/json rejects (%v): %.300q", werr, doc)
	}
	if werr != nil {
		return false
	}
	if !reflect.DeepEqual(got, want) {
		tb.Fatalf("decodeDoc and encoding/json differ on %.300q:\n%+v\n%+v", doc, got.Pods, want.Pods)
	}
	if ferr == nil && !reflect.DeepEqual(fastDoc, want) {
		tb.Fatalf("the fast reader and encoding/json differ on %.300q:\n%+v\n%+v", doc, fastDoc.Pods, want.Pods)
	}
	return ferr == nil
}

// TestDecodeDocMatchesEncodingJSON: decodeDoc reads the snapshots the
// agent writes (adversarial pods included) by its fast reader, exactly as
// encoding/json reads them, and every other form of the document through
// encoding/json.
func TestDecodeDocMatchesEncodingJSON(t *testing.T) {
	in := snapshotInput(100)
	in.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	pods := equivalencePods(false)
	for start := 0; start < len(pods); start += 37 {
		doc := documentOf(t, in, pods[start:min(start+37, len(pods))])
		if !checkDecodeDoc(t, doc) {
			t.Fatalf("the fast reader did not take the agent's own snapshot of pods %d...", start)
		}
	}
	// Years RFC 3339 cannot write: encoding/json's error, either way.
	far := equivalencePods(true)
	doc := documentOf(t, compile.Input{}, far[len(far)-600:])
	if checkDecodeDoc(t, doc) {
		t.Fatal("the fast reader took a time metav1.Time cannot read")
	}

	doc = documentOf(t, in, pods[len(pods)-50:])
	var d snapshotDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	compact, _ := json.Marshal(d)
	indented, _ := json.MarshalIndent(d, "", "  ")
	variants := map[string][]byte{
		"compact":        compact,
		"indented":       indented,
		"unknown field":  bytes.Replace(doc, []byte(`{"version"`), []byte(`{"extra":[1,{"a":"}"}],"version"`), 1),
		"repeated pods":  bytes.Replace(doc, []byte(`,"podCIDRs"`), []byte(`,"pods":[],"podCIDRs"`), 1),
		"Pods":           bytes.Replace(doc, []byte(`"pods"`), []byte(`"Pods"`), 1),
		"escaped key":    bytes.Replace(doc, []byte(`"pods"`), []byte(`"pod\u0073"`), 1),
		"null pods":      bytes.Replace(compact, []byte(`"pods":[`), []byte(`"pods":null,"x":[`), 1),
		"eligible false": inPods(doc, `"eligible":true`, `"eligible":false`),
		"empty labels":   inPods(doc, `"labels":{`, `"labels":{},"l":{`),
		"fraction":       inPods(doc, `Z"`, `.5+01:00"`),
		"space":          inPods(doc, `"name":`, `"name": `),
		"no port":        inPods(doc, `"ports":[`, `"ports":[],"p":[`),
		"leading zero":   inPods(doc, `"Port":`, `"Port":0`),
		"surrogate":      inPods(doc, `"name":"`, `"name":"\ud800`),
		"deleted null":   inPods(doc, `,"node"`, `,"deleted":null,"node"`),
		"trailing":       append(append([]byte(nil), doc...), '}'),
		"truncated":      doc[:len(doc)-2],
	}
	for name, v := range variants {
		if bytes.Equal(v, doc) {
			t.Fatalf("variant %q is the document itself", name)
		}
		fast := checkDecodeDoc(t, v)
		if fast != (name == "compact" || name == "escaped key" || name == "deleted null") {
			t.Errorf("variant %q: fast reader %v", name, fast)
		}
	}
}

// inPods replaces the first old after the document's field "pods".
func inPods(doc []byte, old, new string) []byte {
	at := bytes.Index(doc, []byte(`"pods"`))
	return append(doc[:at:at], bytes.Replace(doc[at:], []byte(old), []byte(new), 1)...)
}

// FuzzSnapshotDecoding: whatever the bytes, decodeDoc reads them as
// encoding/json does, and its fast reader takes nothing encoding/json
// would read otherwise.
func FuzzSnapshotDecoding(f *testing.F) {
	pods := equivalencePods(false)
	for start := 0; start < len(pods); start += 97 {
		f.Add(documentOf(f, compile.Input{}, pods[start:min(start+3, len(pods))]))
	}
	f.Add(documentOf(f, snapshotInput(2), nil))
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkDecodeDoc(t, doc)
	})
}
