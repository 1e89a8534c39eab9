package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// TestStateRestoreInBackground: restore attaches the snapshots and returns
// without waiting for the snapshot to be read (the agent opens its API
// watches meanwhile); the snapshot's program is published when it has
// been read. The snapshot is served through a FIFO, so that reading it
// waits until the test writes it.
func TestStateRestoreInBackground(t *testing.T) {
	const node = "node-1"
	dir := t.TempDir()
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	defer cancel()

	// A snapshot written the way the agent writes it.
	snaps, err := evaluate.NewSnapshots(dir, node, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	go snaps.Run(ctx)
	prev := &evaluate.Evaluator{Snapshots: snaps}
	prev.Swap(compile.Build(compile.Input{NodeName: node, Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}}))
	path := filepath.Join(dir, evaluate.SnapshotFile(node))
	var doc []byte
	waitFor(t, "the snapshot written", func() bool {
		doc, err = os.ReadFile(path)
		return err == nil && len(doc) > 0
	})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// A reader still waiting at the end (restore read it in the
	// foreground and the test failed) gets an empty snapshot.
	t.Cleanup(func() {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})

	o := &stateOptions{dir: dir}
	eval := &evaluate.Evaluator{}
	type result struct {
		read <-chan struct{}
		err  error
	}
	returned := make(chan result, 1)
	go func() {
		read, err := o.restore(ctx, eval, node, prometheus.NewRegistry())
		returned <- result{read, err}
	}()
	var read <-chan struct{}
	select {
	case r := <-returned:
		if r.err != nil {
			t.Fatal(r.err)
		}
		read = r.read
	case <-time.After(5 * time.Second):
		t.Fatal("restore did not return while the snapshot could not be read yet: the start waits for the snapshot")
	}
	if eval.Snapshots == nil {
		t.Error("restore returned without attaching the snapshots: the first sync's program would not be saved")
	}
	if eval.Program() != nil {
		t.Fatal("a program is published before the snapshot was read")
	}
	select {
	case <-read:
		t.Fatal("restore says the snapshot was read before it could be")
	default:
	}
	if err := os.WriteFile(path, doc, 0); err != nil { // opens once the loader reads
		t.Fatal(err)
	}
	waitFor(t, "the snapshot's program published", func() bool { return eval.Program() != nil })
	waitFor(t, "restore to say the snapshot was read", func() bool {
		select {
		case <-read:
			return true
		default:
			return false
		}
	})
}

// TestReleaseHoldFailOpen: with --fail-open, no program means accept, so
// the queues are read only once the snapshot was read (a restarted agent
// decides from it, never accepts unchecked while it is read); without it
// they wait for a program.
func TestReleaseHoldFailOpen(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, failOpen := range []bool{true, false} {
		eval := &evaluate.Evaluator{OpenWithoutProgram: failOpen}
		hold, read := make(chan struct{}), make(chan struct{})
		releaseHold(ctx, eval, hold, failOpen, read)
		select {
		case <-hold:
			t.Fatalf("failOpen=%v: the queues are read before the snapshot was read: queued connections are decided without it", failOpen)
		case <-time.After(100 * time.Millisecond):
		}
		close(read)
		if !failOpen {
			eval.Restore(compile.Build(compile.Input{}))
		}
		select {
		case <-hold:
		case <-time.After(5 * time.Second):
			t.Fatalf("failOpen=%v: the queues are still held after the snapshot was read (and, fail-closed, a program published)", failOpen)
		}
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestStateRefusesUnknownFormat: a snapshot of a format version this agent
// does not read (another agent version wrote it) is refused at start: no
// program is published from it (the queues wait for the first sync), the
// refusal is counted by reason, and the agent goes on.
func TestStateRefusesUnknownFormat(t *testing.T) {
	const node = "node-1"
	dir := t.TempDir()
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	defer cancel()
	snaps, err := evaluate.NewSnapshots(dir, node, ktesting.NewLogger(t, ktesting.NewConfig()))
	if err != nil {
		t.Fatal(err)
	}
	go snaps.Run(ctx)
	prev := &evaluate.Evaluator{Snapshots: snaps}
	prev.Swap(compile.Build(compile.Input{NodeName: node, Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}}))
	path := filepath.Join(dir, evaluate.SnapshotFile(node))
	var b []byte
	waitFor(t, "the snapshot written", func() bool {
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0
	})
	// The same document under a future format version, its checksum
	// recomputed: only the version tells it apart.
	doc := b[bytes.IndexByte(b, '\n')+1:]
	i := bytes.Index(doc, []byte(":"))
	j := i + 1 + bytes.IndexAny(doc[i+1:], ",}")
	doc = append(append(append([]byte(nil), doc[:i+1]...), "9999"...), doc[j:]...)
	sum := sha256.Sum256(doc)
	if err := os.WriteFile(path, append([]byte(hex.EncodeToString(sum[:])+"\n"), doc...), 0o600); err != nil {
		t.Fatal(err)
	}
	cancel() // the writer stops: the file stays as written here

	o := &stateOptions{dir: dir}
	eval := &evaluate.Evaluator{}
	reg := prometheus.NewRegistry()
	read, err := o.restore(tctx, eval, node, reg)
	if err != nil {
		t.Fatal(err)
	}
	<-read
	if eval.Program() != nil {
		t.Fatal("a program was published from a snapshot of an unknown format")
	}
	if got := counterOf(t, reg, "nftpolicy_state_snapshot_refused_total", "unknown_format"); got != 1 {
		t.Errorf("nftpolicy_state_snapshot_refused_total{reason=unknown_format} = %v, want 1", got)
	}
}

// counterOf returns the value of the registered counter name{reason=reason}.
func counterOf(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{reason=%q}", name, reason)
	return 0
}
