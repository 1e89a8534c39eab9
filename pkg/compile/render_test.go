package compile

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// Golden conventions: the scenarios in testdata/golden/*.yaml; node-1 is the
// node rendered; pods 10.244.1.x live on node-1, 10.244.2.x on node-2.
// Regenerate with: go test ./pkg/compile -run TestGolden -update

var update = flag.Bool("update", false, "rewrite golden files")

// renderScenarioRuleset renders a scenario's ruleset for node-1.
func renderScenarioRuleset(t *testing.T, path string, cfg RenderConfig) *Ruleset {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScenario(data)
	if err != nil {
		t.Fatal(err)
	}
	prog := Build(s.Input("node-1", s.NodeNames([]string{"node-1", "node-2"}), nil))
	rs, err := Render(prog, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func renderScenario(t *testing.T, path string, cfg RenderConfig) string {
	t.Helper()
	rs := renderScenarioRuleset(t, path, cfg)
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("ruleset does not load into the fake: %v", err)
	}
	return fake.Dump()
}

func TestGolden(t *testing.T) { checkGoldens(t, "testdata/golden", *update) }

// goldenModes are the configurations each golden scenario is rendered in,
// by the suffix of its golden file.
var goldenModes = []struct {
	suffix string
	cfg    RenderConfig
}{
	{"hybrid", RenderConfig{Mode: ModeHybrid}},
	{"queue", RenderConfig{Mode: ModeQueue, QueueVariant: QueueNative, FailOpen: true, Queues: 2}},
	{"queue-xt", RenderConfig{Mode: ModeQueue, QueueVariant: QueueXTCompat}},
	{"hybrid-denylog", RenderConfig{Mode: ModeHybrid, DenyLogGroup: 7}},
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
		a := renderScenario(t, sc, RenderConfig{})
		b := renderScenario(t, sc, RenderConfig{})
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
		h := renderScenario(t, sc, RenderConfig{Mode: ModeHybrid, SkipUnknownPods: true, NoDNSLearning: true})
		k := renderScenario(t, sc, RenderConfig{Mode: ModeKernel})
		h = strings.Replace(h, "(mode hybrid)", "(mode kernel)", 1)
		if diff := cmp.Diff(k, h); diff != "" {
			t.Errorf("%s: hybrid differs from kernel beyond the table comment:\n%s", sc, diff)
		}
		if strings.Contains(h, "queue") {
			t.Errorf("%s: hybrid ruleset queues something", sc)
		}
		full := renderScenario(t, sc, RenderConfig{Mode: ModeHybrid})
		for _, line := range strings.Split(full, "\n") {
			for _, c := range []string{ChainQueue, ChainQueueShare, ChainQueueHeld} {
				if strings.HasSuffix(line, "goto "+c) && !strings.Contains(line, "@known-pods-v") && line != "add rule inet nftpolicy "+ChainQueueHeld+" goto "+ChainQueue {
					t.Errorf("%s: hybrid queues beyond unknown pods: %s", sc, line)
				}
			}
		}
		if !strings.Contains(full, "!= @known-pods-v4 counter goto "+ChainQueueHeld) {
			t.Errorf("%s: hybrid ruleset lacks the unknown-pod rule", sc)
		}
	}
}

func TestRenderConfigValidate(t *testing.T) {
	for _, c := range []RenderConfig{
		{Mode: "fast"},
		{Mode: ModeQueue, AllowMark: 0x4000},
		{Mode: ModeQueue, AllowMark: 0x3},
		{Mode: ModeQueue, QueueVariant: "magic"},
		{Mode: ModeQueue, QueueNum: 65535, Queues: 4},
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
	data, err := os.ReadFile("testdata/golden/cluster-tiers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScenario(data)
	if err != nil {
		t.Fatal(err)
	}
	in := s.Input("node-1", s.NodeNames([]string{"node-1", "node-2"}), nil)
	for _, np := range in.Policies {
		np.Name = long + np.Name
	}
	for _, cnp := range in.ClusterPolicies {
		cnp.Name = long + cnp.Name
	}
	prog := Build(in)
	if len(prog.Problems) > 0 {
		t.Fatalf("unexpected problems: %v", prog.Problems)
	}
	for _, mode := range []Mode{ModeHybrid, ModeQueue} {
		rs, err := Render(prog, RenderConfig{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		cut := 0
		for name := range rs.Chains {
			if !nftIdentifier.MatchString(name) {
				t.Errorf("%s: chain name %q is not an nft identifier", mode, name)
			}
			if strings.Contains(name, long[:20]) && len(name) <= maxPolicyRefChars+len("baseline--ingress") {
				cut++
			}
		}
		for name := range rs.Sets {
			if !nftIdentifier.MatchString(name) {
				t.Errorf("%s: set name %q is not an nft identifier", mode, name)
			}
		}
		if mode == ModeHybrid && cut == 0 {
			t.Errorf("no chain name was cut: the test does not exercise long names")
		}
	}
}
