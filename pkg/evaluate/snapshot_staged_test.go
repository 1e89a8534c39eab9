package evaluate

import (
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestSnapshotKeepsStagedPolicies: a restarted agent's program from the
// snapshot leaves the staged policies out, as the program saved did.
func TestSnapshotKeepsStagedPolicies(t *testing.T) {
	in := snapshotInput(200)
	stage := func(a *map[string]string) {
		*a = map[string]string{compile.StagedAnnotation: "true"}
	}
	for i, np := range in.Policies {
		if i%3 == 0 {
			c := np.DeepCopy()
			stage(&c.Annotations)
			in.Policies[i] = c
		}
	}
	ns := in.Namespaces[0].DeepCopy()
	stage(&ns.Annotations)
	in.Namespaces[0] = ns
	cnp := in.ClusterPolicies[0].DeepCopy()
	stage(&cnp.Annotations)
	in.ClusterPolicies[0] = cnp
	want := compile.Build(in)
	if all := compile.Build(compile.Input{Pods: in.Pods, Namespaces: in.Namespaces, Policies: in.Policies,
		ClusterPolicies: in.ClusterPolicies, EnforceStaged: true}); len(all.Policies) == len(want.Policies) {
		t.Fatalf("test premise: %d policies with the staged ones enforced, %d without", len(all.Policies), len(want.Policies))
	}
	got, _, err := decodeSnapshot("node-1", snapshotBytes(t, want.Source))
	if err != nil {
		t.Fatal(err)
	}
	samePrograms(t, want, compile.Build(got))
}
