package publish

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// Pods are in 10.0.0.0/8, one address each unless a test says otherwise.

func makePod(ns, name string, ip string, labels map[string]string) *compile.PodInfo {
	p := &compile.PodInfo{Labels: labels, Eligible: true, Node: "node-1",
		CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	if ip != "" {
		p.IPs = []netip.Addr{netip.MustParseAddr(ip)}
	}
	p.SetKey(ns, name)
	return p
}

// addrEqual compares addresses by value (netip.Addr has unexported fields).
var addrEqual = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func podIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255) }

// published is every pod of the grouping's slices, read back as an agent
// reads them, by key; it fails the test on a slice over the bounds, a
// slice whose pods' labels differ from its own, or a pod published twice.
func published(t *testing.T, g *grouping) map[string]*compile.PodInfo {
	t.Helper()
	out := map[string]*compile.PodInfo{}
	for _, s := range g.byName {
		ps := s.slice()
		if len(ps.Pods) > podslice.MaxPods {
			t.Errorf("slice %s: %d pods, more than %d", s.key(), len(ps.Pods), podslice.MaxPods)
		}
		infos, err := podslice.PodInfos(ps)
		if err != nil {
			t.Errorf("slice %s: %v", s.key(), err)
		}
		for _, p := range infos {
			if _, dup := out[p.Key]; dup {
				t.Errorf("pod %s is in two slices", p.Key)
			}
			out[p.Key] = p
		}
	}
	return out
}

// wantPublished is what podslice.Entry makes of the pods, read back.
func wantPublished(t *testing.T, pods []*compile.PodInfo) map[string]*compile.PodInfo {
	t.Helper()
	out := map[string]*compile.PodInfo{}
	for _, p := range pods {
		e, ok := podslice.Entry(p)
		if !ok {
			continue
		}
		s := &podslice.PodAddressSlice{PodLabels: p.Labels, Pods: []podslice.PodEntry{e}}
		s.Namespace = p.Namespace
		infos, err := podslice.PodInfos(s)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Key] = infos[0]
	}
	return out
}

func TestGroupingLabelSets(t *testing.T) {
	web := map[string]string{"app": "web", "pod-template-hash": "abc"}
	db0 := map[string]string{"app": "db", "statefulset.kubernetes.io/pod-name": "db-0"}
	db1 := map[string]string{"app": "db", "statefulset.kubernetes.io/pod-name": "db-1"}
	pods := []*compile.PodInfo{
		makePod("a", "web-1", "10.0.0.1", web),
		makePod("a", "web-2", "10.0.0.2", web),
		makePod("b", "web-1", "10.0.1.1", web), // another namespace: another slice
		makePod("a", "db-0", "10.0.0.3", db0),
		makePod("a", "db-1", "10.0.0.4", db1),
		makePod("a", "bare", "10.0.0.5", nil),
		makePod("a", "pending", "", web), // no address: not published
	}
	hostNet := makePod("a", "host", "192.168.0.1", web)
	hostNet.Eligible = false
	pods = append(pods, hostNet)
	g := newGrouping()
	for _, p := range pods {
		g.place(p.Key, p)
	}
	if diff := cmp.Diff(wantPublished(t, pods), published(t, g), addrEqual); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
	// web in a, web in b, db-0, db-1 (labels of their own), bare.
	if len(g.byName) != 5 {
		t.Errorf("%d slices, want 5: %v", len(g.byName), slices.Sorted(maps.Keys(g.byName)))
	}
	if g.byPod["a/web-1"] != g.byPod["a/web-2"] || g.byPod["a/web-1"] == g.byPod["b/web-1"] || g.byPod["a/db-0"] == g.byPod["a/db-1"] {
		t.Errorf("pods grouped wrong: %v", g.byPod)
	}
}

