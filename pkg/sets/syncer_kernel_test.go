package sets_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// kernelNode is a Syncer and its private network namespace.
type kernelNode struct {
	r      *nsRunner
	syncer *sets.Syncer
}

// newKernelNode starts a namespace; withNetlink gives the syncer the
// netlink element writer and one-command-per-set full syncs, as the agent
// runs it; without, it is the plain knftables syncer, the reference.
func newKernelNode(t testing.TB, withNetlink bool) *kernelNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test creates network namespaces")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("needs nft: %v", err)
	}
	r, err := newNSRunner()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	nft, err := newNSNFT(r)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sets.Config{NFT: nft}
	if withNetlink {
		cfg.Netlink, cfg.OneCommandPerSet = nsElementWriter(t, r), true
	}
	s, err := sets.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &kernelNode{r: r, syncer: s}
}

func (k *kernelNode) nft(t testing.TB, args ...string) []byte {
	t.Helper()
	var out []byte
	err := k.r.do(func() (err error) {
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return out
}

// dump is the table as nft -j lists it, keyed by object, without handles;
// set elements sorted (hash sets list in the order of a random seed).
func (k *kernelNode) dump(t *testing.T) map[string]string {
	t.Helper()
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(k.nft(t, "-j", "list", "table", "inet", compile.TableName), &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	rules := map[string]int{}
	for _, o := range doc.Nftables {
		for kind, v := range o {
			delete(v, "handle")
			if elems, ok := v["elem"].([]any); ok {
				sort.Slice(elems, func(i, j int) bool {
					a, _ := json.Marshal(elems[i])
					b, _ := json.Marshal(elems[j])
					return string(a) < string(b)
				})
			}
			b, _ := json.Marshal(v)
			key := fmt.Sprintf("%s %v", kind, v["name"])
			if kind == "rule" {
				chain := fmt.Sprint(v["chain"])
				key = fmt.Sprintf("rule %s #%d", chain, rules[chain])
				rules[chain]++
			}
			out[key] = string(b)
		}
	}
	return out
}

func render(t *testing.T, in compile.Input) *compile.Ruleset {
	t.Helper()
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true} // no NFQUEUE rule: the queue statement varies by kernel
	cfg.Defaults()
	rs, err := compile.Render(compile.Build(in), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestNetlinkSyncMatchesNFT runs pod churn through a syncer with the
// netlink element writer and, after every change, compares its kernel
// table with one a plain knftables syncer fully loaded with the same
// ruleset. The changes touch plain and concatenated peer sets, named-port
// sets, the self set and the verdict maps, with comments.
func TestNetlinkSyncMatchesNFT(t *testing.T) {
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	in := compiletest.Cluster(600, 60, 3)
	in.NodeName = "node-0"
	sync := func(s *sets.Syncer, rs *compile.Ruleset) sets.Result { return mustSync(t, s, rs) }
	check := func(step string, rs *compile.Ruleset) {
		t.Helper()
		ref.syncer.ForceFull()
		sync(ref.syncer, rs)
		if diff := cmp.Diff(ref.dump(t), node.dump(t)); diff != "" {
			t.Fatalf("%s: netlink syncer's table differs from a full nft load (-nft +netlink):\n%s", step, diff)
		}
	}
	rs := render(t, in)
	if res := sync(node.syncer, rs); !res.Full || res.Netlink {
		t.Fatalf("first sync: %+v, want a full one through nft", res)
	}
	check("full sync, one command per set", rs)

	netlinkSyncs := 0
	pods := append([]*corev1.Pod(nil), in.Pods...)
	for step, change := range []struct {
		name string
		do   func()
	}{
		{"local pod relabelled", func() { relabelPod(pods, 0) }},
		{"remote pod relabelled", func() { relabelPod(pods, 1) }},
		{"pods deleted", func() { pods = append(pods[:5:5], pods[9:]...) }},
		{"pod added with a deleted pod's IP", func() {
			p := in.Pods[6].DeepCopy()
			p.Name = "reused-ip"
			pods = append(pods, p)
		}},
		{"pod's node changed", func() {
			p := pods[10].DeepCopy()
			p.Spec.NodeName = "node-0"
			pods[10] = p
		}},
	} {
		change.do()
		cur := in
		cur.Pods = pods
		rs := render(t, cur)
		res := sync(node.syncer, rs)
		if res.NetlinkFallback {
			t.Fatalf("step %d (%s): netlink batch refused", step, change.name)
		}
		if res.Netlink {
			netlinkSyncs++
		}
		t.Logf("%s: %+v", change.name, res)
		check(change.name, rs)
	}
	if netlinkSyncs == 0 {
		t.Fatal("no change went over netlink")
	}
}

// mustSync is Sync, failing the test on an error.
func mustSync(t testing.TB, s *sets.Syncer, rs *compile.Ruleset) sets.Result {
	t.Helper()
	res, err := s.Sync(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func relabelPod(pods []*corev1.Pod, i int) {
	p := pods[i].DeepCopy()
	if p.Labels["tier"] == "web" {
		p.Labels["tier"] = "api"
	} else {
		p.Labels["tier"] = "web"
	}
	pods[i] = p
}

// TestNetlinkFallback: when the kernel drifted from what the syncer
// applied (an element it deletes is gone), the batch is refused as a whole
// and the same Sync falls back to a full sync, which repairs the table.
func TestNetlinkFallback(t *testing.T) {
	node, ref := newKernelNode(t, true), newKernelNode(t, false)
	in := compiletest.Cluster(300, 30, 3)
	in.NodeName = "node-0"
	if _, err := node.syncer.Sync(context.Background(), render(t, in)); err != nil {
		t.Fatal(err)
	}
	// The pod to delete, and a set it is in, emptied behind the syncer's
	// back.
	rs := render(t, in)
	victim := in.Pods[1]
	var drifted string
	for _, n := range rs.SortedSetNames() {
		s := rs.Sets[n]
		for _, e := range s.Elements {
			if e.Shape == compile.ShapeAddr && e.Last == nil && e.Addr.String() == victim.Status.PodIP && s.Set != nil {
				drifted = n
			}
		}
	}
	if drifted == "" {
		t.Fatal("the pod is in no plain set")
	}
	node.nft(t, "flush", "set", "inet", compile.TableName, drifted)
	cur := in
	cur.Pods = append(append([]*corev1.Pod(nil), in.Pods[:1]...), in.Pods[2:]...)
	want := render(t, cur)
	res, err := node.syncer.Sync(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if !res.NetlinkFallback || !res.Full || res.Netlink {
		t.Fatalf("sync after drift: %+v, want a refused batch and a full sync", res)
	}
	if got := node.syncer.NetlinkFallbacks(); got != 1 {
		t.Errorf("NetlinkFallbacks() = %d, want 1", got)
	}
	if _, err := ref.syncer.Sync(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ref.dump(t), node.dump(t)); diff != "" {
		t.Fatalf("after the fallback (-want +got):\n%s", diff)
	}
}

// TestKernelFullSyncReplacesOldSetDefinitions loads a table whose set and
// map have other definitions than the desired ones into a real kernel:
// adding the desired set over it fails, and a full sync replaces both.
func TestKernelFullSyncReplacesOldSetDefinitions(t *testing.T) {
	rs, set, vmap, old := sets.OldDefinitions(t)
	k := newKernelNode(t, false)
	ctx := context.Background()
	nft, err := newNSNFT(k.r)
	if err != nil {
		t.Fatal(err)
	}
	tx := nft.NewTransaction()
	old(tx)
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// What an incremental or flush-based sync would write fails.
	tx = nft.NewTransaction()
	def := *rs.Sets[set].Set
	tx.Add(&def)
	if err := nft.Run(ctx, tx); err == nil {
		t.Errorf("the kernel took set %s over its old definition: this test no longer shows the problem", set)
	}
	if _, err := k.syncer.Sync(ctx, rs); err != nil {
		t.Fatalf("full sync over old definitions: %v", err)
	}
	for _, obj := range [][2]string{{"set", set}, {"map", vmap}} {
		out := string(k.nft(t, "list", obj[0], "inet", compile.TableName, obj[1]))
		if strings.Contains(out, "inet_service") || strings.Contains(out, "inet_proto") || strings.Contains(out, "timeout") {
			t.Errorf("%s %s kept its old definition:\n%s", obj[0], obj[1], out)
		}
	}
}
