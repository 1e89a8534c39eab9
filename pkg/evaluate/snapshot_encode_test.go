package evaluate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// realisticPodInfos returns n pods shaped as a deployment's replicas are:
// 3 or 4 labels, one address, one or two named ports, as the controller
// stores them (PodInfos).
func realisticPodInfos(n int) []*compile.PodInfo {
	created := metav1.NewTime(time.Date(2026, 11, 30, 8, 15, 0, 0, time.UTC))
	pods := make([]*compile.PodInfo, n)
	for i := range pods {
		app := fmt.Sprintf("app-%d", i/20)
		labels := map[string]string{
			"app.kubernetes.io/name": app,
			"pod-template-hash":      fmt.Sprintf("%x", 0x5d8f7c9b4+i/20),
			"tier":                   []string{"web", "api", "db"}[i%3],
		}
		if i%2 == 0 {
			labels["version"] = "v1.2.3"
		}
		ports := []compile.ContainerPort{{Name: "http", Protocol: compile.ProtoTCP, Port: 8080}}
		if i%2 == 1 {
			ports = append(ports, compile.ContainerPort{Name: "metrics", Protocol: compile.ProtoTCP, Port: 9090})
		}
		p := &compile.PodInfo{
			ResourceVersion: fmt.Sprint(100000 + i), Labels: labels, CreationTimestamp: created,
			Node: fmt.Sprintf("node-%d", i%50), Eligible: true,
			IPs:   []netip.Addr{netip.AddrFrom4([4]byte{10, byte(16 + i>>16), byte(i >> 8), byte(i)})},
			Ports: ports,
		}
		p.SetKey(fmt.Sprintf("ns-%04d", i/100), fmt.Sprintf("%s-5d8f7c9b4-%05x", app, i))
		pods[i] = p
	}
	return pods
}

// jsonOfPod is what encoding/json writes for sp through json.Encoder, as
// the snapshot's other items are written: the reference podJSON matches.
func jsonOfPod(tb testing.TB, sp *snapshotPod) []byte {
	tb.Helper()
	var w bytes.Buffer
	if err := json.NewEncoder(&w).Encode(sp); err != nil {
		tb.Fatal(err)
	}
	return w.Bytes()
}

// checkPodJSON fails tb unless podJSON writes sp as encoding/json does.
func checkPodJSON(tb testing.TB, e *podJSON, sp *snapshotPod) {
	tb.Helper()
	want := jsonOfPod(tb, sp)
	got := append(e.appendPod(nil, sp), '\n')
	if !bytes.Equal(got, want) {
		tb.Fatalf("pod %#v:\nencoding/json: %q\npodJSON:       %q", sp, want, got)
	}
}

// adversarialStrings holds every byte alone and all together, invalid
// UTF-8 (lone continuation and lead bytes, truncated, overlong, surrogate,
// beyond U+10FFFF), the characters escaped for HTML and JavaScript, and
// their neighbours, which are not.
func adversarialStrings() []string {
	all := make([]byte, 256)
	out := []string{"", "a", `"quoted" \back\slash/`, "<script>&amp;</script>", "\u2028\u2029", "x\u2027\u202ay",
		"\x7f\x80\xbf\xc0\xaf", "\xc3", "\xc3\xa9", "\xe2\x80", "\xe2\x80\xa8", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"\xf0\x9f\x98\x80", "\xff\xfe", "\ufffd", "\x00\x01\x1f\b\f\n\r\t", "app.kubernetes.io/name", "ключ", "値"}
	for i := range all {
		all[i] = byte(i)
		out = append(out, string(rune(i)), string([]byte{byte(i)}), "a"+string([]byte{byte(i)})+"b")
	}
	return append(out, string(all))
}

