package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// Config configures the Controller.
type Config struct {
	Client kubernetes.Interface
	// PodClient, when set (slim.NewPodClient), is what the pod store
	// (pkg/podstore) streams pods through: they are decoded from the wire
	// straight into their stored form. Without it, pods are listed and
	// watched through Client, decoded whole and then slimmed.
	PodClient rest.Interface
	// PodStore, when set, makes the pod store instead of a pkg/podstore
	// Store of every Pod (the agent's podSource: slices, podstore.Sliced);
	// onChange is called with the key of each pod changed.
	PodStore func(onChange func(key string)) (podstore.Reader, error)
	// PolicyClient reads ClusterNetworkPolicies; nil enforces NetworkPolicy
	// v1 only.
	PolicyClient npaclient.Interface
	// ClusterPolicyCheckPeriod is how often discovery is asked whether the
	// ClusterNetworkPolicy API is served (its CRD may come and go).
	ClusterPolicyCheckPeriod time.Duration
	NodeName                 string
	// NodeIPs are the node's own addresses; looked up from the Node object
	// when empty.
	NodeIPs []netip.Addr
	// PodCIDRs, when set, replace the Nodes' spec.podCIDRs as the pod
	// ranges in which unknown addresses are held for the evaluator.
	PodCIDRs []netip.Prefix
	Render   compile.RenderConfig
	Syncer   *sets.Syncer
	// Evaluator receives each program after its transaction committed.
	Evaluator *evaluate.Evaluator
	// Hooks run from the sync loop (the Applier's: Hooks): the program
	// hooks after each publication, with the previous program (nil at
	// first) and the new one (conntrack revocation, pkg/conntrack, cuts
	// flows the change denies); the pod hooks with each pod change the
	// tracker applies incrementally (pod nil: deleted), before its
	// elements are written and long before the program that has it is
	// published (DNS learning, pkg/fqdn, deletes a departed pod's learned
	// elements before a new pod can hold its address). nil: none.
	Hooks *Hooks
	// OnStatus, if set, is called from the sync loop after a commit with
	// what it put in force (status.go): the watermarks (per kind, every
	// policy change up to them is in the kernel; they never decrease), the
	// policy changes this commit programmed, and every policy enforced
	// fail-closed in the program in force. Only commits that change what
	// the node reports are handed over (the first one, the first after
	// failed syncs, a raised watermark, programmed policy changes, changed
	// problems); commits of pod changes alone are not.
	OnStatus func(status.Publication)
	// OnSyncFailed, if set, is called from the sync loop after each failed
	// sync with its error and time; the kernel keeps the last commit.
	OnSyncFailed func(err error, at time.Time)
	Metrics      *Metrics
	// Recorder emits Events on invalid policies; optional.
	Recorder record.EventRecorder
	// FullSyncPeriod forces a full sync now and then, repairing any change
	// made to the table behind the agent's back.
	FullSyncPeriod time.Duration
	// MinRetryDelay and MaxRetryDelay bound the backoff after failed syncs.
	MinRetryDelay, MaxRetryDelay time.Duration
	// ResyncPeriod of the informers (0: none).
	ResyncPeriod time.Duration
	// ProgramRefreshDelay is how long after policy changes applied
	// incrementally (hybrid mode) the program the evaluator and explain
	// read is rebuilt, at least: policy changes reach the kernel at once,
	// the program within this delay or twice the last build's duration,
	// whichever is longer, of the first change it follows (the changes
	// after it do not postpone it), plus the time to build it, which
	// runs off the sync loop. Pod changes publish their program with
	// their transaction.
	ProgramRefreshDelay time.Duration
	// MemoryReleaser returns the memory full builds free to the OS; nil:
	// one of the controller's own, with DefaultMemoryReleaseDelay. Share
	// it with other sources of garbage (the program snapshot).
	MemoryReleaser *MemoryReleaser
	Logger         klog.Logger
	// Budgets bound what NetworkPolicies make, each and per namespace
	// (compile.Budgets; zero fields take their defaults).
	Budgets compile.Budgets
}

// DefaultProgramRefreshDelay is Config.ProgramRefreshDelay's default.
const DefaultProgramRefreshDelay = 100 * time.Millisecond

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.FullSyncPeriod == 0 {
		c.FullSyncPeriod = 10 * time.Minute
	}
	if c.MinRetryDelay == 0 {
		c.MinRetryDelay = 100 * time.Millisecond
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = 30 * time.Second
	}
	if c.ClusterPolicyCheckPeriod == 0 {
		c.ClusterPolicyCheckPeriod = DefaultClusterPolicyCheckPeriod
	}
	if c.ProgramRefreshDelay == 0 {
		c.ProgramRefreshDelay = DefaultProgramRefreshDelay
	}
	if c.Evaluator == nil {
		c.Evaluator = &evaluate.Evaluator{}
	}
	if c.MemoryReleaser == nil {
		c.MemoryReleaser = NewMemoryReleaser(DefaultMemoryReleaseDelay)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	c.Render.Defaults()
}

