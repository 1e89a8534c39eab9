package controller

import (
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/status"
)

// The node's status (pkg/status) comes from the policy event handlers and
// the commits. Handlers record, under mu with the pending keys, the highest
// resourceVersion they saw per kind and each policy change; a sync takes
// both with the keys, and only once it committed are they handed to
// Config.OnStatus. Handlers run after the informer's store holds the
// object, in resourceVersion order per kind, so every change up to the
// taken watermark is in what the sync read: in the kernel once it
// committed.

// policyEvent is what an informer told of a policy.
type policyEvent uint8

const (
	policySet     policyEvent = iota // added or updated
	policyListed                     // in the informer's initial list: no change of its own
	policyDeleted                    // deleted
)

// policyChange is a policy change a handler saw, pending until a commit.
type policyChange struct {
	change status.Change
	uid    types.UID
	seen   time.Time
}

// statusTake is what a sync takes for the status, with the pending keys.
type statusTake struct {
	marks   status.Watermarks
	changes map[string]policyChange
	// clusterOn is whether ClusterNetworkPolicies were enforced: a
	// ClusterNetworkPolicy watermark means nothing before their lister is.
	clusterOn bool
}

// statusState is the sync loop's side of the status.
type statusState struct {
	// marks and sentProblems are the last publication's; sent is set once
	// one was handed over. problems are those of the program problemsOf.
	marks        status.Watermarks
	sentProblems []status.Problem
	sent         bool
	problems     []status.Problem
	problemsOf   *compile.Program
	// failures counts the failed syncs since the last commit, the first at
	// failingSince.
	failures     int
	failingSince time.Time
	// failEvents holds, by policy key, the resourceVersion a
	// ProgrammingFailed Event was emitted for since the last commit.
	failEvents map[string]string
	eventLimit flowcontrol.PassiveRateLimiter
}

// ProgrammingFailed Events: after programmingFailedAfter consecutive failed
// syncs (the controller retried with full builds twice, about 0.3 s at the
// default backoff: no passing failure), each policy whose change is pending
// gets one Warning Event per resourceVersion, at most programmingFailedBurst
// at once and programmingFailedPerMinute a minute per agent; those over the
// limit wait for a later failed sync (logged at -v=2).
const (
	programmingFailedAfter     = 3
	programmingFailedPerMinute = 10
	programmingFailedBurst     = 10
	programmingFailedReason    = "ProgrammingFailed"
)

func newStatusState() statusState {
	return statusState{
		failEvents: map[string]string{},
		eventLimit: flowcontrol.NewTokenBucketPassiveRateLimiter(programmingFailedPerMinute/60.0, programmingFailedBurst),
	}
}

// notePolicyLocked records a policy event with key: its resourceVersion in
// its kind's watermark and, unless it was listed, the change. The
// resourceVersion of a DeletedFinalStateUnknown is the last one known, older
// than the deletion: it raises no watermark.
func (c *Controller) notePolicyLocked(key string, obj any, ev policyEvent) {
	unknown := false
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, unknown = d.Obj, true
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	kind := status.KindNetworkPolicy
	mark := &c.seenMarks.NetworkPolicies
	if isClusterPolicyKey(key) {
		kind, mark = status.KindClusterNetworkPolicy, &c.seenMarks.ClusterNetworkPolicies
	}
	rv := m.GetResourceVersion()
	if !unknown {
		*mark = laterRV(*mark, rv)
	}
	if ev == policyListed {
		return
	}
	c.pendingChanges[key] = policyChange{
		change: status.Change{
			PolicyRef:       status.PolicyRef{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName()},
			ResourceVersion: rv, Generation: m.GetGeneration(), Deleted: ev == policyDeleted,
		},
		uid: m.GetUID(), seen: time.Now(),
	}
}

// notePolicyListed records a policy of an informer's initial list: its
// resourceVersion only (the first sync builds from the store).
func (c *Controller) notePolicyListed(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.notePolicyLocked(key, obj, policyListed)
	c.mu.Unlock()
}

