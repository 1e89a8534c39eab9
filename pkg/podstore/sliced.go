package podstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

// The pod sources, as the pod_source metric and the switch's log name them.
const (
	SourcePods   = "pods"
	SourceSlices = "slices"
)

// Reader is the pod store the controller reads: Store (every Pod) or
// Sliced.
type Reader interface {
	Get(key string) *compile.PodInfo
	List() []*compile.PodInfo
	Len() int
	HasSynced() bool
	Run(ctx context.Context)
}

// SlicedConfig configures a Sliced store.
type SlicedConfig struct {
	// Node is the agent's node: its pods come from Local, and the slices'
	// entries for it are left out.
	Node string
	// Local is the node's Pods (OnNode); Pods is every Pod, watched only
	// while the publisher is away.
	Local, Pods Source
	Slices      SliceSource
	Lease       LeaseWatch
	// StaleAfter is how long after the Lease's last renewal the slices
	// are no longer trusted.
	StaleAfter time.Duration
	Limits     SliceLimits
	// OnSwitch, if set, is called when the store starts reading from
	// source (SourcePods or SourceSlices), with why.
	OnSwitch func(source, reason string)
	// Metrics, if set, receive the slices' counts and errors.
	Metrics *SliceMetrics
}

// DefaultStaleAfter is SlicedConfig.StaleAfter's default: three times
// the publisher's Lease duration (15 s).
const DefaultStaleAfter = 45 * time.Second

// Sliced holds every pod as Store does, read from the publisher's
// PodAddressSlices for other nodes' pods and from the node's own Pods for
// its own (known as with Store, whether the publisher is there or not).
// While the publisher's Lease is stale or absent, a slice may still hold
// a deleted pod's address, which a new pod elsewhere may have taken: the
// store then reads every Pod instead, as Store does, until the Lease is
// fresh again. Each switch replaces the pods in one step once the new
// source holds every pod: no pod known to both is ever absent.
type Sliced struct {
	cfg      SlicedConfig
	log      logr.Logger
	onChange func(key string)
	// union is the pods the controller reads; only its map is used.
	union *Store
	clock leaseClock

	// wmu serializes the writers (the sources' goroutines and the lease
	// check) and their onChange calls; the fields below are under it.
	wmu          sync.Mutex
	source       string // "" until the first source is in use
	local        *Store
	slices       *sliceSet
	slicesSynced bool
	wantSlices   bool
	all          *Store // the fallback, nil when not wanted
	stopAll      context.CancelFunc
	runCtx       context.Context
	started      time.Time
}

// NewSliced returns an empty store that Run fills.
func NewSliced(cfg SlicedConfig, onChange func(key string), log logr.Logger) (*Sliced, error) {
	if cfg.Node == "" || cfg.Lease == nil || cfg.Slices.List == nil || cfg.Pods.Watch == nil || cfg.Local.Watch == nil {
		return nil, errors.New("pod slices: the node, the Lease and the three sources are required")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	if cfg.Limits.Slices <= 0 || cfg.Limits.Pods <= 0 {
		return nil, errors.New("pod slices: the limits must be positive")
	}
	s := &Sliced{cfg: cfg, log: log, onChange: onChange,
		union: New(Source{}, func(string) {}, log), slices: newSliceSet(cfg.Node, cfg.Limits)}
	s.clock.staleAfter = cfg.StaleAfter
	s.local = New(cfg.Local, s.localChanged, log.WithName("local"))
	s.local.onSynced = s.localSynced
	return s, nil
}

// Get returns the pod with the key, nil if there is none.
func (s *Sliced) Get(key string) *compile.PodInfo { return s.union.Get(key) }

// List returns every pod in key order (shared: not to be modified).
func (s *Sliced) List() []*compile.PodInfo { return s.union.List() }

// Len is the number of pods.
func (s *Sliced) Len() int { return s.union.Len() }

// HasSynced reports whether the store has held every pod once, from
// either source.
func (s *Sliced) HasSynced() bool { return s.union.HasSynced() }

// Source returns the source in use ("" before the first).
func (s *Sliced) Source() string {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.source
}

// Run keeps the store in step until ctx ends.
func (s *Sliced) Run(ctx context.Context) {
	s.wmu.Lock()
	s.runCtx, s.started = ctx, time.Now()
	s.wmu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.local.Run(ctx) })
	w := &sliceWatch{src: s.cfg.Slices, replace: s.slicesListed, apply: s.sliceChanged,
		log:      func(msg string, kv ...any) { s.log.Info(msg, kv...) },
		minWatch: 5 * time.Minute, maxWatch: 10 * time.Minute,
		backoff: backoff{min: 800 * time.Millisecond, max: 30 * time.Second}}
	wg.Go(func() { w.run(ctx) })
	wg.Go(func() {
		s.cfg.Lease(ctx, func(l *coordinationv1.Lease) { s.clock.seen(l, time.Now()); s.checkLease() })
	})
	tick := time.NewTicker(min(time.Second, s.cfg.StaleAfter/4))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.wmu.Lock()
			if s.stopAll != nil {
				s.stopAll()
			}
			s.wmu.Unlock()
			return
		case <-tick.C:
			s.checkLease()
		}
	}
}

