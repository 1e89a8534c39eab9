package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	npainformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
	npalisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

// The ClusterNetworkPolicy API the agent enforces. It is a CRD that may be
// missing, installed or removed while the agent runs.
const (
	ClusterPolicyGroupVersion = "policy.networking.k8s.io/v1beta1"
	ClusterPolicyResource     = "clusternetworkpolicies"
	clusterPolicyKind         = "ClusterNetworkPolicy"
)

// DefaultClusterPolicyCheckPeriod is how often discovery is asked whether
// the ClusterNetworkPolicy API is served.
const DefaultClusterPolicyCheckPeriod = 30 * time.Second

// firstClusterPolicyWait bounds how long the first sync waits for the
// ClusterNetworkPolicy informer. Waiting at all matters: the kernel table
// survives restarts, and a first sync without the Admin tier would lift its
// Deny rules until the informer caught up; waiting forever would leave the
// agent unready when the API is served but cannot be listed (say, RBAC
// without clusternetworkpolicies).
const firstClusterPolicyWait = 20 * time.Second

// clusterPolicies follows the ClusterNetworkPolicy API: it asks discovery
// periodically whether the API is served, runs an informer while it is, and
// offers the synced objects to the controller's snapshots. Only its run
// goroutine starts and stops informers.
type clusterPolicies struct {
	client    npaclient.Interface
	discovery discovery.DiscoveryInterface
	period    time.Duration
	resync    time.Duration
	log       klog.Logger
	metrics   *Metrics
	// changed marks the controller dirty.
	changed func()
	// changedPolicy, when set, is told of one policy's change instead
	// (the controller applies it alone: clusterpolicy_sync.go).
	changedPolicy func(obj any, ev policyEvent)

	// recheck asks run for a discovery check now (the informer saw the
	// resource vanish, or its cache synced).
	recheck chan struct{}
	// decided is closed once the first check concluded: the API is not
	// served, or its informer synced.
	decided     chan struct{}
	decidedOnce sync.Once

	mu     sync.Mutex
	lister npalisters.ClusterNetworkPolicyLister // non-nil while enforcing

	// Owned by run.
	informer     cache.SharedIndexInformer
	stopInformer func()
	toldAbsent   bool
	lastErr      string
	// reported holds the problems last reported per policy name; owned by
	// the sync loop.
	reported map[string]string
}

func newClusterPolicies(client npaclient.Interface, period, resync time.Duration, log klog.Logger, m *Metrics, changed func()) *clusterPolicies {
	w := &clusterPolicies{
		client: client, period: period, resync: resync, log: log, metrics: m, changed: changed,
		recheck: make(chan struct{}, 1), decided: make(chan struct{}), reported: map[string]string{},
	}
	if client != nil {
		w.discovery = client.Discovery()
	}
	return w
}

// run checks discovery now and every period until ctx ends, then stops the
// informer. Without a client it only records that the API is off.
func (w *clusterPolicies) run(ctx context.Context) {
	if w.client == nil {
		w.log.Info("No ClusterNetworkPolicy client configured; enforcing NetworkPolicy v1 only")
		w.decide()
		return
	}
	t := time.NewTicker(w.period)
	defer t.Stop()
	defer w.stop("agent stopping")
	for {
		w.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.recheck:
		}
	}
}

func (w *clusterPolicies) decide() { w.decidedOnce.Do(func() { close(w.decided) }) }

func (w *clusterPolicies) poke() {
	select {
	case w.recheck <- struct{}{}:
	default:
	}
}

// check compares what discovery says with the informer's state and starts,
// activates or stops it. A discovery error changes nothing: an unreachable
// API server is no reason to stop enforcing what the agent has.
func (w *clusterPolicies) check(ctx context.Context) {
	served, err := w.served(ctx)
	if err != nil {
		if msg := err.Error(); msg != w.lastErr {
			w.lastErr = msg
			w.log.Info("Could not tell whether the ClusterNetworkPolicy API is served; keeping the current state", "groupVersion", ClusterPolicyGroupVersion, "err", err)
		}
		return
	}
	w.lastErr = ""
	switch {
	case !served && w.informer != nil:
		w.stop("the API is no longer served (CRD removed)")
		w.toldAbsent = true
		w.decide()
	case !served:
		if !w.toldAbsent {
			w.toldAbsent = true
			w.log.Info("ClusterNetworkPolicy API not served (CRD not installed); enforcing NetworkPolicy v1 only, checking again periodically",
				"groupVersion", ClusterPolicyGroupVersion, "resource", ClusterPolicyResource, "checkPeriod", w.period)
		}
		w.decide()
	case w.informer == nil:
		w.start(ctx)
	case w.active() == nil && w.informer.HasSynced():
		w.mu.Lock()
		w.lister = npalisters.NewClusterNetworkPolicyLister(w.informer.GetIndexer())
		w.mu.Unlock()
		w.toldAbsent = false
		w.metrics.ClusterPolicyAPI.Set(1)
		w.log.Info("ClusterNetworkPolicy API served and synced; enforcing ClusterNetworkPolicies", "groupVersion", ClusterPolicyGroupVersion)
		w.changed()
		w.decide()
	}
}

