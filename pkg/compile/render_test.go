package compile

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// Golden conventions: the scenarios in testdata/golden/*.yaml; node-1 is the
// node rendered; pods 10.244.1.x live on node-1, 10.244.2.x on node-2.
// Regenerate with: go test ./pkg/compile -run TestGolden -update

var update = flag.Bool("update", false, "rewrite golden files")

func renderScenario(t *testing.T, path string, cfg RenderConfig) string {
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
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("ruleset does not load into the fake: %v", err)
	}
	return fake.Dump()
}

func TestGolden(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	if len(scenarios) == 0 {
		t.Fatal("no golden scenarios")
	}
	modes := []struct {
		suffix string
		cfg    RenderConfig
	}{
		{"hybrid", RenderConfig{Mode: ModeHybrid}},
		{"queue", RenderConfig{Mode: ModeQueue, QueueVariant: QueueNative, FailOpen: true, Queues: 2}},
		{"queue-xt", RenderConfig{Mode: ModeQueue, QueueVariant: QueueXTCompat}},
		{"hybrid-denylog", RenderConfig{Mode: ModeHybrid, DenyLogGroup: 7}},
	}
	for _, sc := range scenarios {
		for _, m := range modes {
			name := strings.TrimSuffix(filepath.Base(sc), ".yaml") + "." + m.suffix
			t.Run(name, func(t *testing.T) {
				got := renderScenario(t, sc, m.cfg)
				golden := filepath.Join("testdata/golden", name+".nft")
				if *update {
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

func TestHybridEqualsKernelInV1(t *testing.T) {
	scenarios, _ := filepath.Glob("testdata/golden/*.yaml")
	for _, sc := range scenarios {
		h := renderScenario(t, sc, RenderConfig{Mode: ModeHybrid})
		k := renderScenario(t, sc, RenderConfig{Mode: ModeKernel})
		h = strings.Replace(h, "(mode hybrid)", "(mode kernel)", 1)
		if diff := cmp.Diff(k, h); diff != "" {
			t.Errorf("%s: hybrid differs from kernel beyond the table comment:\n%s", sc, diff)
		}
		if strings.Contains(h, "queue") {
			t.Errorf("%s: hybrid ruleset queues something", sc)
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