// Validate reports an unusable configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Budgets.Policy < 0 || c.Budgets.Namespace < 0 || c.Budgets.ClusterPolicy < 0 {
		errs = append(errs, fmt.Errorf("cost budgets %d (policy), %d (namespace), %d (cluster policy): must not be negative",
			c.Budgets.Policy, c.Budgets.Namespace, c.Budgets.ClusterPolicy))
	}
	if c.Client == nil {
		errs = append(errs, errors.New("client is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.Syncer == nil {
		errs = append(errs, errors.New("syncer is required"))
	}
	if c.ProgramRefreshDelay < 0 {
		errs = append(errs, fmt.Errorf("program refresh delay %v: must not be negative", c.ProgramRefreshDelay))
	}
	if c.ClusterPolicyCheckPeriod < 0 {
		errs = append(errs, fmt.Errorf("cluster policy check period %v: must not be negative", c.ClusterPolicyCheckPeriod))
	}
	if err := c.Render.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Controller watches NetworkPolicies, ClusterNetworkPolicies, Namespaces,
// Pods and Nodes and keeps the
// kernel and the evaluator programmed. Event handlers only mark the state
// dirty; one loop compiles and applies.
type Controller struct {
	cfg     Config
	factory informers.SharedInformerFactory
	// pods holds every pod, in its stored form.
	pods   podstore.Reader
	nss    corelisters.NamespaceLister
	pols   networkinglisters.NetworkPolicyLister
	nodes  corelisters.NodeLister
	cnps   *clusterPolicies
	synced []cache.InformerSynced

	// polStore is the policy informer's store, read by key (policies.go).
	polStore cache.Indexer

	dirty chan struct{}
	mu    sync.Mutex
	// firstUnsynced is when the oldest change not yet in the kernel was observed.
	firstUnsynced time.Time
	// rebuild is set by a change that is not a pod's (or a failure): the
	// next sync builds everything; podKeys are the pods changed since the
	// last sync, applied one by one by the tracker otherwise.
	rebuild bool
	podKeys map[string]struct{}
	// podNoted, if set, runs at the start of every pod notification
	// (tests: handlers as slow as a large cluster's initial list).
	podNoted func()
	// passStarted, if set, runs at the start of every sync (tests: hold
	// the loop while changes pile up); policyCost, if set, replaces the
	// measured cost of applying a policy change (tests: an expensive
	// namespace without a large cluster).
	passStarted func()
	policyCost  func(key string, measured time.Duration) time.Duration

	// policyKeys are the NetworkPolicies changed since the last sync, applied
	// one by one by the tracker (policies.go); policyHashes are their
	// fingerprint terms, by key, as podHashes are the pods'.
	policyKeys   map[string]struct{}
	policyHashes map[string]uint64
	// nsKeys are the Namespaces changed since the last sync, applied one by
	// one by the tracker (namespaces.go); nsHashes are their fingerprint
	// terms, by name.
	nsKeys   map[string]struct{}
	nsHashes map[string]uint64
	// seenMarks and pendingChanges are the policy handlers' side of the
	// node's status (status.go): the highest resourceVersions seen per
	// kind, and the policy changes no sync took yet, by key.
	seenMarks      status.Watermarks
	pendingChanges map[string]policyChange

	// apply is the sequence apply, commit, publish, run the hooks
	// (apply.go); tracker is its incremental compiler, in every mode. In
	// queue mode the evaluator decides every selected pod's connections,
	// so the program of a pod change is derived before its kernel
	// transaction and published right after it, never paced
	// (publishDerived), and a policy change is a full build
	// (compile.FallbackQueueMode).
	apply   *Applier
	tracker *compile.Tracker
	// podHashes are the fingerprint terms of the synced pods, by key, and
	// inputsSum the sum of all terms (InputsFingerprint before mixing).
	podHashes map[string]uint64
	inputsSum uint64
	// refresh fires when the program should be rebuilt after incremental
	// pod changes, at refreshDue (zero: not armed); lastBuild is how long
	// the last full build took.
	refresh    *time.Timer
	refreshDue time.Time
	// refreshYielded is set when the refresh let the incremental changes
	// pending when it fired go first; it yields once.
	refreshYielded bool
	lastBuild      time.Duration
	// offloopDone receives the off-loop refresh build (one at a time:
	// offloopBusy); offloopDiscards counts those overtaken by changes in
	// a row; offloopBuilding, if set, runs at the start of each (tests:
	// hold the build while changes are applied).
	offloopDone     chan offloopResult
	offloopBusy     bool
	offloopDiscards int
	offloopBuilding func()
	// unchecked is set when pod changes were applied incrementally since
	// the last full build: the consistency check rebuilds after them
	// (scheduleRefresh).
	unchecked bool
	// checkDelay replaces consistencyCheckDelay when set (tests).
	checkDelay time.Duration
	// derivePending is set when pod changes were applied since the last
	// program was published; derive fires at deriveDue (zero: not armed)
	// to publish it, no sooner than deriveNext (publishDerived).
	derivePending bool
	derive        *time.Timer
	deriveDue     time.Time
	deriveNext    time.Time
	// deriveGap, when set, is the least time between two derivations
	// (tests).
	deriveGap time.Duration
	// unpublished is when the first kernel transaction whose program is
	// not published yet committed (zero: none): publish observes the
	// evaluator's lag behind the kernel from it (ProgramLag).
	unpublished time.Time
	// fair is what each namespace's policy changes cost the loop
	// (fairshare.go); rebuildFor is the policy change of this sync that
	// needed a full build.
	fair       *fairShare
	rebuildFor string

	ready       atomic.Bool
	lastSync    atomic.Int64  // unix nanoseconds of the last successful sync
	lastInputs  atomic.Uint64 // InputsFingerprint of the last successful sync
	lastLoop    atomic.Int64  // unix nanoseconds the loop last ran or waited
	reported    map[string]string
	lastProgram atomic.Pointer[compile.Program]
	// gcPercent is GOGC outside full builds (and the initial lists).
	gcPercent int
	// status is the sync loop's side of the node's status.
	status statusState
	// repair is the sync loop's side of repairs of outside changes
	// (repair.go).
	repair repairState
}

// New creates the controller and its informers.
func New(cfg Config) (*Controller, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("controller config: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, informers.WithTransform(slim.Transform))
	c := &Controller{
		cfg:       cfg,
		factory:   f,
		dirty:     make(chan struct{}, 1),
		reported:  map[string]string{},
		gcPercent: currentGCPercent(),
		podKeys:   map[string]struct{}{},
		rebuild:   true,
		refresh:   time.NewTimer(time.Hour),
		derive:    time.NewTimer(time.Hour),
		fair:      newFairShare(),
		// One off-loop build at a time: its result never waits.
		offloopDone: make(chan offloopResult, 1),
	}
	c.refresh.Stop()
	c.derive.Stop()
	c.policyKeys = map[string]struct{}{}
	c.nsKeys = map[string]struct{}{}
	c.pendingChanges = map[string]policyChange{}
	c.status = newStatusState()
	c.repair = newRepairState()
	a, err := NewApplier(ApplierConfig{Render: cfg.Render, Syncer: cfg.Syncer, Evaluator: cfg.Evaluator, Hooks: cfg.Hooks,
		Committed: c.kernelAhead, DeriveBeforeCommit: !c.pacedDerivation()})
	if err != nil {
		return nil, fmt.Errorf("controller config: %w", err)
	}
	c.apply, c.tracker = a, a.Tracker()
	// Healthy from the start: the health server may be asked before Run.
	c.lastLoop.Store(time.Now().UnixNano())
	src := podstore.ClientsetSource(cfg.Client)
	if cfg.PodClient != nil {
		src = podstore.RESTSource(cfg.PodClient)
	}
	c.pods = podstore.New(src, c.markPod, cfg.Logger.WithName("pods"))
	if cfg.PodStore != nil {
		p, err := cfg.PodStore(c.markPod)
		if err != nil {
			return nil, fmt.Errorf("controller config: pod store: %w", err)
		}
		c.pods = p
	}
	c.synced = append(c.synced, c.pods.HasSynced)
	nsInf := f.Core().V1().Namespaces()
	polInf := f.Networking().V1().NetworkPolicies()
	nodeInf := f.Core().V1().Nodes()
	c.nss, c.pols, c.nodes = nsInf.Lister(), polInf.Lister(), nodeInf.Lister()
	c.polStore = polInf.Informer().GetIndexer()
	c.cnps = newClusterPolicies(cfg.PolicyClient, cfg.ClusterPolicyCheckPeriod, cfg.ResyncPeriod,
		cfg.Logger.WithName("clusterpolicies"), cfg.Metrics, c.markDirty)
	c.cnps.changedPolicy = c.markPolicy
	for inf, h := range map[cache.SharedIndexInformer]cache.ResourceEventHandler{nsInf.Informer(): c.namespaceHandler(), polInf.Informer(): c.policyHandler()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
		c.synced = append(c.synced, inf.HasSynced)
	}
	if err := c.watchNodes(nodeInf.Informer()); err != nil {
		return nil, err
	}
	return c, nil
}

// added returns an informer's AddFunc that notes objects added after its
// initial list. The first sync builds from the informers' stores, which
// hold every object of the initial lists once the informers report synced;
// the handlers' notifications of those objects come later (each is a
// hand-off between goroutines). Noted, they would follow the first sync as
// changes: a second full build. Waiting for the handlers instead (their
// registrations' HasSynced) would delay the first sync. (The pod store
// does not notify its first sync's pods at all.)
func added(note func(any)) func(obj any, isInInitialList bool) {
	return func(obj any, isInInitialList bool) {
		if !isInInitialList {
			note(obj)
		}
	}
}

// markDirty records a change that needs a full build.
func (c *Controller) markDirty() {
	c.mu.Lock()
	c.rebuild = true
	c.noteChangeLocked()
	c.mu.Unlock()
	c.wake()
}

// markPod records a pod change, which the tracker can apply alone.
func (c *Controller) markPod(key string) {
	if c.podNoted != nil {
		c.podNoted()
	}
	c.mu.Lock()
	c.podKeys[key] = struct{}{}
	c.noteChangeLocked()
	c.mu.Unlock()
	c.wake()
}

func (c *Controller) noteChangeLocked() {
	if c.firstUnsynced.IsZero() {
		c.firstUnsynced = time.Now()
	}
}

func (c *Controller) wake() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// Ready reports whether a first sync has committed and no outside change
// of the table waits for its repair (repair.go). It turns true before the
// evaluator receives the first program.
func (c *Controller) Ready() bool { return c.ready.Load() && !c.repair.outside.Load() }

// Healthy reports whether the agent is making progress: the sync loop ran
// or waited, or the informers were still waiting for their first lists,
// within the given time. It says nothing about readiness.
func (c *Controller) Healthy(within time.Duration) bool {
	return time.Since(time.Unix(0, c.lastLoop.Load())) < within
}

// LastSync is the time of the last successful sync.
func (c *Controller) LastSync() time.Time { return time.Unix(0, c.lastSync.Load()) }

// SyncedInputs is the InputsFingerprint of the objects the last successful
// sync was compiled from; 0 before the first.
func (c *Controller) SyncedInputs() uint64 { return c.lastInputs.Load() }

// NodeUID is the UID of the node's Node object in the informer's cache;
// empty before the caches synced, or without a Node object.
func (c *Controller) NodeUID() types.UID {
	node, err := c.nodes.Get(c.cfg.NodeName)
	if err != nil {
		return ""
	}
	return node.UID
}

// Program returns the program of the last successful sync.
func (c *Controller) Program() *compile.Program { return c.lastProgram.Load() }

// Run starts the informers, waits for their caches (nothing is written to
// the kernel before), then syncs until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	log := c.cfg.Logger.WithName("controller")
	c.lastLoop.Store(time.Now().UnixNano())
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	podsDone := make(chan struct{})
	go func() { defer close(podsDone); c.pods.Run(ctx) }()
	defer func() { <-podsDone }()
	go c.cnps.run(ctx)
	log.Info("Waiting for informer caches", "node", c.cfg.NodeName)
	// The first lists of a large cluster can take longer than the liveness
	// probe's budget. The agent is making progress while it waits (the
	// reflectors retry on their own), so the heartbeat goes on; readiness
	// stays false until the first commit.
	var synced bool
	// The initial lists keep nearly all they allocate (every pod of the
	// cluster): at the default GOGC the collector would mark the growing
	// heap again and again to free little. The build's GOGC stays on into
	// the first full build, which starts with a collection and ends
	// setting the usual GOGC (restored here, it would start a collection
	// of its own just before).
	c.gcPercent = debug.SetGCPercent(fullBuildGCPercent)
	c.beatWhile(func() { synced = waitSynced(ctx, c.synced) })
	if !synced {
		return fmt.Errorf("waiting for informer caches: %w", context.Cause(ctx))
	}
	c.beatWhile(func() { c.cnps.waitFirst(ctx) })
	if len(c.cfg.NodeIPs) == 0 {
		c.cfg.NodeIPs = c.lookupNodeIPs()
	}
	log.Info("Caches synced; programming", "node", c.cfg.NodeName, "nodeIPs", c.cfg.NodeIPs, "mode", c.cfg.Render.Mode)
	c.markDirty()
	fullTicker := time.NewTicker(c.cfg.FullSyncPeriod)
	defer fullTicker.Stop()
	heartbeat := time.NewTicker(heartbeatInterval)
	defer heartbeat.Stop()
	retry := c.cfg.MinRetryDelay
	var retryTimer <-chan time.Time
	defer c.refresh.Stop()
	defer c.derive.Stop()
	for {
		c.lastLoop.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			log.Info("Stopping; the ruleset stays in place")
			return nil
		case <-heartbeat.C:
			continue
		case <-fullTicker.C:
			c.apply.ForceFull()
			c.mu.Lock()
			c.rebuild = true
			c.mu.Unlock()
		case <-c.derive.C:
			c.deriveDue = time.Time{}
			c.publishDerived()
			continue
		case <-c.refresh.C:
			// Bring the program up to date with the changes applied
			// incrementally: off the loop after policy changes, or the
			// rebuild that also checks the tracker.
			if !c.refreshFired() {
				continue
			}
		case r := <-c.offloopDone:
			if !c.offloopFinished(ctx, r) {
				continue
			}
		case <-c.dirty:
		case <-c.repair.wake:
			if !c.beginRepair() {
				continue
			}
		case <-c.repair.timer:
			c.repairTimerFired()
			if !c.beginRepair() {
				continue
			}
		case <-retryTimer:
			retryTimer = nil
		}
		if retryTimer != nil {
			continue // a retry is pending; it will pick this change up
		}
		if err := c.syncWriting(ctx); err != nil {
			if ctx.Err() != nil {
				log.Info("Stopping; the ruleset stays in place")
				return nil
			}
			log.Error(err, "Sync failed; retrying with a full sync", "retryIn", retry)
			c.syncFailed(err)
			retryTimer = time.After(retry)
			retry = min(retry*2, c.cfg.MaxRetryDelay)
			continue
		}
		c.repairSynced()
		retry = c.cfg.MinRetryDelay
	}
}

// heartbeatInterval is how often the loop (or a wait on the API server in
// its place) marks itself alive.
const heartbeatInterval = time.Second

// MinHealthBudget is the smallest sensible budget for Healthy: a few
// heartbeats, so that a busy machine does not fail it.
const MinHealthBudget = 3 * heartbeatInterval

// syncedPoll is how often the start checks whether the caches synced:
// client-go's WaitForCacheSync checks every 100 ms, 50 ms of a start on
// average spent after the last of them arrived.
const syncedPoll = 5 * time.Millisecond

// waitSynced waits until every cache synced (true) or ctx ends (false).
func waitSynced(ctx context.Context, synced []cache.InformerSynced) bool {
	t := time.NewTicker(syncedPoll)
	defer t.Stop()
	for {
		if !slices.ContainsFunc(synced, func(f cache.InformerSynced) bool { return !f() }) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// beatWhile runs f, which waits on the API server, and keeps the heartbeat
// going until it returns.
func (c *Controller) beatWhile(f func()) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(heartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.lastLoop.Store(time.Now().UnixNano())
			}
		}
	}()
	f()
	c.lastLoop.Store(time.Now().UnixNano())
}