// checkLease follows the Lease's state: stale, the fallback is started
// (and used once it holds every pod); fresh, the slices are used once
// they and the node's pods are read. Slices that cannot be read within
// StaleAfter of the start (no CRD, no access) start the fallback too.
func (s *Sliced) checkLease() {
	known, fresh := s.clock.fresh(time.Now())
	if !known {
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.wantSlices = fresh
	if fresh {
		s.useSlicesLocked("the publisher's Lease is fresh")
	}
	unread := s.source == "" && !s.slicesSynced && time.Since(s.started) >= s.cfg.StaleAfter
	if (!fresh || unread) && s.all == nil && s.runCtx != nil {
		ctx, cancel := context.WithCancel(s.runCtx)
		var all *Store
		all = New(s.cfg.Pods, func(key string) { s.allChanged(all, key) }, s.log.WithName("all"))
		all.onSynced = func() { s.allSynced(all) }
		s.all, s.stopAll = all, cancel
		why := "the publisher's Lease is stale or absent"
		if fresh {
			why = "the slices could not be read"
		}
		s.log.Info("Reading every pod: "+why, "staleAfter", s.cfg.StaleAfter)
		go all.Run(ctx)
	}
}

// useSlicesLocked switches to the slices if they are wanted and ready,
// and stops the fallback.
func (s *Sliced) useSlicesLocked(reason string) {
	if !s.wantSlices || !s.slicesSynced || !s.local.HasSynced() {
		return
	}
	if s.all != nil {
		s.stopAll()
		s.all, s.stopAll = nil, nil
	}
	if s.source == SourceSlices {
		return
	}
	fresh := make(map[string]*compile.PodInfo, len(s.slices.holders)+s.local.Len())
	s.slices.each(func(p *compile.PodInfo) { fresh[p.Key] = p })
	for _, p := range s.local.List() {
		fresh[p.Key] = p
	}
	s.swapLocked(SourceSlices, fresh, reason)
}

func (s *Sliced) allSynced(all *Store) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if all != s.all || s.source == SourcePods {
		return
	}
	fresh := make(map[string]*compile.PodInfo, all.Len())
	for _, p := range all.List() {
		fresh[p.Key] = p
	}
	reason := "the publisher's Lease is stale or absent"
	if s.wantSlices {
		reason = "the slices could not be read"
	}
	s.swapLocked(SourcePods, fresh, reason)
}

// swapLocked makes fresh the store's pods in one step and tells the
// controller which pods differ.
func (s *Sliced) swapLocked(source string, fresh map[string]*compile.PodInfo, reason string) {
	s.union.mu.Lock()
	old := s.union.pods
	s.union.pods, s.union.sorted = fresh, nil
	s.union.mu.Unlock()
	prev := s.source
	s.source = source
	s.log.Info("Pod source switched", "source", source, "previous", prev, "reason", reason, "pods", len(fresh))
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.setSource(source)
	}
	if s.cfg.OnSwitch != nil {
		s.cfg.OnSwitch(source, reason)
	}
	if !s.union.synced.Load() {
		s.union.synced.Store(true)
		return
	}
	for k, o := range old {
		if n := fresh[k]; n == nil || !samePod(o, n) {
			s.onChange(k)
		}
	}
	for k := range fresh {
		if old[k] == nil {
			s.onChange(k)
		}
	}
}

// setLocked sets the keys' pods in the store, as the source in use has
// them, in one step, and tells the controller.
func (s *Sliced) setLocked(keys []string) {
	if len(keys) == 0 {
		return
	}
	vals := make([]*compile.PodInfo, len(keys))
	for i, k := range keys {
		switch s.source {
		case SourceSlices:
			if vals[i] = s.local.Get(k); vals[i] == nil {
				vals[i] = s.slices.get(k)
			}
		case SourcePods:
			vals[i] = s.all.Get(k)
		}
	}
	u := s.union
	u.mu.Lock()
	for i, k := range keys {
		if vals[i] == nil {
			delete(u.pods, k)
		} else {
			u.pods[k] = vals[i]
		}
	}
	u.sorted = nil
	u.mu.Unlock()
	for _, k := range keys {
		s.onChange(k)
	}
}

func (s *Sliced) localChanged(key string) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.source == SourceSlices {
		s.setLocked([]string{key})
	}
}

func (s *Sliced) localSynced() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.useSlicesLocked("the slices and the node's pods are read")
}

func (s *Sliced) allChanged(all *Store, key string) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.source == SourcePods && all == s.all {
		s.setLocked([]string{key})
	}
}

// slicesListed replaces every slice with a list's.
func (s *Sliced) slicesListed(items []podslice.PodAddressSlice) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var keys []string
	changed := func(k string) { keys = append(keys, k) }
	listed := make(map[string]struct{}, len(items))
	for i := range items {
		sl := &items[i]
		key := sl.Namespace + "/" + sl.Name
		listed[key] = struct{}{}
		s.noteSliceError(s.slices.set(key, sl, changed))
	}
	for key := range s.slices.slices {
		if _, ok := listed[key]; !ok {
			s.slices.set(key, nil, changed)
		}
	}
	s.noteCountsLocked()
	if s.source == SourceSlices {
		s.setLocked(keys)
	}
	s.slicesSynced = true
	s.useSlicesLocked("the slices and the node's pods are read")
}

// sliceChanged applies one event's slice (nil: deleted): the pods it
// adds, changes and drops are set in the store in one step.
func (s *Sliced) sliceChanged(key string, sl *podslice.PodAddressSlice) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var keys []string
	s.noteSliceError(s.slices.set(key, sl, func(k string) { keys = append(keys, k) }))
	s.noteCountsLocked()
	if s.source == SourceSlices {
		s.setLocked(keys)
	}
}

func (s *Sliced) noteSliceError(err error) {
	if err == nil {
		return
	}
	reason := "invalid"
	if errors.Is(err, errOverLimit) {
		reason = "limit"
	}
	s.log.Info("Pod address slice not read whole: its pods left out are unknown (held)", "reason", reason, "err", err.Error())
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Rejected.WithLabelValues(reason).Inc()
	}
}

func (s *Sliced) noteCountsLocked() {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Slices.Set(float64(len(s.slices.slices)))
		s.cfg.Metrics.Entries.Set(float64(s.slices.entries))
	}
}
