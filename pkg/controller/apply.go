package controller

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// Hooks are what runs after the Applier's steps: the program hooks after
// each publication, with the previous program (nil at first) and the new
// one (conntrack revocation, DNS learning's clean-up, the pod-range
// warning), and the pod hooks with each pod change the tracker applies,
// before its elements are written (DNS learning deletes a departed pod's
// learned elements before a new pod can hold its address). They run in
// the order added, from the goroutine that drives the Applier; add them
// before it runs.
type Hooks struct {
	program []func(old, cur *compile.Program)
	pods    []func(key string, pod *compile.PodInfo)
}

// OnProgram adds a program hook; nil adds none.
func (h *Hooks) OnProgram(f func(old, cur *compile.Program)) {
	if f != nil {
		h.program = append(h.program, f)
	}
}

// OnPodApplied adds a pod hook; nil adds none.
func (h *Hooks) OnPodApplied(f func(key string, pod *compile.PodInfo)) {
	if f != nil {
		h.pods = append(h.pods, f)
	}
}

func (h *Hooks) runProgram(old, cur *compile.Program) {
	if h == nil {
		return
	}
	for _, f := range h.program {
		f(old, cur)
	}
}

func (h *Hooks) runPod(key string, pod *compile.PodInfo) {
	if h == nil {
		return
	}
	for _, f := range h.pods {
		f(key, pod)
	}
}

// ApplierConfig configures an Applier.
type ApplierConfig struct {
	Render compile.RenderConfig
	// Syncer writes the node's table.
	Syncer *sets.Syncer
	// Evaluator receives each program after its transaction committed.
	Evaluator *evaluate.Evaluator
	// Hooks run after its steps; nil: none.
	Hooks *Hooks
	// Committed, when not nil, is told the time of each transaction of
	// ApplyPods that carried applied pod changes: the kernel is then ahead
	// of the program published until the caller publishes the derived one.
	Committed func(at time.Time)
	// DeriveBeforeCommit derives the program of ApplyPods' changes before
	// their last transaction (Tracker.Program), so that the caller can
	// publish it as soon as the transaction commits: queue mode, where the
	// evaluator decides every selected pod's connections.
	DeriveBeforeCommit bool
}

// Applier is the agent's sequence from a change to the program in force:
// apply it (the tracker, in every mode), commit the transaction that enforces it (pkg/sets), publish
// the program to the evaluator, run the hooks. The Controller drives one
// from its informers; the in-process test harness (tests/internal/inproc)
// drives one from scenarios, so both run this code. Not safe for
// concurrent use: one sync loop drives it.
type Applier struct {
	cfg ApplierConfig
	// tracker is the incremental compiler, in every mode (in queue mode a
	// policy change falls back to a full build: compile.FallbackQueueMode).
	tracker *compile.Tracker
	// program is the last one published.
	program *compile.Program
}

// NewApplier returns the Applier of cfg; its Render must be valid.
func NewApplier(cfg ApplierConfig) (*Applier, error) {
	if cfg.Syncer == nil {
		return nil, errors.New("applier: syncer is required")
	}
	if cfg.Evaluator == nil {
		return nil, errors.New("applier: evaluator is required")
	}
	t, err := compile.NewTracker(cfg.Render)
	if err != nil {
		return nil, err
	}
	return &Applier{cfg: cfg, tracker: t}, nil
}

// Tracker is the Applier's incremental compiler.
func (a *Applier) Tracker() *compile.Tracker { return a.tracker }

// Program is the last program published (nil before the first).
func (a *Applier) Program() *compile.Program { return a.program }

// Build builds and renders in from scratch through the tracker, which
// tracks from there.
func (a *Applier) Build(in compile.Input) (*compile.Program, *compile.Ruleset, error) {
	return a.tracker.Rebuild(in)
}

// Release drops what the tracker holds of the last build (Tracker.Reset)
// before a Build, which does not read it: collected first, it does not add
// to the build's peak. Until the Build, pod and policy changes fall back.
func (a *Applier) Release() { a.tracker.Reset() }

// Commit makes the kernel's table rs in one transaction: the difference
// from the last ruleset committed, or after ForceFull the whole table
// compared with the kernel's.
func (a *Applier) Commit(ctx context.Context, rs *compile.Ruleset) (sets.Result, error) {
	return a.cfg.Syncer.Sync(ctx, rs)
}

// ForceFull makes the next commit a full sync, which repairs any change
// made to the table behind the agent's back.
func (a *Applier) ForceFull() { a.cfg.Syncer.ForceFull() }

