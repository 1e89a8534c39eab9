package evaluate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// snapshotInput is a node's input with NetworkPolicies, ClusterNetworkPolicies
// (with a named port), node addresses and a Node.
func snapshotInput(pods int) compile.Input {
	in := compiletest.Cluster(pods, 40, 3)
	in.NodeName = "node-1"
	in.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("fd00::1")}
	in.ClusterPolicies = append(in.ClusterPolicies, compiletest.DevCNPs()...)
	in.Nodes = []*corev1.Node{{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"zone": "a"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.0.0.0/24", PodCIDRs: []string{"10.0.0.0/24"}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}}},
	}}
	return in
}

// snapshotBytes writes the snapshot of in as the agent does, to a file,
// and returns the file's bytes.
func snapshotBytes(tb testing.TB, in compile.Input) []byte {
	tb.Helper()
	f, err := os.Create(filepath.Join(tb.TempDir(), "snapshot"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	size, err := writeSnapshotFile(f, "node-1", in)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		tb.Fatal(err)
	}
	if int64(len(b)) != size {
		tb.Fatalf("writeSnapshotFile reported %d bytes, the file has %d", size, len(b))
	}
	return b
}

// samePrograms checks that a and b decide every connection between their
// pods alike, and render the same ruleset.
func samePrograms(t *testing.T, a, b *compile.Program) {
	t.Helper()
	if len(a.Pods) != len(b.Pods) || len(a.Policies) != len(b.Policies) || len(a.ClusterPolicies) != len(b.ClusterPolicies) {
		t.Fatalf("programs differ: %d/%d pods, %d/%d policies, %d/%d cluster policies",
			len(a.Pods), len(b.Pods), len(a.Policies), len(b.Policies), len(a.ClusterPolicies), len(b.ClusterPolicies))
	}
	n := 0
	for i := range a.Pods {
		for j := range a.Pods {
			if (i*7+j)%5 != 0 {
				continue // a fifth of the pairs is plenty
			}
			src, dst := a.Pods[i].IPs[0], a.Pods[j].IPs[0]
			for _, port := range []uint16{8080, 9090, 50051, 443} {
				va, vb := Evaluate(a, src, dst, compile.ProtoTCP, port), Evaluate(b, src, dst, compile.ProtoTCP, port)
				if va != vb {
					t.Fatalf("%v -> %v:%d: %+v before the snapshot, %+v after", src, dst, port, va, vb)
				}
				n++
			}
		}
	}
	cfg := compile.RenderConfig{Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat}
	cfg.Defaults()
	ra, err := compile.Render(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := compile.Render(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ra, rb) {
		t.Error("the rulesets rendered before and after the snapshot differ")
	}
	t.Logf("%d verdicts compared", n)
}

func TestSnapshotRoundTrip(t *testing.T) {
	in := snapshotInput(300)
	in.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	// Budgets that reject some policies: the restored program must too.
	in.Budgets = compile.Budgets{Policy: 700, Namespace: 100000, ClusterPolicy: 100000}
	want := compile.Build(in)
	if !slices.ContainsFunc(want.Policies, func(p compile.Policy) bool { return p.Rejected }) {
		t.Fatal("no policy rejected for its budget: the budgets are not tested")
	}
	body := snapshotBytes(t, want.Source)
	t.Logf("%d pods: %d bytes", len(in.Pods), len(body))
	// The document is written item by item: every field must be one that
	// the decoder knows, and every field of the input must be in it.
	var doc snapshotDoc
	dec := json.NewDecoder(bytes.NewReader(body[bytes.IndexByte(body, '\n')+1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("strict decoding: %v", err)
	}
	dv := reflect.ValueOf(doc)
	for i := range dv.NumField() {
		if dv.Field(i).IsZero() {
			t.Errorf("the snapshot has no %s", dv.Type().Field(i).Name)
		}
	}
	got, _, err := decodeSnapshot("node-1", body)
	if err != nil {
		t.Fatal(err)
	}
	samePrograms(t, want, compile.Build(got))

	if _, _, err := decodeSnapshot("node-2", body); err == nil {
		t.Error("another node's snapshot was accepted")
	}
	bad := append([]byte(nil), body...)
	bad[len(bad)/2] ^= 1
	if _, _, err := decodeSnapshot("node-1", bad); err == nil {
		t.Error("a damaged snapshot was accepted")
	}
	for _, b := range [][]byte{nil, []byte("{}"), body[:len(body)/2]} {
		if _, _, err := decodeSnapshot("node-1", b); err == nil {
			t.Errorf("%d bytes of garbage accepted", len(b))
		}
	}
}

// TestSnapshotPodInfos: the controller's input form (pods as PodInfos,
// --pod-cidrs) survives the snapshot, and so does which pod-range
// addresses are unknown (their connections are held, not decided as
// non-pod addresses).
func TestSnapshotPodInfos(t *testing.T) {
	in := snapshotInput(200)
	for _, p := range in.Pods {
		in.PodInfos = append(in.PodInfos, compile.NewPodInfo(p))
	}
	in.Pods = nil
	in.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd10::/64")}
	want := compile.Build(in)
	body := snapshotBytes(t, want.Source)
	got, _, err := decodeSnapshot("node-1", body)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Pods) != 0 || len(got.PodInfos) != len(in.PodInfos) {
		t.Fatalf("decoded %d pods and %d pod infos, want 0 and %d", len(got.Pods), len(got.PodInfos), len(in.PodInfos))
	}
	gp := compile.Build(got)
	samePrograms(t, want, gp)
	if !reflect.DeepEqual(gp.PodCIDRs, want.PodCIDRs) {
		t.Fatalf("pod ranges %v after the snapshot, %v before", gp.PodCIDRs, want.PodCIDRs)
	}
	unknown := netip.MustParseAddr("10.255.255.254")
	if !want.IsUnknownPodAddr(unknown) || !gp.IsUnknownPodAddr(unknown) {
		t.Errorf("%v unknown before the snapshot: %v, after: %v; want both", unknown, want.IsUnknownPodAddr(unknown), gp.IsUnknownPodAddr(unknown))
	}
	known := want.Pods[0].IPs[0]
	if gp.IsUnknownPodAddr(known) {
		t.Errorf("pod address %v unknown after the snapshot", known)
	}
}

// TestSnapshotsFollowSwap: the file holds the program in force or nothing;
// never an older program once Swap has returned.
func TestSnapshotsFollowSwap(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSnapshots(dir, "node-1", ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	var afterWrites atomic.Uint64
	s.AfterWrite = func() { afterWrites.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	e := &Evaluator{Snapshots: s}
	loaded := func() int {
		p, _, err := s.Load()
		if errors.Is(err, os.ErrNotExist) {
			return -1
		}
		if err != nil {
			t.Fatal(err)
		}
		return len(p.Pods)
	}
	p1, p2 := compile.Build(snapshotInput(100)), compile.Build(snapshotInput(200))
	e.Swap(p1)
	eventually(t, "the first snapshot", func() bool { return loaded() == 100 })
	for i := 0; i < 20; i++ {
		p := p2
		if i%2 == 1 {
			p = p1
		}
		e.Swap(p)
		if n := loaded(); n != -1 && n != len(p.Pods) {
			t.Fatalf("after Swap of a program of %d pods the snapshot holds %d", len(p.Pods), n)
		}
	}
	e.Swap(p2)
	eventually(t, "the last snapshot", func() bool { return loaded() == 200 })

	// A restarted agent's evaluator takes the snapshot's program, unless a
	// sync published one first.
	p, written, err := s.Load()
	if err != nil || time.Since(written) > time.Minute {
		t.Fatalf("Load: written %v, %v", written, err)
	}
	fresh := &Evaluator{}
	if !fresh.Restore(p) || fresh.Program() != p {
		t.Error("Restore into an empty evaluator did not publish")
	}
	synced := &Evaluator{}
	synced.Swap(p1)
	if synced.Restore(p) || synced.Program() != p1 {
		t.Error("Restore replaced a synced program")
	}
	if st := s.Stats(); st.Saved < 2 || st.Failed != 0 || st.LastBytes == 0 {
		t.Errorf("Stats() = %+v", st)
	}
	eventually(t, "AfterWrite after every snapshot written", func() bool { return afterWrites.Load() >= s.Stats().Saved })
}

// BenchmarkSnapshot measures writing (encoding) and loading (decoding and
// rebuilding the program) a node's snapshot.
func BenchmarkSnapshot(b *testing.B) {
	for _, pods := range []int{1000, 10000} {
		in := snapshotInput(pods)
		body := snapshotBytes(b, in)
		b.Run(fmt.Sprintf("encode/pods=%d", pods), func(b *testing.B) {
			b.ReportMetric(float64(len(body)), "bytes")
			for b.Loop() {
				if _, err := encodeSnapshot(io.Discard, "node-1", in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("load/pods=%d", pods), func(b *testing.B) {
			for b.Loop() {
				got, _, err := decodeSnapshot("node-1", body)
				if err != nil {
					b.Fatal(err)
				}
				compile.Build(got)
			}
		})
	}
}

// eventually polls cond until it holds, failing t after 5 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSnapshotUnknownFormat: a snapshot of another format version is
// refused as such (ErrUnknownSnapshotFormat), also when the rest of its
// document has a shape this version cannot decode, so that the agent can
// say why it starts without it.
func TestSnapshotUnknownFormat(t *testing.T) {
	body := snapshotBytes(t, compile.Build(snapshotInput(3)).Source)
	doc := body[bytes.IndexByte(body, '\n')+1:]
	if v, ok := peekVersion(doc); !ok || v != snapshotVersion {
		t.Fatalf("peekVersion of this version's snapshot: %d, %v", v, ok)
	}
	withSum := func(doc []byte) []byte {
		sum := sha256.Sum256(doc)
		return append([]byte(hex.EncodeToString(sum[:])+"\n"), doc...)
	}
	same := bytes.Replace(doc, []byte(fmt.Sprint(snapshotVersion)), []byte("99"), 1)
	for name, b := range map[string][]byte{
		"same shape":  withSum(same),
		"other shape": withSum([]byte(`{"version": 99, "pods": {"by-node": {}}, "node": 7}`)),
	} {
		_, _, err := decodeSnapshot("node-1", b)
		if !errors.Is(err, ErrUnknownSnapshotFormat) {
			t.Errorf("%s: %v, want ErrUnknownSnapshotFormat", name, err)
		}
	}
}