// served asks discovery whether the group version serves the resource.
func (w *clusterPolicies) served(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, max(w.period, 10*time.Second))
	defer cancel()
	list, err := discovery.ToDiscoveryInterfaceWithContext(w.discovery).ServerResourcesForGroupVersionWithContext(ctx, ClusterPolicyGroupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == ClusterPolicyResource }), nil
}

// start runs a fresh informer; its cache sync triggers the check that
// activates it.
func (w *clusterPolicies) start(ctx context.Context) {
	f := npainformers.NewSharedInformerFactoryWithOptions(w.client, w.resync, npainformers.WithTransform(slimClusterPolicy))
	inf := f.Policy().V1beta1().ClusterNetworkPolicies().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			ev := policySet
			if isInInitialList {
				ev = policyListed
			}
			w.policyChanged(obj, ev)
		},
		UpdateFunc: func(old, cur any) {
			if !sameResourceVersion(old, cur) {
				w.policyChanged(cur, policySet)
			}
		},
		DeleteFunc: func(obj any) { w.policyChanged(obj, policyDeleted) },
	}); err != nil {
		w.log.Error(err, "Adding the ClusterNetworkPolicy event handler")
		return
	}
	// A 404 from list or watch means the CRD went away: check discovery now
	// rather than at the next period, so that stale policies are dropped
	// promptly.
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		w.log.V(2).Info("ClusterNetworkPolicy watch failed", "err", err)
		if apierrors.IsNotFound(err) {
			w.poke()
		}
	}); err != nil {
		w.log.Error(err, "Setting the ClusterNetworkPolicy watch error handler")
	}
	ictx, cancel := context.WithCancel(ctx)
	f.Start(ictx.Done())
	w.informer = inf
	w.stopInformer = func() {
		cancel()
		f.Shutdown()
	}
	w.log.Info("ClusterNetworkPolicy API served; starting its informer", "groupVersion", ClusterPolicyGroupVersion)
	go func() {
		if cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
			w.poke()
		}
	}()
}

// stop stops the informer; when its policies were enforced, the next sync
// drops them.
func (w *clusterPolicies) stop(why string) {
	if w.informer == nil {
		return
	}
	w.stopInformer()
	w.informer, w.stopInformer = nil, nil
	w.mu.Lock()
	was := w.lister != nil
	w.lister = nil
	w.mu.Unlock()
	w.metrics.ClusterPolicyAPI.Set(0)
	if was {
		w.log.Info("No longer enforcing ClusterNetworkPolicies", "reason", why)
		w.changed()
	}
}

func (w *clusterPolicies) active() npalisters.ClusterNetworkPolicyLister {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lister
}

// list returns the ClusterNetworkPolicies to enforce: none while the API is
// not served or its informer has not synced.
func (w *clusterPolicies) list() ([]*npav1beta1.ClusterNetworkPolicy, error) {
	l := w.active()
	if l == nil {
		return nil, nil
	}
	out, err := l.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing cluster network policies: %w", err)
	}
	return out, nil
}

// waitFirst waits until the first check decided, at most
// firstClusterPolicyWait.
func (w *clusterPolicies) waitFirst(ctx context.Context) {
	timeout := time.NewTimer(firstClusterPolicyWait)
	defer timeout.Stop()
	select {
	case <-w.decided:
	case <-ctx.Done():
	case <-timeout.C:
		w.log.Info("ClusterNetworkPolicies not synced in time; enforcing without them until their informer syncs",
			"waited", firstClusterPolicyWait, "groupVersion", ClusterPolicyGroupVersion)
	}
}

