package compile_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// Golden conventions: the scenarios in testdata/golden/*.yaml; node-1 is the
// node rendered; pods 10.244.1.x live on node-1, 10.244.2.x on node-2.
// Regenerate with: go test ./pkg/compile -run TestGolden -update

var update = flag.Bool("update", false, "rewrite golden files")

// renderScenarioRuleset renders a scenario's ruleset for node-1.
func renderScenarioRuleset(t *testing.T, path string, cfg compile.RenderConfig) *compile.Ruleset {
	t.Helper()
	prog := compile.Build(scenariotest.GoldenInput(t, path))
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func renderScenario(t *testing.T, path string, cfg compile.RenderConfig) string {
	t.Helper()
	rs := renderScenarioRuleset(t, path, cfg)
	fake := knftables.NewFake(knftables.InetFamily, compile.TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("ruleset does not load into the fake: %v", err)
	}
	return fake.Dump()
}

func TestGolden(t *testing.T) { checkGoldens(t, "testdata/golden", *update) }

// goldenModes are the configurations each golden scenario is rendered in,
// by the suffix of its golden file. The staged log is on in all of them:
// only staged.yaml has staged policies, the others show it costs nothing
// without.
var goldenModes = []struct {
	suffix string
	cfg    compile.RenderConfig
}{
	{"hybrid", compile.RenderConfig{Mode: compile.ModeHybrid, StagedLogGroup: 8}},
	{"queue", compile.RenderConfig{Mode: compile.ModeQueue, QueueVariant: compile.QueueNative, FailOpen: true, Queues: 2, StagedLogGroup: 8}},
	{"queue-xt", compile.RenderConfig{Mode: compile.ModeQueue, QueueVariant: compile.QueueXTCompat, StagedLogGroup: 8}},
	{"hybrid-denylog", compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7, StagedLogGroup: 8}},
}

// checkGoldens renders every golden scenario in every mode and compares
// the ruleset with its golden file in dir, or (update) writes the file.
func checkGoldens(t *testing.T, dir string, update bool) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	for _, sc := range scenarios {
		for _, m := range goldenModes {
			name := strings.TrimSuffix(filepath.Base(sc), ".yaml") + "." + m.suffix
			t.Run(name, func(t *testing.T) {
				got := renderScenario(t, sc, m.cfg)
				golden := filepath.Join(dir, name+".nft")
				if update {
					if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatalf("%v (run with -update to create)", err)
				}
				if diff := cmp.Diff(string(want), got); diff != "" {
					t.Errorf("ruleset differs from %s (-want +got):\n%s", golden, diff)
				}
			})
		}
	}
}

func TestRenderDeterministic(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	for _, sc := range scenarios {
		a := renderScenario(t, sc, compile.RenderConfig{})
		b := renderScenario(t, sc, compile.RenderConfig{})
		if a != b {
			t.Errorf("%s: two renders differ", sc)
		}
	}
}

// Hybrid mode decides every policy in the kernel: without the unknown-pod
// rules and DNS learning (its output chain) its ruleset is kernel mode's, and with them the only rules that
// reach the userspace chain are the unknown-pod ones.
func TestHybridEqualsKernelInV1(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	for _, sc := range scenarios {
		h := renderScenario(t, sc, compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true, NoDNSLearning: true})
		k := renderScenario(t, sc, compile.RenderConfig{Mode: compile.ModeKernel})
		h = strings.Replace(h, "(mode hybrid)", "(mode kernel)", 1)
		if diff := cmp.Diff(k, h); diff != "" {
			t.Errorf("%s: hybrid differs from kernel beyond the table comment:\n%s", sc, diff)
		}
		if strings.Contains(h, "queue") {
			t.Errorf("%s: hybrid ruleset queues something", sc)
		}
		full := renderScenario(t, sc, compile.RenderConfig{Mode: compile.ModeHybrid})
		for _, line := range strings.Split(full, "\n") {
			for _, c := range []string{compile.ChainQueue, compile.ChainQueueShare, compile.ChainQueueHeld} {
				if strings.HasSuffix(line, "goto "+c) && !strings.Contains(line, "@known-pods-v") && line != "add rule inet nftpolicy "+compile.ChainQueueHeld+" goto "+compile.ChainQueue {
					t.Errorf("%s: hybrid queues beyond unknown pods: %s", sc, line)
				}
			}
		}
		if !strings.Contains(full, "!= @known-pods-v4 counter goto "+compile.ChainQueueHeld) {
			t.Errorf("%s: hybrid ruleset lacks the unknown-pod rule", sc)
		}
	}
}