func (c *Controller) lookupNodeIPs() []netip.Addr {
	node, err := c.nodes.Get(c.cfg.NodeName)
	if err != nil {
		c.cfg.Logger.Info("Could not read the Node object; node-to-pod exemptions apply only to traffic the kernel never filters", "node", c.cfg.NodeName, "err", err)
		return nil
	}
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			ips = append(ips, ip.Unmap())
		}
	}
	return ips
}

// syncOnce applies what changed since the last sync: in hybrid mode, pod
// changes and policy changes go through the tracker (the policy changes of
// the namespaces whose turn it is: fairshare.go); anything else, and a
// policy change in queue mode, is a full build.
func (c *Controller) syncOnce(ctx context.Context) error {
	if c.passStarted != nil {
		c.passStarted()
	}
	clusterOn := c.cnps.active() != nil
	c.mu.Lock()
	observed := c.firstUnsynced
	c.firstUnsynced = time.Time{}
	rebuild := c.rebuild || c.tracker.Ruleset() == nil
	keys, pkeys, nkeys := c.podKeys, c.policyKeys, c.nsKeys
	c.rebuild = false
	c.podKeys, c.policyKeys, c.nsKeys = map[string]struct{}{}, map[string]struct{}{}, map[string]struct{}{}
	var pols []string
	if !rebuild && len(pkeys) > 0 {
		var later []string
		pols, later = c.fair.pick(pkeys)
		for _, k := range later {
			c.policyKeys[k] = struct{}{}
		}
		if len(later) > 0 {
			// The deferred changes were observed as early as this pass's.
			c.firstUnsynced = observed
			c.wake()
		}
	}
	taken := c.takeStatusLocked(clusterOn)
	c.deferStatusLocked(&taken, c.policyKeys)
	c.mu.Unlock()
	restore := func() {
		c.mu.Lock()
		c.restoreStatusLocked(taken)
		if c.firstUnsynced.IsZero() || (!observed.IsZero() && observed.Before(c.firstUnsynced)) {
			c.firstUnsynced = observed
		}
		// A failed sync is retried with a full build.
		c.rebuild = true
		c.mu.Unlock()
	}
	start := time.Now()
	var err error
	if !rebuild && len(nkeys) > 0 {
		// Namespaces first: the pods and policies after them are placed
		// with the namespaces' new labels.
		var ok bool
		ok, err = c.syncNamespaces(ctx, slices.Sorted(maps.Keys(nkeys)), start, observed, len(keys) == 0 && len(pols) == 0)
		rebuild = !ok
	}
	if !rebuild && err == nil && len(pols) > 0 {
		var ok bool
		ok, err = c.syncPolicies(ctx, pols, start, observed, len(keys) == 0)
		rebuild = !ok
	}
	if !rebuild && err == nil && (len(keys) > 0 || len(pols) == 0 && len(nkeys) == 0) {
		var ok bool
		ok, err = c.syncPods(ctx, keys, start, observed)
		rebuild = !ok
	}
	if rebuild && err == nil {
		err = c.syncAll(ctx, start, observed)
		if c.rebuildFor != "" && err == nil {
			// A policy change the tracker cannot apply alone (a staged
			// policy with the staged log on) costs a full build: its
			// namespace owes it.
			c.fair.charge(policyNamespace(c.rebuildFor), c.costOf(c.rebuildFor, time.Since(start)))
		}
	}
	c.rebuildFor = ""
	if err != nil {
		restore()
		return err
	}
	c.publishStatus(taken, rebuild, time.Now())
	return nil
}