// takeStatusLocked takes the watermarks and changes for a sync.
func (c *Controller) takeStatusLocked(clusterOn bool) statusTake {
	t := statusTake{marks: c.seenMarks, changes: c.pendingChanges, clusterOn: clusterOn}
	c.pendingChanges = map[string]policyChange{}
	return t
}

// restoreStatusLocked puts back the changes of a failed sync, but for the
// policies that changed again since.
// deferStatusLocked puts back the changes of the policies a sync defers
// (fairshare.go): they are not in its commit. Nor is the watermark raised
// by it: a deferred change may be older than the highest seen.
func (c *Controller) deferStatusLocked(t *statusTake, deferred map[string]struct{}) {
	if len(deferred) == 0 {
		return
	}
	t.marks = status.Watermarks{}
	for key := range deferred {
		if ch, ok := t.changes[key]; ok {
			delete(t.changes, key)
			c.pendingChanges[key] = ch
		}
	}
}

func (c *Controller) restoreStatusLocked(t statusTake) {
	for key, ch := range t.changes {
		if _, newer := c.pendingChanges[key]; !newer {
			c.pendingChanges[key] = ch
		}
	}
}

// publishStatus hands the status of a committed sync to OnStatus when it
// tells something new: the first commit, the first after failed syncs, a
// watermark raised, policy changes programmed, problems changed. Commits
// of pod changes alone tell nothing: pod churn causes no status writes.
// rebuilt says whether the sync built the program from the stores: their
// policies' resourceVersions count then too (the store holds the state of
// the API at some resourceVersion at least the highest of its objects'),
// which covers the initial lists whatever their handlers' lag.
func (c *Controller) publishStatus(t statusTake, rebuilt bool, at time.Time) {
	st := &c.status
	failed := st.failures > 0
	st.failures = 0
	clear(st.failEvents)
	if c.cfg.OnStatus == nil {
		return
	}
	prog := c.lastProgram.Load()
	marks := st.marks
	marks.NetworkPolicies = laterRV(marks.NetworkPolicies, t.marks.NetworkPolicies)
	if t.clusterOn {
		marks.ClusterNetworkPolicies = laterRV(marks.ClusterNetworkPolicies, t.marks.ClusterNetworkPolicies)
	}
	if rebuilt && prog != nil {
		for _, np := range prog.Source.Policies {
			marks.NetworkPolicies = laterRV(marks.NetworkPolicies, np.ResourceVersion)
		}
		for _, cnp := range prog.Source.ClusterPolicies {
			marks.ClusterNetworkPolicies = laterRV(marks.ClusterNetworkPolicies, cnp.ResourceVersion)
		}
	}
	if prog != st.problemsOf {
		st.problems, st.problemsOf = programProblems(prog), prog
	}
	pub := status.Publication{Watermarks: marks, Problems: st.problems, At: at}
	pending := slices.SortedFunc(maps.Values(t.changes), func(a, b policyChange) int { return a.seen.Compare(b.seen) })
	for _, ch := range pending {
		out := ch.change
		out.LatencyMicros = at.Sub(ch.seen).Microseconds()
		out.ProgrammedAt.Time = at
		pub.Changes = append(pub.Changes, out)
	}
	if st.sent && !failed && marks == st.marks && len(pub.Changes) == 0 && slices.Equal(pub.Problems, st.sentProblems) {
		return
	}
	st.marks, st.sent, st.sentProblems = marks, true, pub.Problems
	c.cfg.OnStatus(pub)
}

// programProblems lists the policies of prog enforced fail-closed, with the
// reasons of their Events.
func programProblems(prog *compile.Program) []status.Problem {
	if prog == nil {
		return nil
	}
	var out []status.Problem
	var gens map[string]int64
	generation := func(key string) int64 {
		if gens == nil {
			gens = map[string]int64{}
			for _, np := range prog.Source.Policies {
				gens[np.Namespace+"/"+np.Name] = np.Generation
			}
			for _, cnp := range prog.Source.ClusterPolicies {
				gens[cnp.Name] = cnp.Generation
			}
		}
		return gens[key]
	}
	for i := range prog.Policies {
		p := &prog.Policies[i]
		if len(p.Problems) > 0 || p.Rejected {
			out = append(out, problem(status.KindNetworkPolicy, p.Namespace, p.Name, generation(p.Key), invalidPolicyReason, p.Rejected, p.Problems))
		}
	}
	for i := range prog.ClusterPolicies {
		p := &prog.ClusterPolicies[i]
		if len(p.Problems) > 0 || p.Rejected {
			out = append(out, problem(status.KindClusterNetworkPolicy, "", p.Name, generation(p.Name), invalidClusterPolicyReason, p.Rejected, p.Problems))
		}
	}
	return out
}