func TestRenderConfigValidate(t *testing.T) {
	for _, c := range []compile.RenderConfig{
		{Mode: "fast"},
		{Mode: compile.ModeQueue, AllowMark: 0x4000},
		{Mode: compile.ModeQueue, AllowMark: 0x3},
		{Mode: compile.ModeQueue, QueueVariant: "magic"},
		{Mode: compile.ModeQueue, QueueNum: 65535, Queues: 4},
	} {
		c.Defaults()
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}

// nftIdentifier is what nft's parser accepts as a chain, set or map name
// without quoting.
var nftIdentifier = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_/\-.]*$`)

// TestObjectNamesAreNftIdentifiers: every name the renderer makes parses
// in nft, long policy names (cut and hashed) included. knftables' fake does
// not check this; nft rejected a whole transaction over one bad name.
func TestObjectNamesAreNftIdentifiers(t *testing.T) {
	long := strings.Repeat("long-", 20)
	in := scenariotest.GoldenInput(t, "testdata/golden/cluster-tiers.yaml")
	for _, np := range in.Policies {
		np.Name = long + np.Name
	}
	for _, cnp := range in.ClusterPolicies {
		cnp.Name = long + cnp.Name
	}
	prog := compile.Build(in)
	if len(prog.Problems) > 0 {
		t.Fatalf("unexpected problems: %v", prog.Problems)
	}
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		rs, err := compile.Render(prog, compile.RenderConfig{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		cut := 0
		for name := range rs.Chains {
			if !nftIdentifier.MatchString(name) {
				t.Errorf("%s: chain name %q is not an nft identifier", mode, name)
			}
			if strings.Contains(name, long[:20]) && len(name) <= compile.MaxPolicyRefChars+len("baseline--ingress") {
				cut++
			}
		}
		for name := range rs.Sets {
			if !nftIdentifier.MatchString(name) {
				t.Errorf("%s: set name %q is not an nft identifier", mode, name)
			}
		}
		if mode == compile.ModeHybrid && cut == 0 {
			t.Errorf("no chain name was cut: the test does not exercise long names")
		}
	}
}

// TestQueueShareFollowsConfig: queue mode's per-source share of the queue
// is the configured rate and burst (--queue-source-rate and -burst), the
// defaults when unset.
func TestQueueShareFollowsConfig(t *testing.T) {
	sc := "testdata/golden/deny-and-allow.yaml"
	for _, c := range []struct {
		rate, burst uint32
		want        string
	}{
		{0, 0, fmt.Sprintf("limit rate over %d/second burst %d packets", compile.DefaultQueueSourceRate, compile.DefaultQueueSourceBurst)},
		{25000, 64, "limit rate over 25000/second burst 64 packets"},
	} {
		out := renderScenario(t, sc, compile.RenderConfig{Mode: compile.ModeQueue, QueueSourceRate: c.rate, QueueSourceBurst: c.burst})
		var share []string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "add rule inet nftpolicy "+compile.ChainQueueShare+" ") && strings.Contains(line, "limit rate") {
				share = append(share, line)
			}
		}
		if len(share) == 0 {
			t.Fatalf("rate %d: no meter rule in %s:\n%s", c.rate, compile.ChainQueueShare, out)
		}
		for _, line := range share {
			if !strings.Contains(line, c.want) {
				t.Errorf("rate %d burst %d: %s lacks %q", c.rate, c.burst, line, c.want)
			}
		}
	}
}
