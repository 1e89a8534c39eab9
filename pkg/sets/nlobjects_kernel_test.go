package sets_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// exprs lists every rule of the table as the kernel holds it, expression by
// expression with its userdata (nft --debug=netlink), keyed by chain and
// position: what two tables must share for their rules to be the same
// bytes, beyond how nft prints them.
func (k *kernelNode) exprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	head := regexp.MustCompile(`^inet ` + compile.TableName + ` (\S+) \d+( \d+)?$`)
	n := map[string]int{}
	key := ""
	for _, line := range strings.Split(string(k.nft(t, "--debug=netlink", "list", "table", "inet", compile.TableName)), "\n") {
		if strings.HasPrefix(line, "table ") {
			break
		}
		if m := head.FindStringSubmatch(line); m != nil {
			key = fmt.Sprintf("%s #%d", m[1], n[m[1]])
			n[m[1]]++
			continue
		}
		if key != "" && strings.TrimSpace(line) != "" {
			out[key] += strings.TrimSpace(line) + "\n"
		}
	}
	return out
}

// policyPairs are rulesets with and without their policies: the golden
// scenarios (hybrid, with and without the deny log) and a generated
// cluster.
func policyPairs(t *testing.T) map[string][2]*compile.Ruleset {
	t.Helper()
	pairs := map[string][2]*compile.Ruleset{}
	add := func(name string, in compile.Input, cfg compile.RenderConfig) {
		bare := in
		bare.Policies, bare.ClusterPolicies = nil, nil
		cfg.SkipUnknownPods, cfg.NoDNSLearning = true, true // no queue statement: it varies by kernel
		cfg.Defaults()
		var rs [2]*compile.Ruleset
		for i, x := range []compile.Input{bare, in} {
			var err error
			if rs[i], err = compile.Render(compile.Build(x), cfg); err != nil {
				t.Fatal(err)
			}
		}
		pairs[name] = rs
	}
	scenarios, _ := filepath.Glob("../compile/testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	for _, sc := range scenarios {
		in := scenariotest.GoldenInput(t, sc)
		name := strings.TrimSuffix(filepath.Base(sc), ".yaml")
		if name == "fqdn" {
			// A node's first domainNames policy adds the DNS capture and
			// per-pod share chains, whose meters (update @set { ... limit })
			// the batch does not encode: that sync goes through nft by
			// design (the last case below), and its ruleset is golden text.
			continue
		}
		add(name, in, compile.RenderConfig{Mode: compile.ModeHybrid})
		add(name+" deny log", in, compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7})
	}
	in := compiletest.Cluster(300, 30, 3)
	in.NodeName = "node-0"
	add("generated cluster", in, compile.RenderConfig{Mode: compile.ModeHybrid})
	return pairs
}