// syncPods applies pod changes through the tracker; false when one of them
// needs a full build (what was applied before it is in the kernel).
func (c *Controller) syncPods(ctx context.Context, keys map[string]struct{}, start, observed time.Time) (bool, error) {
	done, err := c.apply.ApplyPods(ctx, slices.Collect(maps.Keys(keys)), c.pods.Get, c.notePodSynced)
	if err != nil {
		c.cfg.Metrics.SyncFailures.Inc()
		return false, err
	}
	if done.Fallback != compile.NoFallback {
		c.fellBack(done.Fallback, "pod", done.FallbackKey)
	}
	res, applied, reshaped, complete := done.Result, done.Applied, done.Reshaped, done.Fallback == compile.NoFallback
	c.unchecked = c.unchecked || applied > 0
	c.derivePending = c.derivePending || applied > 0
	c.publishDerived()
	if !complete {
		return false, nil
	}
	kind := "pods"
	if res.Full {
		kind = "full"
	}
	now := time.Now()
	c.committed(kind, start, now, observed)
	if reshaped > 0 {
		// Sets were created and deleted whole: count them again.
		c.cfg.Metrics.SetElements.Set(float64(c.tracker.Ruleset().ElementCount()))
	} else {
		c.cfg.Metrics.SetElements.Add(float64(res.ElementsAdded - res.ElementsDeleted))
	}
	c.scheduleRefresh()
	c.cfg.Logger.WithName("sync").V(2).Info("Synced pod changes", "pods", applied, "elementsAdded", res.ElementsAdded,
		"elementsDeleted", res.ElementsDeleted, "chainsWritten", res.ChainsWritten, "chainsDeleted", res.ChainsDeleted,
		"newRulesets", reshaped, "netlink", res.Netlink, "duration", now.Sub(start))
	return true, nil
}