// equivalencePods are the pods the encoding and decoding equivalence
// tests check: adversarial strings, empty and nil fields, zones, times
// (but for the years RFC 3339 cannot write when far is false), and
// realistic pods.
func equivalencePods(far bool) []snapshotPod {
	var out []snapshotPod
	strs := adversarialStrings()
	utc := time.Date(2026, 3, 1, 23, 59, 58, 999999999, time.UTC)
	zoned := time.Date(2025, 12, 31, 22, 30, 1, 123456789, time.FixedZone("far", 14*3600-30*60))
	times := []metav1.Time{{}, metav1.NewTime(utc), metav1.NewTime(zoned), metav1.NewTime(utc.In(time.Local)),
		metav1.NewTime(time.Unix(0, 0)), metav1.NewTime(time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC))}
	if far {
		times = append(times, metav1.NewTime(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)),
			metav1.NewTime(time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)))
	}
	addrs := [][]netip.Addr{nil, {}, {{}}, {netip.MustParseAddr("10.1.2.3")}, {netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("2001:db8::1")},
		{netip.MustParseAddr("::ffff:10.1.2.3"), netip.MustParseAddr("fe80::1%eth0")}, {netip.MustParseAddr("fe80::ff%e<&\u2028")},
		{netip.MustParseAddr("fe80::1").WithZone("\xff\x00\"")}}
	ports := [][]compile.ContainerPort{nil, {}, {{}}, {{Name: "http", Protocol: compile.ProtoTCP, Port: 8080}},
		{{Name: "<&>", Protocol: 255, Port: 65535}, {Protocol: compile.ProtoSCTP, Port: 1}, {Name: "\xff", Protocol: compile.ProtoUDP}}}
	for i, s := range strs {
		labels := map[string]string{s: s, "a": s, "a\x00": "", "ab": "\x80", "\u00e9": "<", "A": "&"}
		out = append(out, snapshotPod{Namespace: s, Name: s, Labels: labels, Node: s, Eligible: i%2 == 0,
			CreationTimestamp: times[i%len(times)], IPs: addrs[i%len(addrs)],
			Ports: []compile.ContainerPort{{Name: s, Protocol: compile.Protocol(i), Port: uint16(i * 257)}}})
	}
	// Keys that are invalid UTF-8 are written \ufffd: the last of them wins
	// when they are read.
	for _, labels := range []map[string]string{nil, {}, {"": ""}, {"z": "1", "a": "2", "m": "3", "\xff": "4", "\x00": "5", "~": "6"},
		{"\xff": "1", "\xfe": "2", "\ufffd": "3", "\xc3": "4"}} {
		for _, created := range times {
			for di, deleted := range append([]*metav1.Time{nil}, ptrs(times)...) {
				for pi, ps := range ports {
					out = append(out, snapshotPod{Namespace: "ns", Name: "pod", Labels: labels,
						CreationTimestamp: created, DeletionTimestamp: deleted, Node: []string{"", "node-1"}[di%2],
						Eligible: pi%2 == 1, IPs: addrs[(di+pi)%len(addrs)], Ports: ps})
				}
			}
		}
	}
	for _, p := range realisticPodInfos(500) {
		out = append(out, leanPod(p))
	}
	return out
}

// TestPodJSONMatchesEncodingJSON: podJSON writes every pod as encoding/json
// does, so the snapshot's bytes (and checksum) are what they were.
func TestPodJSONMatchesEncodingJSON(t *testing.T) {
	var e podJSON // one encoder for all: reuse must not leak between pods
	for _, sp := range equivalencePods(true) {
		checkPodJSON(t, &e, &sp)
	}
}

func ptrs[T any](vs []T) []*T {
	out := make([]*T, len(vs))
	for i := range vs {
		out[i] = &vs[i]
	}
	return out
}

// TestPodJSONKnowsEveryField: podJSON writes snapshotPod's fields by
// name; a field added to snapshotPod must be added to it (and to the
// equivalence tests' pods) too.
func TestPodJSONKnowsEveryField(t *testing.T) {
	var got []string
	tp := reflect.TypeFor[snapshotPod]()
	for i := range tp.NumField() {
		got = append(got, tp.Field(i).Tag.Get("json"))
	}
	want := []string{"namespace", "name", "labels,omitempty", "created", "deleted,omitempty", "node,omitempty",
		"eligible,omitempty", "ips,omitempty", "ports,omitempty"}
	if !slices.Equal(got, want) {
		t.Fatalf("snapshotPod's fields are %q, podJSON writes %q: update podJSON.appendPod", got, want)
	}
	if n := reflect.TypeFor[compile.ContainerPort]().NumField(); n != 3 {
		t.Fatalf("compile.ContainerPort has %d fields, podJSON writes 3: update podJSON.appendPod", n)
	}
}

