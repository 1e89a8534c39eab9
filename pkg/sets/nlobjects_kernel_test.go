package sets_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
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
		data, err := os.ReadFile(sc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := compile.ParseScenario(data)
		if err != nil {
			t.Fatal(err)
		}
		in := s.Input("node-1", s.NodeNames([]string{"node-1", "node-2"}), nil)
		name := strings.TrimSuffix(filepath.Base(sc), ".yaml")
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
	ctx := context.Background()
	sync := func(s *sets.Syncer, rs *compile.Ruleset) sets.Result {
		t.Helper()
		res, err := s.Sync(ctx, rs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
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
}