// syncAll builds and renders everything, applies the difference and
// publishes the program.
func (c *Controller) syncAll(ctx context.Context, start, observed time.Time) error {
	log := c.cfg.Logger.WithName("sync")
	// A full sync over the kernel's table reads its sets: that read runs
	// while the ruleset is built.
	c.cfg.Syncer.Prefetch(ctx)
	in, err := c.snapshot()
	if err != nil {
		return err
	}
	snapshotted := time.Now()
	var usage0 processUsage
	if !c.ready.Load() {
		usage0 = readProcessUsage()
	}
	// A full build starts from a heap holding garbage (the informers'
	// initial events before the first build, the pod and policy changes
	// applied since the last one after it) and, after the first, the
	// tracker's indexes of the last build, which it replaces; with the
	// build's GOGC below, the peak would be all of it plus the build. The
	// tracker lets its indexes go and a collection first leaves the pods,
	// the programs in force and the build.
	stale := c.tracker.Stale() || c.unchecked
	c.apply.Release()
	runtime.GC()
	// A full build allocates a program, an index and a ruleset, most of
	// which it keeps (the first build) or which replace ones as large (a
	// rebuild): at the default GOGC the collector would run through it
	// several times, marking the whole heap each time to free little. The
	// memory limit (GOMEMLIMIT, from the container's) still bounds the
	// heap, and the MemoryReleaser hands the pages back afterwards.
	debug.SetGCPercent(fullBuildGCPercent)
	defer debug.SetGCPercent(c.gcPercent)
	prog, rs, err := c.apply.Build(in)
	if err != nil {
		return fmt.Errorf("rendering: %w", err)
	}
	built := time.Now()
	c.lastBuild = built.Sub(start)
	res, err := c.apply.Commit(ctx, rs)
	applied := time.Now()
	if err == nil {
		c.kernelAhead(applied)
	}
	kind := "incremental"
	if res.Full {
		kind = "full"
	}
	if err != nil {
		c.cfg.Metrics.SyncFailures.Inc()
		return err
	}
	if stale && observed.IsZero() && !res.Full && res.Operations > 0 {
		// The rebuild after incremental pod changes, carrying no change
		// of its own (observed is zero: none was noted since the last
		// sync), changed the table: the tracker missed something. A
		// rebuild for a change the tracker cannot apply alone writes that
		// change, and is not counted.
		c.cfg.Metrics.TrackerCorrections.Add(float64(res.ElementsAdded + res.ElementsDeleted))
		log.V(2).Info("Rebuild after incremental pod changes changed elements", "elementsAdded", res.ElementsAdded, "elementsDeleted", res.ElementsDeleted)
	}
	c.refreshDone()
	c.unchecked = false
	c.inputsSum, c.podHashes = inputsSum(in)
	c.nsHashes = namespaceTerms(in.Namespaces)
	c.policyHashes = policyTerms(in.Policies)
	maps.Copy(c.policyHashes, clusterPolicyTerms(in.ClusterPolicies))
	first := c.publish(prog)
	now := time.Now()
	c.committed(kind, start, now, observed)
	c.recordGauges(prog, rs)
	c.reportProblems(ctx, prog)
	c.cfg.MemoryReleaser.Soon()
	if first {
		logFirstSync(log, prog, res, readProcessUsage().since(usage0), now.Sub(start), built.Sub(snapshotted), applied.Sub(built))
	}
	log.V(2).Info("Synced", "kind", kind, "operations", res.Operations, "elementsAdded", res.ElementsAdded,
		"elementsDeleted", res.ElementsDeleted, "chainsWritten", res.ChainsWritten, "chainsDeleted", res.ChainsDeleted,
		"duration", now.Sub(start))
	// Where a change's programming delay goes: waiting for the loop, then
	// each step of the sync.
	log.V(4).Info("Sync phases", "kind", kind, "observed", observed, "waited", durationSince(observed, start),
		"snapshot", snapshotted.Sub(start), "build", built.Sub(snapshotted), "apply", applied.Sub(built), "publish", now.Sub(applied))
	return nil
}

