package inproc

import (
	"context"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn/wire"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// seedTimeout is the timeout of seeded fqdn elements: scenario answers do
// not expire for the evaluator, so the kernel's must outlast the probes.
const seedTimeout = time.Hour

// DNSLearning is the agent's DNS learning (hybrid and queue modes): the
// learner, its trusted sources and its runtime on the DNS queue.
type DNSLearning struct {
	// Learner learns replies; Sources are the servers it trusts (none
	// until a test sets them).
	Learner *fqdn.Learner
	Sources *fqdn.Sources
	Runtime *queue.Runtime
	Metrics *fqdn.Metrics
	stop    context.CancelFunc
	done    chan error
	onHold  atomic.Pointer[func(time.Duration)]
}

// ObserveHolds makes f receive the hold time of every reply from now on
// (nil: none).
func (d *DNSLearning) ObserveHolds(f func(time.Duration)) { d.onHold.Store(&f) }

// DNS returns the agent's DNS learning; its Learner is nil in kernel mode.
func (a *Agent) DNS() *DNSLearning { return &a.dns }

// answers is the evaluator's resolver: what the learner learned, and what
// a scenario says pods resolved (Seed).
type answers struct {
	l      *fqdn.Learner
	seeded atomic.Pointer[scenario.ResolvedAnswers]
}

func (r *answers) Resolved(pod, peer netip.Addr, ds []compile.DomainPattern) bool {
	return r.l.Resolved(pod, peer, ds) || r.seeded.Load().Resolved(pod, peer, ds)
}

func (a *Agent) startDNS(log logr.Logger) error {
	d := &a.dns
	d.Sources = fqdn.NewSources(nil)
	d.Metrics = fqdn.NewMetrics()
	// A one-second minimum TTL lets expiry tests run in seconds (the
	// agent's default is fqdn.DefaultMinTTL).
	cfg := fqdn.Config{Program: a.eval.Program, Trusted: d.Sources.Contains, FailOpen: a.rcfg.FailOpen, Metrics: d.Metrics, Logger: log,
		MinTTL: time.Second, OnHold: func(t time.Duration) {
			if f := d.onHold.Load(); f != nil && *f != nil {
				(*f)(t)
			}
		}}
	if a.rcfg.Mode != compile.ModeQueue {
		cfg.Writer = wire.Writer{W: a.elements}
	}
	var err error
	if d.Learner, err = fqdn.New(cfg); err != nil {
		return err
	}
	a.eval.Resolved = &answers{l: d.Learner}
	// DNS learning's hooks, as the agent's: pods that left lose their
	// learned elements, new sets get what pods resolved.
	a.hooks.OnProgram(d.Learner.OnProgram)
	a.hooks.OnPodApplied(d.Learner.OnPodApplied)
	rt, err := queue.NewRuntime(wire.RuntimeConfig(a.rcfg, int(a.netns.Fd()), log), wire.Decider{L: d.Learner})
	if err != nil {
		return err
	}
	d.Runtime = rt
	d.stop, d.done, err = a.run(rt, "DNS queue runtime")
	return err
}

// StopDNS stops the DNS queue runtime, as when the agent is down: the
// rule's bypass flag (--fail-open) then decides what replies do.
func (a *Agent) StopDNS() error { return a.stopDNS() }

func (a *Agent) stopDNS() error {
	d := &a.dns
	if d.stop == nil {
		return nil
	}
	d.stop()
	d.stop = nil
	return <-d.done
}

// Seed makes the node know what the scenario's pods resolved, as if they
// had looked their names up: the fqdn sets of the last applied program get
// the elements (hybrid and kernel modes), and the evaluator the answers.
func (a *Agent) Seed(ctx context.Context, s *scenario.Scenario) error {
	if a.Program == nil || len(s.DNSAnswers) == 0 {
		return nil
	}
	if r, ok := a.eval.Resolved.(*answers); ok {
		r.seeded.Store(scenario.NewResolvedAnswers(s))
	} else {
		a.eval.Resolved = scenario.NewResolvedAnswers(s)
	}
	if a.rcfg.Mode == compile.ModeQueue {
		return nil
	}
	var els []fqdn.Element
	for set, es := range scenario.FQDNSeedElements(a.Program, s) {
		for _, e := range es {
			els = append(els, fqdn.Element{Set: set, Pod: e.Pod, Addr: e.Addr, Timeout: seedTimeout})
		}
	}
	if len(els) == 0 {
		return nil
	}
	return wire.Writer{W: a.elements}.WriteElements(ctx, els)
}