// TestWritePodsMatchesEncoder: the pods array, its separators and newlines
// and the batches it is written in, is what json.Encoder wrote item by
// item, for pods as PodInfos and as Pods together.
func TestWritePodsMatchesEncoder(t *testing.T) {
	in := snapshotInput(300)
	in.PodInfos = realisticPodInfos(700) // more than a batch
	in.Pods = append(in.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x<", Name: "\u2028\xff"}})
	var want bytes.Buffer
	ref := docWriter{w: &want, enc: json.NewEncoder(&want)}
	ref.key("pods")
	ref.raw("[")
	for i, p := range in.PodInfos {
		sp := leanPod(p)
		ref.item(i, &sp)
	}
	for i, p := range in.Pods {
		sp := leanPod(compile.NewPodInfo(p))
		ref.item(len(in.PodInfos)+i, &sp)
	}
	ref.raw("]")
	var got bytes.Buffer
	d := docWriter{w: &got, enc: json.NewEncoder(&got)}
	writePods(&d, in)
	if d.err != nil || ref.err != nil {
		t.Fatal(d.err, ref.err)
	}
	if want.Len() < 2*podBatch || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("writePods wrote %d bytes, json.Encoder %d; equal: %v", got.Len(), want.Len(), bytes.Equal(got.Bytes(), want.Bytes()))
	}
	var none bytes.Buffer
	writePods(&docWriter{w: &none}, compile.Input{})
	if none.Len() != 0 {
		t.Errorf("no pods: wrote %q, want nothing (omitempty)", none.Bytes())
	}
}

// FuzzSnapshotPodEncoding: podJSON writes any pod as encoding/json does.
func FuzzSnapshotPodEncoding(f *testing.F) {
	for i, s := range adversarialStrings()[:40] {
		f.Add(s, "pod-"+s, s, s+"v", "node", int64(i)*1e15, uint32(i*7919), int32(i*3600-43200), uint8(i), []byte{10, 0, 0, byte(i)}, s, uint16(i), true)
	}
	f.Add("", "", "", "", "", int64(0), uint32(0), int32(0), uint8(0), []byte(nil), "", uint16(0), false)
	f.Add("ns", "a", "<", "&", "n", int64(-62135596800), uint32(1), int32(-1), uint8(255),
		[]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "eth0", uint16(65535), true)
	var e podJSON
	f.Fuzz(func(t *testing.T, ns, name, key, value, node string, sec int64, nsec uint32, offset int32,
		shape uint8, ip []byte, zone string, port uint16, eligible bool) {
		ct := metav1.NewTime(time.Unix(sec, int64(nsec%1e9)).In(time.FixedZone("z", int(offset%(100*3600)))))
		if shape&1 == 1 {
			ct = metav1.Time{}
		}
		sp := snapshotPod{Namespace: ns, Name: name, CreationTimestamp: ct, Node: node, Eligible: eligible}
		if shape&2 == 2 {
			sp.Labels = map[string]string{key: value, value: key, key + value: ""}
		}
		switch shape >> 2 & 3 {
		case 1:
			sp.DeletionTimestamp = &metav1.Time{}
		case 2:
			sp.DeletionTimestamp = &ct
		case 3:
			dt := metav1.NewTime(time.Unix(-sec, int64(nsec)))
			sp.DeletionTimestamp = &dt
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			if a.Is6() && zone != "" {
				a = a.WithZone(zone)
			}
			sp.IPs = []netip.Addr{a, a.Unmap()}
		} else if len(ip) == 1 {
			sp.IPs = []netip.Addr{{}}
		}
		if shape&16 == 16 {
			sp.Ports = []compile.ContainerPort{{Name: zone, Protocol: compile.Protocol(shape), Port: port}, {}}
		}
		checkPodJSON(t, &e, &sp)
	})
}

// BenchmarkEncodeSnapshot measures encoding (and hashing) the snapshot of
// a node's input of 10,000 pods, the part of a snapshot that grows with
// the cluster.
func BenchmarkEncodeSnapshot(b *testing.B) {
	in := compile.Input{NodeName: "node-1", PodInfos: realisticPodInfos(10000)}
	var doc bytes.Buffer
	if _, err := encodeSnapshot(&doc, "node-1", in); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeSnapshot(io.Discard, "node-1", in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(doc.Len()), "bytes")
}

// BenchmarkDecodeSnapshot measures decoding (checksum, JSON, addresses)
// the snapshot of a node's input of 150,000 pods, what a restarted agent
// reads before it binds its queues; rebuilding the program is Build's.
func BenchmarkDecodeSnapshot(b *testing.B) {
	body := snapshotBytes(b, compile.Input{NodeName: "node-1", PodInfos: realisticPodInfos(150000)})
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeSnapshot("node-1", body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(body)), "bytes")
}