// publish makes prog the program in force, after the transaction that
// enforces it committed: the evaluator and the kernel never disagree about
// which program is in force. Readiness and the controller's program are
// stored before the evaluator's, so whoever sees the evaluator's program
// also sees the controller ready. It reports whether this is the first
// program.
func (c *Controller) publish(prog *compile.Program) bool {
	c.derivePending = false
	if !c.unpublished.IsZero() {
		c.cfg.Metrics.ProgramLag.Observe(time.Since(c.unpublished).Seconds())
		c.unpublished = time.Time{}
	}
	c.lastProgram.Store(prog)
	first := !c.ready.Swap(true)
	c.apply.Publish(prog)
	return first
}

// kernelAhead notes a kernel commit whose program is not published yet:
// the evaluator lags the kernel from the first such commit until publish.
func (c *Controller) kernelAhead(at time.Time) {
	if c.unpublished.IsZero() {
		c.unpublished = at
	}
}

// publishDerived publishes the program of the pod changes applied since
// the last publication, which the tracker derives from that program. It
// runs after their kernel transaction, so the kernel never waits for it.
// Deriving costs in proportion to the cluster, not to the change (the pod
// list and the evaluator's index are laid out again), so it is paced: the
// next derivation starts no sooner than deriveFactor times this one's
// duration after it, which keeps it under 1/(1+deriveFactor) of a core
// under steady churn, and the program lags the kernel by at most that.
// A connection held in the queue for a pod the program does not know yet
// is not kept waiting. In queue mode nothing is paced: the evaluator
// decides every connection of the pods policies select, so it gets the
// program the kernel enforces at once, as a full build's was (syncPods
// derives it before the transaction). While a
// policy change is pending (Stale) the refresh publishes the whole
// program instead.
func (c *Controller) publishDerived() {
	if !c.derivePending || c.tracker.Stale() {
		return
	}
	now := time.Now()
	if c.pacedDerivation() && now.Before(c.deriveNext) && !c.cfg.Evaluator.Waiting() {
		if c.deriveDue.IsZero() {
			c.deriveDue = c.deriveNext
			c.derive.Reset(c.deriveNext.Sub(now))
		}
		return
	}
	c.deriveDue = time.Time{}
	prog := c.tracker.Program()
	took := time.Since(now)
	c.deriveNext = now.Add(max(took+deriveFactor*took, c.deriveGap))
	if prog != c.lastProgram.Load() {
		c.publish(prog)
		c.recordProgrammedPods(prog)
	}
	c.derivePending = false
}

