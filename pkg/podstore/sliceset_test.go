package podstore

import (
	"errors"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

func testSlice(name string, labels map[string]string, pods ...podslice.PodEntry) *podslice.PodAddressSlice {
	return &podslice.PodAddressSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "1"},
		PodLabels: labels, Pods: pods}
}

func entry(name, ip, node string) podslice.PodEntry {
	return podslice.PodEntry{Name: name, IPs: []string{ip}, Node: node, Created: metav1.NewTime(time.Unix(1000, 0))}
}

// TestSliceSetMoveNeverAbsent: a pod whose labels change moves from one
// slice to another. Whichever write the agent sees first, the pod is held
// by one of them at every step while both name it, and takes the labels
// of the slice that wrote it last; it goes only when no slice holds it.
func TestSliceSetMoveNeverAbsent(t *testing.T) {
	s := newSliceSet("me", DefaultSliceLimits)
	var r recorder
	web, api := map[string]string{"app": "web"}, map[string]string{"app": "api"}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.set("ns/a", testSlice("a", web, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.2", "n1")), r.note))
	if got := r.take(); !slices.Equal(got, []string{"ns/p", "ns/q"}) {
		t.Fatalf("changed %v", got)
	}
	// The new slice first: the pod takes its labels.
	must(s.set("ns/b", testSlice("b", api, entry("p", "10.0.0.1", "n1")), r.note))
	if got := s.get("ns/p"); got == nil || got.Labels["app"] != "api" {
		t.Fatalf("after b: %+v", got)
	}
	// The old slice is written again still naming the pod (a write the
	// publisher made before it moved the pod): it is the last writer.
	must(s.set("ns/a", testSlice("a", web, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.2", "n1")), r.note))
	r.take()
	// Then the old slice drops the pod: it is b's again, never absent.
	must(s.set("ns/a", testSlice("a", web, entry("q", "10.0.0.2", "n1")), r.note))
	if got := s.get("ns/p"); got == nil || got.Labels["app"] != "api" {
		t.Fatalf("after a dropped p: %+v, want b's", got)
	}
	if got := r.take(); !slices.Equal(got, []string{"ns/p"}) {
		t.Fatalf("changed %v, want [ns/p]", got)
	}
	// Deleting b: the pod is gone.
	must(s.set("ns/b", nil, r.note))
	if got := s.get("ns/p"); got != nil {
		t.Fatalf("after b deleted: %+v", got)
	}
	if got := r.take(); !slices.Equal(got, []string{"ns/p"}) {
		t.Fatalf("changed %v", got)
	}
	if len(s.holders) != 1 || s.entries != 1 {
		t.Fatalf("holders %v, entries %d, want q's only", s.holders, s.entries)
	}
}

// TestSliceSetUnchangedNotReported: a write of a slice reports only the
// pods whose entries changed.
func TestSliceSetUnchangedNotReported(t *testing.T) {
	s := newSliceSet("me", DefaultSliceLimits)
	var r recorder
	l := map[string]string{"app": "web"}
	_ = s.set("ns/a", testSlice("a", l, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.2", "n1")), r.note)
	r.take()
	_ = s.set("ns/a", testSlice("a", l, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.3", "n1"), entry("r", "10.0.0.4", "n2")), r.note)
	if got := r.take(); !slices.Equal(got, []string{"ns/q", "ns/r"}) {
		t.Fatalf("changed %v, want q (new address) and r (new)", got)
	}
	// The labels of the slice change every pod.
	_ = s.set("ns/a", testSlice("a", map[string]string{"app": "v2"}, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.3", "n1"), entry("r", "10.0.0.4", "n2")), r.note)
	if got := r.take(); len(got) != 3 {
		t.Fatalf("changed %v, want all three", got)
	}
}

// TestSliceSetLeavesOutOwnNodeAndBadEntries: the agent's own node's
// entries are not taken from slices (its Pod watch knows them), and an
// entry that does not validate is left out (unknown) with an error while
// the others are read.
func TestSliceSetLeavesOutOwnNodeAndBadEntries(t *testing.T) {
	s := newSliceSet("me", DefaultSliceLimits)
	var r recorder
	err := s.set("ns/a", testSlice("a", nil, entry("mine", "10.0.0.1", "me"), entry("bad", "10.0.0.300", "n1"),
		entry("ok", "10.0.0.2", "n1")), r.note)
	if err == nil {
		t.Fatal("no error for a bad address")
	}
	if got := r.take(); !slices.Equal(got, []string{"ns/ok"}) {
		t.Fatalf("held %v, want only ns/ok", got)
	}
	if s.get("ns/mine") != nil || s.get("ns/bad") != nil {
		t.Fatal("own node's or bad entry held")
	}
	if p := s.get("ns/ok"); p.ResourceVersion != SliceEntryVersion(p) || !p.Eligible {
		t.Fatalf("ok: %+v", p)
	}
}

// TestSliceSetLimits: a slice over the bounds is left out whole, and an
// update that takes a held slice over them removes its pods (unknown,
// held) rather than keep them stale.
func TestSliceSetLimits(t *testing.T) {
	s := newSliceSet("me", SliceLimits{Slices: 2, Pods: 3})
	var r recorder
	if err := s.set("ns/a", testSlice("a", nil, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.2", "n1")), r.note); err != nil {
		t.Fatal(err)
	}
	if err := s.set("ns/b", testSlice("b", nil, entry("r", "10.0.0.3", "n1")), r.note); err != nil {
		t.Fatal(err)
	}
	if err := s.set("ns/c", testSlice("c", nil, entry("s", "10.0.0.4", "n1")), r.note); !errors.Is(err, errOverLimit) {
		t.Fatalf("third slice: %v, want over the limits", err)
	}
	r.take()
	err := s.set("ns/b", testSlice("b", nil, entry("r", "10.0.0.3", "n1"), entry("t", "10.0.0.5", "n1")), r.note)
	if !errors.Is(err, errOverLimit) {
		t.Fatalf("b grown: %v, want over the limits", err)
	}
	if s.get("ns/r") != nil || s.get("ns/s") != nil || s.get("ns/t") != nil {
		t.Fatal("pods of slices over the limits held")
	}
	if got := r.take(); !slices.Equal(got, []string{"ns/r"}) {
		t.Fatalf("changed %v, want [ns/r] (dropped)", got)
	}
	if len(s.slices) != 1 || s.entries != 2 {
		t.Fatalf("%d slices, %d entries, want 1 and 2", len(s.slices), s.entries)
	}
}

// TestSliceSetVersionIsTheEntrys: a pod's resource version is its entry's
// (SliceEntryVersion), not the slice's, so that it is the same for an
// agent that followed every write and for one that read the slice once:
// the inputs fingerprint a test computes from the slices as they are then
// matches the agent's. A change of the entry changes it.
func TestSliceSetVersionIsTheEntrys(t *testing.T) {
	web := map[string]string{"app": "web"}
	followed, fresh := newSliceSet("me", DefaultSliceLimits), newSliceSet("me", DefaultSliceLimits)
	first := testSlice("a", web, entry("p", "10.0.0.1", "n1"))
	later := testSlice("a", web, entry("p", "10.0.0.1", "n1"), entry("q", "10.0.0.2", "n1"))
	later.ResourceVersion = "7"
	for _, err := range []error{followed.set("ns/a", first, func(string) {}), followed.set("ns/a", later, func(string) {}),
		fresh.set("ns/a", later, func(string) {})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := followed.get("ns/p"), fresh.get("ns/p")
	if a.ResourceVersion != b.ResourceVersion || a.ResourceVersion != SliceEntryVersion(b) {
		t.Errorf("p's version: %q after two writes, %q after the last alone; want both %q", a.ResourceVersion, b.ResourceVersion, SliceEntryVersion(b))
	}
	relabelled := testSlice("a", map[string]string{"app": "api"}, entry("p", "10.0.0.1", "n1"))
	if err := fresh.set("ns/a", relabelled, func(string) {}); err != nil {
		t.Fatal(err)
	}
	if c := fresh.get("ns/p"); c.ResourceVersion == b.ResourceVersion {
		t.Errorf("p relabelled kept its version %q", c.ResourceVersion)
	}
}
