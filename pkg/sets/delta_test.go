package sets

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestApplyDeltaWritesOnlyTheChange: pod changes tracked by a
// compile.Tracker reach the table as their element changes alone, and the
// table then holds what a full load of the full build holds.
func TestApplyDeltaWritesOnlyTheChange(t *testing.T) {
	w := baseWorld()
	tr, err := compile.NewTracker(compile.RenderConfig{Mode: compile.ModeHybrid})
	if err != nil {
		t.Fatal(err)
	}
	input := func() compile.Input { return compile.Input{NodeName: "n1", Pods: w.pods, Policies: w.policies} }
	_, rs, err := tr.Rebuild(input())
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	s, _ := New(Config{NFT: rec})
	sync(t, s, rs)
	steps := []struct {
		what  string
		key   string
		pod   *corev1.Pod
		lines []string
	}{
		{"a second client appears", "y/d", pod("y", "d", "n2", "10.0.2.2", map[string]string{"app": "client"}), []string{
			`add element inet nftpolicy known-pods-v4 { 10.0.2.2 }`,
			`add element inet nftpolicy peers-qeylrstm-v4 { 10.0.2.2 comment "y/d" }`}},
		{"a second web pod on this node", "x/e", pod("x", "e", "n1", "10.0.1.5", map[string]string{"app": "web"}), []string{
			`add element inet nftpolicy ingress-pods-v4 { 10.0.1.5 comment "x/e" : goto ingress-isolated-2f7e2rg4 }`,
			`add element inet nftpolicy known-pods-v4 { 10.0.1.5 }`,
			`add element inet nftpolicy self-v4 { 10.0.1.5 . 10.0.1.5 comment "x/e" }`}},
		{"the client leaves", "y/c", nil, []string{
			`delete element inet nftpolicy known-pods-v4 { 10.0.2.1 }`,
			`delete element inet nftpolicy peers-qeylrstm-v4 { 10.0.2.1 }`}},
	}
	for _, st := range steps {
		if st.pod != nil {
			w.pods = append(w.pods, st.pod)
		} else {
			for i, p := range w.pods {
				if p.Namespace+"/"+p.Name == st.key {
					w.pods = append(w.pods[:i:i], w.pods[i+1:]...)
					break
				}
			}
		}
		delta, f := tr.ApplyPod(st.key, st.pod)
		if f != compile.NoFallback {
			t.Fatalf("%s: needs a rebuild (%s)", st.what, f)
		}
		n := len(rec.txs)
		res, err := s.ApplyDelta(context.Background(), tr.Ruleset(), delta)
		if err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if res.Full || len(rec.txs) != n+1 {
			t.Fatalf("%s: want one element transaction, got full=%v and %d transactions", st.what, res.Full, len(rec.txs)-n)
		}
		if got := lines(rec.txs[n]); !equalLines(got, st.lines) {
			t.Errorf("%s: transaction\n%q\nwant\n%q", st.what, got, st.lines)
		}
		full, err := compile.Render(compile.Build(input()), compile.RenderConfig{Mode: compile.ModeHybrid})
		if err != nil {
			t.Fatal(err)
		}
		matchesFreshLoad(t, rec, full, st.what)
	}
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
