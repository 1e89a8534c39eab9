package compile_test

import (
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariogen"
)

// programDiff compares a program the tracker derived with a full build of
// the same objects: every part the evaluator, explain and the snapshot
// read, the evaluator's index included. Policies' Cost and NamespaceCosts
// are left out: the build charges a policy for the pods its selectors
// were matched against, which pod changes move, and the tracker keeps the
// last build's charges (tracker_budget.go bounds policy changes with them).
func programDiff(want, got *compile.Program) string {
	// reflect.DeepEqual first: cmp is tens of times slower, and the
	// random sequences compare a program at every step.
	if reflect.DeepEqual(programParts(want), programParts(got)) {
		return ""
	}
	opts := []cmp.Option{
		cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}),
		cmpopts.IgnoreFields(compile.Policy{}, "Cost"), cmpopts.IgnoreFields(compile.ClusterPolicy{}, "Cost"),
		cmp.Exporter(func(reflect.Type) bool { return true }),
	}
	return cmp.Diff(
		[]any{want.Node, want.NodeIPs, want.Pods, want.Policies, want.Selectors, want.Tables, want.Problems, want.ClusterPolicies,
			want.NodeSets, want.NodeAddrs, want.PodCIDRs, want.NamespaceLabels, want.Eval, want.StagedPolicies},
		[]any{got.Node, got.NodeIPs, got.Pods, got.Policies, got.Selectors, got.Tables, got.Problems, got.ClusterPolicies,
			got.NodeSets, got.NodeAddrs, got.PodCIDRs, got.NamespaceLabels, got.Eval, got.StagedPolicies}, opts...)
}

// programParts is what programDiff compares, policies' charges left out.
func programParts(p *compile.Program) []any {
	pols := slices.Clone(p.Policies)
	for i := range pols {
		pols[i].Cost = 0
	}
	cpols := slices.Clone(p.ClusterPolicies)
	for i := range cpols {
		cpols[i].Cost = 0
	}
	return []any{p.Node, p.NodeIPs, p.Pods, pols, p.Selectors, p.Tables, p.Problems, cpols,
		p.NodeSets, p.NodeAddrs, p.PodCIDRs, p.NamespaceLabels, p.Eval, p.StagedPolicies}
}

// checkProgram compares the tracker's program, unless a policy change
// left it behind (Stale), with the full build of the objects, and the
// build of the program's own input (Source, which the snapshot saves)
// with it; it reports whether it compared.
func checkProgram(t *testing.T, tr *compile.Tracker, want *compile.Program, where func() string) bool {
	t.Helper()
	if tr.Stale() {
		return false
	}
	got := tr.Program()
	if diff := programDiff(want, got); diff != "" {
		t.Fatalf("%s: tracked program differs from the full build (-full +tracked):\n%s", where(), diff)
	}
	if diff := programDiff(want, compile.Build(got.Source)); diff != "" {
		t.Fatalf("%s: the build of the tracked program's input differs from the full build (-full +source):\n%s", where(), diff)
	}
	return true
}

// TestDerivedProgramsStayIntact checks that deriving a program for pod
// changes never writes one published before, which the evaluator may still
// read: every program the tracker returned stays equal to the build of the
// objects it was derived for, in hybrid and in queue mode (where the
// evaluator decides every connection of the pods policies select).
func TestDerivedProgramsStayIntact(t *testing.T) {
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeQueue} {
		t.Run(string(mode), func(t *testing.T) { testDerivedProgramsStayIntact(t, compile.RenderConfig{Mode: mode}) })
	}
}

func testDerivedProgramsStayIntact(t *testing.T, cfg compile.RenderConfig) {
	for seed := uint64(1); seed <= 12; seed++ {
		w := newWorld(seed, scenariogen.Nodes[int(seed)%len(scenariogen.Nodes)])
		tr, _ := newTracker(t, cfg, w)
		type published struct {
			prog *compile.Program
			ref  *compile.Program
		}
		var all []published
		derived := 0
		// A reader walks the published program while the next ones are
		// derived, as the evaluator does: under the race detector, a
		// write to anything it reads fails the test.
		var cur atomic.Pointer[compile.Program]
		cur.Store(tr.Program())
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
					readProgram(cur.Load())
				}
			}
		}()
		for step := 0; step < 60; step++ {
			key, p, _ := w.podEvent()
			prev := tr.Program()
			if _, f := tr.ApplyPod(key, p); f != compile.NoFallback {
				if _, _, err := tr.Rebuild(w.input()); err != nil {
					t.Fatal(err)
				}
			}
			if prog := tr.Program(); prog != prev {
				cur.Store(prog)
				derived++
				all = append(all, published{prog, compile.Build(w.input())})
			}
			if n := len(all); n >= 2 {
				// The one before the last, which the last was derived from.
				if diff := programDiff(all[n-2].ref, all[n-2].prog); diff != "" {
					t.Fatalf("seed %d step %d: the program before changed after it was published (-built +now):\n%s", seed, step, diff)
				}
			}
		}
		close(done)
		wg.Wait()
		for i, pub := range all {
			if diff := programDiff(pub.ref, pub.prog); diff != "" {
				t.Fatalf("seed %d: program %d changed after it was published (-built +now):\n%s", seed, i, diff)
			}
		}
		if derived < 20 {
			t.Fatalf("seed %d: only %d of 60 pod changes published a program", seed, derived)
		}
	}
}

// readSink keeps readProgram's reads from being optimized away.
var readSink int

// readProgram reads what the evaluator and explain read of a program.
func readProgram(p *compile.Program) {
	n := 0
	for i := range p.Pods {
		pod := &p.Pods[i]
		n += len(pod.MemberOf) + len(pod.IPs) + len(pod.IngressPolicies) + len(pod.EgressPolicies) + len(pod.AdminIngress) + len(pod.BaselineEgress)
		n += int(pod.IngressTable) + int(pod.EgressTable) + len(pod.IngressDenied) + len(pod.EgressDenied)
		for _, ip := range pod.IPs {
			if r := p.Eval.RecordByAddr(ip); r != nil {
				n += int(r.ID) + int(r.IngressTable) + int(r.Tiers) + len(p.Eval.MemberOf(r))
				n += len(p.DeniedReason(r, compile.Ingress)) + len(p.DeniedReason(r, compile.Egress))
			}
		}
	}
	for i := range p.Selectors {
		n += len(p.Selectors[i].Members)
	}
	for i := range p.Policies {
		n += len(p.Policies[i].Selected)
	}
	for i := range p.ClusterPolicies {
		n += len(p.ClusterPolicies[i].Subjects)
	}
	for i := range p.Tables {
		n += len(p.Tables[i].BySelector)
	}
	n += len(p.Eval.TableData) + len(p.Eval.Members) + len(p.Eval.Denied) + len(p.Source.PodInfos) + len(p.NamespaceLabels)
	readSink = n
}