func TestGroupingShardsAndStays(t *testing.T) {
	labels := map[string]string{"app": "big"}
	var pods []*compile.PodInfo
	for i := range 250 {
		pods = append(pods, makePod("a", fmt.Sprintf("big-%03d", i), podIP(i+1), labels))
	}
	g := newGrouping()
	for _, p := range pods {
		g.place(p.Key, p)
	}
	if len(g.byName) != 3 {
		t.Fatalf("250 pods of one label set in %d slices, want 3", len(g.byName))
	}
	if diff := cmp.Diff(wantPublished(t, pods), published(t, g), addrEqual); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
	// One pod's change touches its slice only.
	moved := makePod("a", "big-150", "10.9.9.9", labels)
	before := g.byPod[moved.Key]
	touched := g.place(moved.Key, moved)
	if len(touched) != 1 || touched[0] != before || g.byPod[moved.Key] != before {
		t.Errorf("an address change touched %d slices and moved the pod", len(touched))
	}
	// Relabelled: out of its slice, into its new set's.
	re := makePod("a", "big-010", podIP(11), map[string]string{"app": "big", "v": "2"})
	if touched := g.place(re.Key, re); len(touched) != 2 {
		t.Errorf("a relabel touched %d slices, want 2 (the old and the new)", len(touched))
	}
	// Deleting a slice's pods one by one deletes it.
	first := g.byPod["a/big-000"]
	for i := range 100 {
		if i != 10 { // moved to its new set's slice already
			g.place(fmt.Sprintf("a/big-%03d", i), nil)
		}
	}
	if g.byName[first.key()] != nil {
		t.Errorf("slice %s kept with no pods", first.key())
	}
	pods[150], pods[10] = moved, re
	left := append(slices.Clone(pods[100:]), re)
	if diff := cmp.Diff(wantPublished(t, left), published(t, g), addrEqual); diff != "" {
		t.Errorf("published after deletes (-want +got):\n%s", diff)
	}
}

// TestGroupingNameCollision: two label sets given one name prefix (a hash
// collision) never share a slice.
func TestGroupingNameCollision(t *testing.T) {
	g := newGrouping()
	a := makePod("a", "x", "10.0.0.1", map[string]string{"app": "x"})
	b := makePod("a", "y", "10.0.0.2", map[string]string{"app": "y"})
	g.place(a.Key, a)
	// A slot of b's set under the name a's got, as a collision would do.
	sa := g.byPod[a.Key]
	g.byName = map[string]*slot{}
	g.bySet = map[string][]*slot{}
	g.byPod = map[string]*slot{}
	g.newSlot("a", sa.name, setKey(b.Labels), b.Labels)
	g.place(a.Key, a)
	if g.byPod[a.Key].name == sa.name {
		t.Fatalf("pod with labels %v put in slice %s of labels %v", a.Labels, sa.name, b.Labels)
	}
}

// TestGroupingAdopt: a new leader keeps its predecessor's slice for the
// pods that still carry its labels, and never takes a slice's labels for
// a pod's.
func TestGroupingAdopt(t *testing.T) {
	web := map[string]string{"app": "web"}
	pods := map[string]*compile.PodInfo{}
	for i, name := range []string{"w1", "w2", "w3"} {
		pods["a/"+name] = makePod("a", name, podIP(i+1), web)
	}
	pods["a/w3"].Labels = map[string]string{"app": "web", "evil": "no"}
	old := &podslice.PodAddressSlice{PodLabels: web, Pods: []podslice.PodEntry{{Name: "w1"}, {Name: "w3"}, {Name: "gone"}}}
	old.Namespace, old.Name = "a", "legacy-name"
	// A slice that claims w2 under labels w2 does not have.
	liar := &podslice.PodAddressSlice{PodLabels: map[string]string{"role": "admin"}, Pods: []podslice.PodEntry{{Name: "w2"}}}
	liar.Namespace, liar.Name = "a", "liar"
	g := newGrouping()
	get := func(k string) *compile.PodInfo { return pods[k] }
	g.adopt(old, get)
	g.adopt(liar, get)
	for _, p := range pods {
		g.place(p.Key, p)
	}
	if s := g.byPod["a/w1"]; s == nil || s.name != "legacy-name" {
		t.Errorf("w1 not kept in its slice: %v", s)
	}
	if g.byName["a/liar"] != nil {
		t.Errorf("a slice whose labels are no pod's was adopted")
	}
	var all []*compile.PodInfo
	for _, p := range pods {
		all = append(all, p)
	}
	if diff := cmp.Diff(wantPublished(t, all), published(t, g), addrEqual); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
}