// pacedDerivation reports whether the derivation of the programs of pod
// changes is paced (publishDerived): not in queue mode, where the
// evaluator decides every connection of the pods policies select, and
// the program is derived before the transaction and published with it.
func (c *Controller) pacedDerivation() bool { return c.cfg.Render.Mode != compile.ModeQueue }

// deriveFactor paces publishDerived: idle for this many times a
// derivation's duration after it.
const deriveFactor = 4

// logFirstSync says what the agent's first committed sync did and cost.
func logFirstSync(log klog.Logger, prog *compile.Program, res sets.Result, used processUsage, took, build, apply time.Duration) {
	log.Info("First sync committed", "policies", len(prog.Policies), "pods", len(prog.Pods), "operations", res.Operations, "duration", took,
		"build", build, "apply", apply, "kernelRead", res.ReadDuration, "setsPrefetched", res.SetsPrefetched, "elementsUnchanged", res.ElementsUnchanged,
		"cpu", used.cpu, "nftCPU", used.childCPU, "pageFaults", used.minorFaults, "gcCycles", used.gcCycles)
}

// durationSince is to-from, 0 when from is unknown.
func durationSince(from, to time.Time) time.Duration {
	if from.IsZero() {
		return 0
	}
	return to.Sub(from)
}

// currentGCPercent is GOGC as set now.
func currentGCPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// fullBuildGCPercent is GOGC during a full build and its sync.
const fullBuildGCPercent = 400

// committed records a sync that reached the kernel.
func (c *Controller) committed(kind string, start, now, observed time.Time) {
	inputs := finishInputs(c.inputsSum)
	c.cfg.Metrics.SyncDuration.WithLabelValues(kind).Observe(now.Sub(start).Seconds())
	c.cfg.Metrics.LastSuccessfulSync.Set(float64(now.Unix()))
	c.cfg.Metrics.SyncedInputs.Set(float64(inputs))
	c.lastInputs.Store(inputs)
	if !observed.IsZero() {
		c.cfg.Metrics.ProgrammingLatency.Observe(now.Sub(observed).Seconds())
	}
	c.lastSync.Store(now.UnixNano())
}

// notePodSynced updates the inputs fingerprint for a pod whose change is
// in the kernel.
func (c *Controller) notePodSynced(key string, pod *compile.PodInfo) {
	c.inputsSum -= c.podHashes[key]
	delete(c.podHashes, key)
	if pod != nil {
		h := podTerm(pod)
		c.podHashes[key] = h
		c.inputsSum += h
	}
}

// Snapshot returns the inputs the informers hold now, as the next full
// build reads them: `nftpolicy preview` builds a candidate program from
// them with a manifest applied. Safe for concurrent use.
func (c *Controller) Snapshot() (compile.Input, error) { return c.snapshot() }