func problem(kind, ns, name string, gen int64, reason string, rejected bool, ps []compile.Problem) status.Problem {
	msg := problemsText(ps)
	if rejected {
		reason = rejectedReason
		if msg == "" {
			msg = "too large to compile: enforced fail-closed"
		}
	}
	return status.Problem{PolicyRef: status.PolicyRef{Kind: kind, Namespace: ns, Name: name}, Generation: gen, Reason: reason, Message: msg}
}

// laterRV returns the later of two resourceVersions, compared as the API
// defines (resourceversion.CompareResourceVersion). A malformed or empty
// one never wins over a well-formed one; of two malformed ones, a stays.
func laterRV(a, b string) string {
	if a == b || b == "" {
		return a
	}
	cmp, err := resourceversion.CompareResourceVersion(a, b)
	if err == nil {
		if cmp < 0 {
			return b
		}
		return a
	}
	if _, errB := resourceversion.CompareResourceVersion(b, b); errB == nil {
		return b // a is malformed or empty, b is not
	}
	return a
}

// syncFailed records a failed sync: OnSyncFailed is told, and once syncs
// keep failing the pending policy changes get ProgrammingFailed Events.
func (c *Controller) syncFailed(err error) {
	now := time.Now()
	st := &c.status
	if st.failures == 0 {
		st.failingSince = now
	}
	st.failures++
	if c.cfg.OnSyncFailed != nil {
		c.cfg.OnSyncFailed(err, now)
	}
	if st.failures >= programmingFailedAfter && c.cfg.Recorder != nil {
		c.emitProgrammingFailed(err)
	}
}

// emitProgrammingFailed emits a Warning Event on each policy whose change
// is pending, once per resourceVersion, within the rate limit. Deletions
// get none: their object is gone.
func (c *Controller) emitProgrammingFailed(err error) {
	st := &c.status
	c.mu.Lock()
	keys := slices.Sorted(maps.Keys(c.pendingChanges))
	pending := make([]policyChange, len(keys))
	for i, k := range keys {
		pending[i] = c.pendingChanges[k]
	}
	c.mu.Unlock()
	log := c.cfg.Logger.WithName("policy")
	for i, ch := range pending {
		key, rv := keys[i], ch.change.ResourceVersion
		if ch.change.Deleted || st.failEvents[key] == rv {
			continue
		}
		if !st.eventLimit.TryAccept() {
			log.V(2).Info("ProgrammingFailed Event over the rate limit; left for a later failed sync",
				"policy", ch.change.PolicyRef.String(), "resourceVersion", rv, "limitPerMinute", programmingFailedPerMinute)
			continue
		}
		st.failEvents[key] = rv
		c.cfg.Recorder.Eventf(policyReference(ch), corev1.EventTypeWarning, programmingFailedReason,
			"nftpolicy on %s cannot program this policy's resourceVersion %s: %d syncs failed since %s; the kernel keeps the previous rules: %s",
			c.cfg.NodeName, rv, st.failures, st.failingSince.UTC().Format(time.RFC3339), truncate(err.Error(), 600))
	}
}

// policyReference is the object an Event about a policy change is on: a
// reference, as objects from informers carry no kind and version.
func policyReference(ch policyChange) *corev1.ObjectReference {
	ref := &corev1.ObjectReference{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: ch.change.Kind,
		Namespace: ch.change.Namespace, Name: ch.change.Name, UID: ch.uid, ResourceVersion: ch.change.ResourceVersion}
	if ch.change.Kind == status.KindClusterNetworkPolicy {
		ref.APIVersion = ClusterPolicyGroupVersion
	}
	return ref
}