// report logs, counts and emits an Event for each ClusterNetworkPolicy
// whose problems changed since they were last reported.
func (w *clusterPolicies) report(prog *compile.Program, rec record.EventRecorder, node string) {
	log := w.log.WithName("policy")
	w.reported = changedProblems(w.reported, len(prog.ClusterPolicies), func(i int) (string, []compile.Problem) {
		return prog.ClusterPolicies[i].Name, prog.ClusterPolicies[i].Problems
	}, func(i int, text string) {
		cp := &prog.ClusterPolicies[i]
		w.metrics.ClusterPolicyProblems.Add(float64(len(cp.Problems)))
		reason, what := invalidClusterPolicyReason, "unusable Accept parts allow nothing, unusable Deny and Pass parts deny"
		if cp.Rejected {
			reason, what = rejectedReason, "too large to compile: its Accept rules match nothing, its Deny and Pass rules deny all traffic of its subjects"
			if cp.RejectedFor != compile.RejectedCost {
				what = "too costly to build (what it makes is over its budget): its Accept rules match nothing, its Deny and Pass rules deny all traffic of its subjects"
			}
			w.metrics.PoliciesRejected.WithLabelValues(clusterPolicyKind, string(cp.RejectedFor)).Inc()
			log.Error(nil, "ClusterNetworkPolicy too large or too costly to compile: enforced fail-closed, its Accept rules match nothing, its Deny and Pass rules deny",
				"clusterNetworkPolicy", cp.Name, "tier", cp.Tier, "priority", cp.Priority, "reason", string(cp.RejectedFor), "cost", cp.Cost, "problems", text)
		} else {
			log.Info("Invalid or unsupported ClusterNetworkPolicy: its Accept parts that cannot be used allow nothing, its Deny and Pass parts that cannot be used deny",
				"clusterNetworkPolicy", cp.Name, "tier", cp.Tier, "priority", cp.Priority, "problems", text)
		}
		l := w.active()
		if rec == nil || l == nil {
			return
		}
		obj, err := l.Get(cp.Name)
		if err != nil {
			return
		}
		// A reference rather than the object: the Event needs the kind and
		// version, which objects from informers do not carry and the
		// client-go scheme does not know.
		ref := &corev1.ObjectReference{APIVersion: ClusterPolicyGroupVersion, Kind: clusterPolicyKind,
			Name: obj.Name, UID: obj.UID, ResourceVersion: obj.ResourceVersion}
		rec.Eventf(ref, corev1.EventTypeWarning, reason, "nftpolicy on %s enforces this policy safely: %s: %s", node, what, truncate(text, 900))
	})
	w.metrics.InvalidClusterPolicies.Set(float64(len(w.reported)))
	rejected := 0
	for i := range prog.ClusterPolicies {
		if prog.ClusterPolicies[i].Rejected {
			rejected++
		}
	}
	w.metrics.RejectedPolicies.WithLabelValues(clusterPolicyKind).Set(float64(rejected))
}

// changedProblems returns, by policy key, the problems text of each of the n
// policies that has problems (get returns policy i's key and problems), and
// calls fresh for those whose text differs from last: problems are
// reported once per change, and again when they come back.
func changedProblems(last map[string]string, n int, get func(i int) (string, []compile.Problem), fresh func(i int, text string)) map[string]string {
	current := map[string]string{}
	for i := range n {
		key, ps := get(i)
		if len(ps) == 0 {
			continue
		}
		text := problemsText(ps)
		current[key] = text
		if last[key] != text {
			fresh(i, text)
		}
	}
	return current
}

// problemsText is the sorted, joined text of problems: it changes exactly
// when the problems do.
func problemsText(ps []compile.Problem) string {
	msgs := make([]string, len(ps))
	for i, p := range ps {
		msgs[i] = p.Field + ": " + p.Message
	}
	sort.Strings(msgs)
	return strings.Join(msgs, "; ")
}

// slimClusterPolicy drops what the compiler never reads; the informer owns
// the decoded object.
func slimClusterPolicy(obj any) (any, error) {
	if cnp, ok := obj.(*npav1beta1.ClusterNetworkPolicy); ok {
		cnp.ManagedFields = nil
		cnp.Annotations = slim.KeepStaged(cnp.Annotations)
		cnp.Status = npav1beta1.ClusterNetworkPolicyStatus{}
	}
	return obj, nil
}

// sameResourceVersion reports a resync or an update that changed nothing.
func sameResourceVersion(old, cur any) bool {
	o, ok1 := old.(interface{ GetResourceVersion() string })
	n, ok2 := cur.(interface{ GetResourceVersion() string })
	return ok1 && ok2 && o.GetResourceVersion() == n.GetResourceVersion()
}

// nodeChanged reports whether an update changed what policies read of a
// Node: its labels (nodes peers select by them) or its addresses. Status
// heartbeats change neither and must not cause syncs.
func nodeChanged(old, cur any) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(o.Labels, n.Labels) || !slices.Equal(o.Status.Addresses, n.Status.Addresses) ||
		o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs)
}

// watchNodes adds the Node informer: nodes peers of ClusterNetworkPolicies
// select nodes by label and match their addresses.
func (c *Controller) watchNodes(inf cache.SharedIndexInformer) error {
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: added(func(any) { c.markDirty() }),
		UpdateFunc: func(old, cur any) {
			if !sameResourceVersion(old, cur) && nodeChanged(old, cur) {
				c.markDirty()
			}
		},
		DeleteFunc: func(any) { c.markDirty() },
	}); err != nil {
		return fmt.Errorf("adding the node event handler: %w", err)
	}
	c.synced = append(c.synced, inf.HasSynced)
	return nil
}