// Publish makes prog the evaluator's program, after the transaction that
// enforces it committed, and runs the program hooks; it returns the
// program it replaced.
func (a *Applier) Publish(prog *compile.Program) (old *compile.Program) {
	old, a.program = a.program, prog
	a.cfg.Evaluator.Swap(prog)
	a.cfg.Hooks.runProgram(old, prog)
	return old
}

// ApplyPolicy applies one NetworkPolicy change (np nil: deleted, key its
// namespace/name) through the tracker; a fallback leaves the tracker for a
// Build and nothing was changed. CommitPolicies writes what was applied.
func (a *Applier) ApplyPolicy(key string, np *networkingv1.NetworkPolicy) compile.Fallback {
	return a.tracker.ApplyPolicy(key, np)
}

// ApplyClusterPolicy is ApplyPolicy for a ClusterNetworkPolicy.
func (a *Applier) ApplyClusterPolicy(name string, cnp *npav1beta1.ClusterNetworkPolicy) compile.Fallback {
	return a.tracker.ApplyClusterPolicy(name, cnp)
}

// ApplyNamespace applies one Namespace change (ns nil: deleted) through
// the tracker, as ApplyPolicy does; CommitPolicies writes what was
// applied.
func (a *Applier) ApplyNamespace(name string, ns *corev1.Namespace) compile.Fallback {
	return a.tracker.ApplyNamespace(name, ns)
}

// CommitPolicies commits the tracked ruleset after policy and namespace
// changes.
func (a *Applier) CommitPolicies(ctx context.Context) (sets.Result, error) {
	return a.cfg.Syncer.Sync(ctx, a.tracker.Ruleset())
}

// PodsApplied is what ApplyPods did.
type PodsApplied struct {
	// Applied pod changes went through the tracker; Reshaped of them made
	// a new ruleset (a combination chain created or deleted).
	Applied, Reshaped int
	// Fallback is the reason the pod FallbackKey needs a full build (the
	// changes before it are committed, it and those after are not);
	// NoFallback when every change was applied.
	Fallback    compile.Fallback
	FallbackKey string
	// Result sums the transactions' results.
	Result sets.Result
}

// ApplyPods applies the pod changes of keys (get reads each: nil,
// deleted) through the tracker and commits their elements, in one
// transaction unless a change makes a new ruleset. For each change
// applied, note runs (when not nil), then the pod hooks, before its
// elements are written. It stops at the first change that needs a full
// build (PodsApplied.Fallback). The program is not published: the tracker
// derives it (Tracker.Program) when the caller chooses, or before the last
// transaction with DeriveBeforeCommit.
func (a *Applier) ApplyPods(ctx context.Context, keys []string, get func(key string) *compile.PodInfo,
	note func(key string, pod *compile.PodInfo)) (PodsApplied, error) {
	var out PodsApplied
	var delta compile.Delta
	write := func(rs *compile.Ruleset) error {
		r, err := a.cfg.Syncer.ApplyDelta(ctx, rs, delta)
		if err == nil && out.Applied > 0 && a.cfg.Committed != nil {
			a.cfg.Committed(time.Now())
		}
		delta = nil
		res := &out.Result
		res.Full = res.Full || r.Full
		res.Netlink = res.Netlink || r.Netlink
		res.ElementsAdded += r.ElementsAdded
		res.ElementsDeleted += r.ElementsDeleted
		res.ChainsWritten += r.ChainsWritten
		res.ChainsDeleted += r.ChainsDeleted
		return err
	}
	for _, key := range keys {
		pod := get(key)
		prev := a.tracker.Ruleset()
		d, f := a.tracker.ApplyPodInfo(key, pod)
		if f != compile.NoFallback {
			out.Fallback, out.FallbackKey = f, key
			break
		}
		out.Applied++
		if note != nil {
			note(key, pod)
		}
		a.cfg.Hooks.runPod(key, pod)
		if rs := a.tracker.Ruleset(); rs != prev {
			// The pod created or deleted a combination chain: the tracker
			// has a new ruleset. The earlier pods' elements go first, to
			// the ruleset they were applied to (a second transaction only
			// when other pods came before this one in the sync); then the
			// difference of the new one and this pod's elements.
			out.Reshaped++
			if len(delta) > 0 {
				if err := write(prev); err != nil {
					return out, err
				}
			}
			delta = d
			if err := write(rs); err != nil {
				return out, err
			}
			continue
		}
		delta = append(delta, d...)
	}
	if out.Applied > 0 && a.cfg.DeriveBeforeCommit {
		a.tracker.Program()
	}
	if err := write(a.tracker.Ruleset()); err != nil {
		return out, err
	}
	return out, nil
}
