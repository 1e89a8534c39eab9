package compile_test

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
)

// sharedElementsInput is a small synthetic cluster whose pods are dual
// stack and one of whose local pods has a key longer than an nftables
// comment, so that a pod's elements share addresses across families and
// sets and its comment is truncated.
func sharedElementsInput() compile.Input {
	in := compiletest.Cluster(400, 40, 4)
	in.NodeName = "node-0"
	in.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.16.0.0/12"), netip.MustParsePrefix("fd00::/64")}
	for i, p := range in.Pods {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00::%x", i+1)})
	}
	long := in.Pods[4] // ns-0000/pod-04 is on node-0
	long.Name = strings.Repeat("l", 200)
	return in
}

// cloneSets copies every set's elements down to their strings, so that a
// later write into a shared comment or range shows as a difference.
func cloneSets(rs *compile.Ruleset) map[string][]string {
	out := map[string][]string{}
	for n, s := range rs.Sets {
		es := make([]string, len(s.Elements))
		for i := range s.Elements {
			es[i] = compile.ElementID(&s.Elements[i])
		}
		out[n] = es
	}
	return out
}

// TestTrackerEditsKeepSharedElements: a full render shares a pod's comment
// between its elements in several sets.
// The tracker then edits sets in place as pods change; every set its
// deltas do not name must stay exactly as it was, and the edited ruleset
// must be what a full build of the same objects renders.
func TestTrackerEditsKeepSharedElements(t *testing.T) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	in := sharedElementsInput()
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, rs, err := tr.Rebuild(in)
	if err != nil {
		t.Fatal(err)
	}
	long := in.Pods[4]
	var sawTruncated bool
	for n, s := range rs.Sets {
		for _, e := range s.Elements {
			if e.Comment == nil {
				continue
			}
			// nft refuses a longer comment, and with it the whole
			// transaction: the node's every sync would fail.
			if len(*e.Comment) > knftables.CommentLengthMax {
				t.Errorf("set %s: element comment of %d bytes, nft allows %d: %q", n, len(*e.Comment), knftables.CommentLengthMax, *e.Comment)
			}
			if strings.HasPrefix(*e.Comment, long.Namespace+"/"+long.Name[:20]) {
				sawTruncated = sawTruncated || len(*e.Comment) == knftables.CommentLengthMax
			}
		}
	}
	if !sawTruncated {
		t.Fatal("no element of the long-named pod has a truncated comment; the input does not exercise it")
	}

	pods := slices.Clone(in.Pods)
	edits := []struct {
		name string
		do   func() (string, *corev1.Pod)
	}{
		{"relabel a remote pod", func() (string, *corev1.Pod) {
			p := pods[9].DeepCopy()
			p.Labels = map[string]string{"app": "app-1", "tier": "db"}
			pods[9] = p
			return p.Namespace + "/" + p.Name, p
		}},
		{"delete the long-named pod", func() (string, *corev1.Pod) {
			p := pods[4]
			pods = slices.Delete(pods, 4, 5)
			return p.Namespace + "/" + p.Name, nil
		}},
		{"move a remote pod's addresses", func() (string, *corev1.Pod) {
			p := pods[101].DeepCopy()
			p.Status.PodIPs = []corev1.PodIP{{IP: "10.31.0.1"}, {IP: "fd00::ffff"}}
			p.Status.PodIP = "10.31.0.1"
			pods[101] = p
			return p.Namespace + "/" + p.Name, p
		}},
	}
	for _, ed := range edits {
		before := cloneSets(tr.Ruleset())
		key, pod := ed.do()
		delta, f := tr.ApplyPod(key, pod)
		if f != compile.NoFallback {
			t.Fatalf("%s: the tracker wants a rebuild (%s); the test needs an incremental edit", ed.name, f)
		}
		if len(delta) == 0 {
			t.Fatalf("%s: no element changed; the test needs an edit", ed.name)
		}
		after := cloneSets(tr.Ruleset())
		for _, n := range slices.Sorted(maps.Keys(before)) {
			if slices.ContainsFunc(delta, func(d compile.SetDelta) bool { return d.Set == n }) {
				continue
			}
			if diff := cmp.Diff(before[n], after[n]); diff != "" {
				t.Errorf("%s: set %s, which the delta does not name, changed (-before +after):\n%s", ed.name, n, diff)
			}
		}
		in.Pods = pods
		want, err := compile.Render(compile.Build(in), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(cloneSets(want), after); diff != "" {
			t.Errorf("%s: tracked sets differ from a full build's (-full +tracked):\n%s", ed.name, diff)
		}
	}
}