// TestNetlinkObjectsMatchNFT: a syncer with the netlink writer adds every
// policy's chains, rules and sets to a table that has none (and then takes
// them away again) in one netlink batch each way, and its table is then
// the one a plain knftables syncer loads with nft: the same objects as nft
// lists them, the same expressions and userdata rule by rule, and set
// declarations that a later full sync reads back as its own.
func TestNetlinkObjectsMatchNFT(t *testing.T) {
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	sync := func(s *sets.Syncer, rs *compile.Ruleset) sets.Result { return mustSync(t, s, rs) }
	same := func(step string, rs *compile.Ruleset) {
		t.Helper()
		ref.syncer.ForceFull()
		sync(ref.syncer, rs)
		if diff := cmp.Diff(ref.dump(t), node.dump(t)); diff != "" {
			t.Fatalf("%s: table differs from an nft load (-nft +netlink):\n%s", step, diff)
		}
		if diff := cmp.Diff(ref.exprs(t), node.exprs(t)); diff != "" {
			t.Fatalf("%s: rules' expressions differ from an nft load (-nft +netlink):\n%s", step, diff)
		}
	}
	for name, rs := range policyPairs(t) {
		bare, full := rs[0], rs[1]
		node.syncer.ForceFull()
		if res := sync(node.syncer, bare); !res.Full {
			t.Fatalf("%s: first sync %+v, want a full one", name, res)
		}
		res := sync(node.syncer, full)
		if !res.Netlink || res.Full || res.NetlinkFallback || res.ChainsWritten == 0 {
			t.Fatalf("%s: adding the policies: %+v, want one netlink batch that writes chains", name, res)
		}
		same(name+": policies added", full)
		// A full sync that reads the kernel's sets back keeps every one:
		// their declarations are nft's.
		node.syncer.ForceFull()
		if res := sync(node.syncer, full); res.ElementsAdded != 0 || res.ElementsDeleted != 0 {
			t.Fatalf("%s: full sync after the netlink batch rewrote elements: %+v", name, res)
		}
		sync(node.syncer, bare)
		res = sync(node.syncer, full)
		if !res.Netlink {
			t.Fatalf("%s: re-adding the policies: %+v", name, res)
		}
		res = sync(node.syncer, bare)
		if !res.Netlink || res.Full || res.ChainsDeleted == 0 {
			t.Fatalf("%s: removing the policies: %+v, want one netlink batch that deletes chains", name, res)
		}
		same(name+": policies removed", bare)
		t.Logf("%s: %d chains, %d sets", name, len(full.Chains), len(full.Sets))
	}

	// A change the batch cannot express (here a rule with a statement the
	// compiler does not render) sends the whole sync through nft.
	rs := policyPairs(t)["generated cluster"][1]
	node.syncer.ForceFull()
	sync(node.syncer, rs)
	odd := *rs
	odd.Chains = maps.Clone(rs.Chains)
	odd.Chains["extra"] = &compile.Chain{Chain: knftables.Chain{Name: "extra"},
		Rules: []compile.TableRule{{Exprs: []compile.RuleExpr{{Kind: compile.ExprNft, Text: "ct state established"}}, Verdict: compile.RuleVerdict{Kind: compile.VerdictAccept}}}}
	odd.ChainOrder = append([]string{"extra"}, rs.ChainOrder...)
	if res := sync(node.syncer, &odd); res.Netlink || res.Full || res.ChainsWritten != 1 {
		t.Fatalf("a rule netlink does not write: %+v, want one chain written through nft", res)
	}
	same("a rule netlink does not write", &odd)
}

// TestApplyDeltaWithNewRuleset: a local pod that is the first, then the
// last, of its combination of policies gives the tracker a new ruleset
// sharing the applied one's sets, which it changed in place; ApplyDelta
// writes the new chains and sets and the pod's elements in one netlink
// batch, and the table is then the one nft loads from a full build.
func TestApplyDeltaWithNewRuleset(t *testing.T) {
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true}
	cfg.Defaults()
	in, pod := withLonePolicy(syncBenchInput(300, 30))
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Rebuild(in); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := node.syncer.Sync(ctx, tr.Ruleset()); err != nil {
		t.Fatal(err)
	}
	key := pod.Namespace + "/" + pod.Name
	for _, step := range []struct {
		name string
		pod  *corev1.Pod
		pods []*corev1.Pod
	}{
		{"first pod of its policy", pod, append(slices.Clone(in.Pods), pod)},
		{"its last pod deleted", nil, in.Pods},
	} {
		prev := tr.Ruleset()
		delta, f := tr.ApplyPod(key, step.pod)
		if f != compile.NoFallback || tr.Ruleset() == prev {
			t.Fatalf("%s: fallback %q, new ruleset %v: want a new ruleset", step.name, f, tr.Ruleset() != prev)
		}
		res, err := node.syncer.ApplyDelta(ctx, tr.Ruleset(), delta)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Netlink || res.Full || res.ChainsWritten+res.ChainsDeleted == 0 || res.ElementsAdded+res.ElementsDeleted == 0 {
			t.Fatalf("%s: %+v, want one netlink batch with chains and elements", step.name, res)
		}
		cur := in
		cur.Pods = step.pods
		want, err := compile.Render(compile.Build(cur), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ref.syncer.Sync(ctx, want); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(ref.dump(t), node.dump(t)); diff != "" {
			t.Fatalf("%s: table differs from an nft load of the full build (-nft +netlink):\n%s", step.name, diff)
		}
	}
}
