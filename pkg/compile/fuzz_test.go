package compile_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/knftables"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// FuzzCompile feeds scenario bytes (docs/scenario-format.md) to the
// compiler. A scenario that scenario.Parse accepts is built for the cluster
// and for its first node and rendered in every mode; whatever it rejects
// must come back as a *scenario.Error. The policies of any decodable
// document, validated or not (an agent compiles what the API server
// stores, which older servers and hand-made objects leave unvalidated), are
// also built against the scenario's pods when it has valid ones.
// Invariants: no panic; the program and the ruleset do not depend on the
// order of the input's objects (the same text twice); the evaluator gives
// every probe a verdict, the same from both builds.
//
// Seeds: the scenarios of testdata/golden, pkg/scenario/testdata and
// tests/kernel/testdata, and what the fuzzer found, in
// testdata/fuzz/FuzzCompile.
func FuzzCompile(f *testing.F) {
	for _, glob := range []string{"../scenario/testdata/*.yaml", "testdata/golden/*.yaml", "../../tests/kernel/testdata/*.yaml"} {
		files, _ := filepath.Glob(glob)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			return // larger inputs only slow the fuzzer down
		}
		s, err := scenario.Parse(data)
		if err != nil {
			var se *scenario.Error
			if !errors.As(err, &se) {
				t.Fatalf("Parse: an error that is not a scenario.Error: %T %v", err, err)
			}
		}
		if s != nil {
			nodes := s.NodeNames([]string{"node-1", "node-2"})
			for _, node := range []string{"", nodes[0]} {
				checkCompile(t, s, s.Input(node, nodes, nil))
			}
		}
		// The policies alone, unvalidated.
		var raw struct {
			Policies               []networkingv1.NetworkPolicy      `json:"policies"`
			ClusterNetworkPolicies []npav1beta1.ClusterNetworkPolicy `json:"clusterNetworkPolicies"`
		}
		if yaml.Unmarshal(data, &raw) != nil || len(raw.Policies)+len(raw.ClusterNetworkPolicies) == 0 {
			return
		}
		var in compile.Input
		if s != nil {
			in = s.Input("", s.NodeNames([]string{"node-1"}), nil)
		}
		in.Policies, in.ClusterPolicies = nil, nil
		for i := range raw.Policies {
			in.Policies = append(in.Policies, &raw.Policies[i])
		}
		for i := range raw.ClusterNetworkPolicies {
			in.ClusterPolicies = append(in.ClusterPolicies, &raw.ClusterNetworkPolicies[i])
		}
		checkCompile(t, s, in)
	})
}

// checkCompile builds and renders in, and the same input with its objects
// in reverse order, and checks FuzzCompile's invariants.
func checkCompile(t *testing.T, s *scenario.Scenario, in compile.Input) {
	t.Helper()
	rev := in
	rev.Pods = reversed(in.Pods)
	rev.Policies = reversed(in.Policies)
	rev.ClusterPolicies = reversed(in.ClusterPolicies)
	rev.Namespaces = reversed(in.Namespaces)
	rev.Nodes = reversed(in.Nodes)
	a, b := compile.Build(in), compile.Build(rev)
	if pa, pb := problemTexts(a), problemTexts(b); !slices.Equal(pa, pb) {
		t.Fatalf("problems depend on the input's order:\n%v\n%v", pa, pb)
	}
	for _, cfg := range []compile.RenderConfig{
		{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat},
		{Mode: compile.ModeQueue, QueueVariant: compile.QueueNative},
		{Mode: compile.ModeKernel, DenyLogGroup: 1, DenyLogRate: 10, DenyLogBurst: 10},
	} {
		ra, errA := compile.Render(a, cfg)
		rb, errB := compile.Render(b, cfg)
		// Equal rulesets write the same text: the text (the slow part of
		// an input) is made only to compare rulesets that differ.
		if errA == nil && errB == nil && reflect.DeepEqual(ra, rb) {
			continue
		}
		ta, tb := rulesetText(ra, errA), rulesetText(rb, errB)
		if ta != tb {
			t.Fatalf("%s: the ruleset depends on the input's order:\n%s\n----\n%s", cfg.Mode, ta, tb)
		}
	}
	if s == nil {
		return
	}
	for i, p := range s.Probes {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			continue
		}
		proto := p.ProbeProtocol()
		va := evaluate.Evaluate(a, src, dst, proto, uint16(p.Port))
		vb := evaluate.Evaluate(b, src, dst, proto, uint16(p.Port))
		if va.Allowed != vb.Allowed || va.Reason() != vb.Reason() {
			t.Fatalf("probe %d: %s, then %s", i, va.Reason(), vb.Reason())
		}
	}
}

func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

func problemTexts(p *compile.Program) []string {
	var out []string
	for _, pr := range p.Problems {
		out = append(out, pr.Error())
	}
	slices.Sort(out)
	return out
}

// rulesetText writes a rendered ruleset as nft commands; a render error
// must be an error, and the same every time.
func rulesetText(rs *compile.Ruleset, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	tx := knftables.NewFake(knftables.InetFamily, compile.TableName).NewTransaction()
	rs.AddTo(tx)
	return tx.String()
}

// renderText renders the program and writes the ruleset as nft commands.
func renderText(t *testing.T, p *compile.Program, cfg compile.RenderConfig) string {
	t.Helper()
	return rulesetText(compile.Render(p, cfg))
}