func (c *Controller) snapshot() (compile.Input, error) {
	in := compile.Input{NodeName: c.cfg.NodeName, NodeIPs: c.cfg.NodeIPs, PodCIDRs: c.cfg.PodCIDRs, Budgets: c.cfg.Budgets}
	var err error
	in.PodInfos = c.pods.List()
	if in.Namespaces, err = c.nss.List(labels.Everything()); err != nil {
		return in, fmt.Errorf("listing namespaces: %w", err)
	}
	if in.Policies, err = c.pols.List(labels.Everything()); err != nil {
		return in, fmt.Errorf("listing network policies: %w", err)
	}
	if in.Nodes, err = c.nodes.List(labels.Everything()); err != nil {
		return in, fmt.Errorf("listing nodes: %w", err)
	}
	if in.ClusterPolicies, err = c.cnps.list(); err != nil {
		return in, err
	}
	return in, nil
}

func (c *Controller) recordGauges(prog *compile.Program, rs *compile.Ruleset) {
	m := c.cfg.Metrics
	m.ProgrammedPolicies.Set(float64(len(prog.Policies)))
	m.ProgrammedClusterPolicies.Set(float64(len(prog.ClusterPolicies)))
	c.recordProgrammedPods(prog)
	m.SetElements.Set(float64(rs.ElementCount()))
}

// recordProgrammedPods sets the gauge of the local pods a NetworkPolicy
// isolates.
func (c *Controller) recordProgrammedPods(prog *compile.Program) {
	n := 0
	for i := range prog.Pods {
		p := &prog.Pods[i]
		if p.Local && (len(p.IngressPolicies) > 0 || len(p.EgressPolicies) > 0) {
			n++
		}
	}
	c.cfg.Metrics.ProgrammedPods.Set(float64(n))
}

// reportProblems logs, counts and emits an Event for each policy whose
// problems changed since they were last reported.
func (c *Controller) reportProblems(ctx context.Context, prog *compile.Program) {
	log := c.cfg.Logger.WithName("policy")
	c.reported = changedProblems(c.reported, len(prog.Policies), func(i int) (string, []compile.Problem) {
		return prog.Policies[i].Key, prog.Policies[i].Problems
	}, func(i int, text string) {
		pol := &prog.Policies[i]
		c.cfg.Metrics.PolicyProblems.Add(float64(len(pol.Problems)))
		reason, what := invalidPolicyReason, "invalid parts allow nothing"
		if pol.Rejected {
			reason, what = rejectedReason, "too large to compile: it isolates the pods it selects and allows nothing"
			if pol.RejectedFor != compile.RejectedCost {
				what = "too costly to build (what it makes is over its budget): it isolates the pods it selects and allows nothing"
			}
			c.cfg.Metrics.PoliciesRejected.WithLabelValues(kindNetworkPolicy, string(pol.RejectedFor)).Inc()
			log.Error(nil, "NetworkPolicy too large or too costly to compile: enforced fail-closed, isolating the pods it selects and allowing nothing",
				"policy", klog.KRef(pol.Namespace, pol.Name), "reason", string(pol.RejectedFor), "cost", pol.Cost, "problems", text)
		} else {
			log.Info("Invalid NetworkPolicy: the invalid parts allow nothing; the policy still isolates the pods it selects",
				"policy", klog.KRef(pol.Namespace, pol.Name), "problems", text)
		}
		if c.cfg.Recorder != nil {
			np, err := c.pols.NetworkPolicies(pol.Namespace).Get(pol.Name)
			if err != nil {
				// Deleted since the snapshot: the log line above stays the
				// only report. Writing the Event itself is asynchronous;
				// the broadcaster logs its failures.
				log.V(2).Info("No Event for the invalid NetworkPolicy: not in the cache any more", "policy", klog.KRef(pol.Namespace, pol.Name), "err", err)
				return
			}
			c.cfg.Recorder.Eventf(np, corev1.EventTypeWarning, reason,
				"nftpolicy on %s enforces this policy safely: %s: %s", c.cfg.NodeName, what, truncate(text, 900))
		}
	})
	c.cfg.Metrics.InvalidPolicies.Set(float64(len(c.reported)))
	rejected := 0
	for i := range prog.Policies {
		if prog.Policies[i].Rejected {
			rejected++
		}
	}
	c.cfg.Metrics.RejectedPolicies.WithLabelValues(kindNetworkPolicy).Set(float64(rejected))
	c.cfg.Metrics.NamespaceCostMax.Set(namespaceCostMax(prog, c.cfg.Budgets))
	c.cnps.report(prog, c.cfg.Recorder, c.cfg.NodeName)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// namespaceCostMax is the largest share of its budget that a namespace's
// NetworkPolicies were charged (1: the namespace is at its budget).
func namespaceCostMax(prog *compile.Program, b compile.Budgets) float64 {
	b.Defaults()
	m := 0
	for _, n := range prog.NamespaceCosts {
		m = max(m, n)
	}
	return float64(m) / float64(b.Namespace)
}

// rejectedReason is the reason of the Warning Event on an object over
// compile.MaxPolicyCost or over its budget (compile.Budgets); kindNetworkPolicy and clusterPolicyKind label
// the rejection metrics.
const (
	rejectedReason    = "PolicyTooLarge"
	kindNetworkPolicy = "NetworkPolicy"
)

// The reasons of the Warning Events on policies with problems.
const (
	invalidPolicyReason        = "InvalidNetworkPolicy"
	invalidClusterPolicyReason = "InvalidClusterNetworkPolicy"
)

// PolicyObject is the type events are recorded on; exposed for tests.
type PolicyObject = networkingv1.NetworkPolicy
