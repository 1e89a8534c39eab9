package controller

import (
	"context"
	"fmt"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// NetworkPolicy changes in hybrid and kernel mode go through the tracker
// one policy at a time (compile.Tracker.ApplyPolicy): the policy's chains,
// the sets it owns and its subjects' elements change, and the Syncer
// writes the difference between the ruleset it applied and the tracker's
// new one. The program the evaluator reads lags until the refresh, built
// off the sync loop (offloop.go; pod changes publish theirs after their
// transaction: publishDerived). In
// queue mode a policy change is a full build (compile.FallbackQueueMode),
// so the evaluator, which decides every connection there, never decides
// with a program older than the kernel's dispatch for longer than the
// build's publication after its commit.

// policyHandler records NetworkPolicy changes by key.
func (c *Controller) policyHandler() cache.ResourceEventHandlerDetailedFuncs {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			if isInInitialList {
				// Not a change (see added), but its resourceVersion
				// counts for the status.
				c.notePolicyListed(obj)
				return
			}
			c.markPolicy(obj, policySet)
		},
		UpdateFunc: func(old, cur any) {
			if !sameResourceVersion(old, cur) {
				c.markPolicy(cur, policySet)
			}
		},
		DeleteFunc: func(obj any) { c.markPolicy(obj, policyDeleted) },
	}
}

// markPolicy records a NetworkPolicy or ClusterNetworkPolicy change,
// which the tracker can apply alone, and notes it for the node's status.
// In queue mode the tracker applies no policy change: the change marks a
// full build at once (one for all the changes a pass takes, where keys
// left to a later pass, fairshare.go, would each fall back to one).
func (c *Controller) markPolicy(obj any, ev policyEvent) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	c.mu.Lock()
	if err == nil {
		c.notePolicyLocked(key, obj, ev)
	}
	switch {
	case err != nil:
		c.rebuild = true
	case c.cfg.Render.Mode == compile.ModeQueue:
		c.fellBack(compile.FallbackQueueMode, "policy", key)
		c.rebuild = true
	default:
		c.policyKeys[key] = struct{}{}
	}
	c.noteChangeLocked()
	c.mu.Unlock()
	c.wake()
}

// syncPolicies applies NetworkPolicy and ClusterNetworkPolicy changes
// (clusterpolicy_sync.go) through the tracker, in the order given, and
// writes the new ruleset; false when one of them needs a full build.
// commit says whether this is the whole sync (no pod changes follow).
// What each change cost is charged to its namespace (fairshare.go).
func (c *Controller) syncPolicies(ctx context.Context, keys []string, start, observed time.Time, commit bool) (bool, error) {
	log := c.cfg.Logger.WithName("sync")
	terms := make(map[string]uint64, len(keys)) // 0: deleted
	costs := make(map[string]time.Duration, len(keys))
	for _, key := range keys {
		t0 := time.Now()
		h, ok := c.applyPolicyKey(key)
		if !ok {
			c.rebuildFor = key
			return false, nil
		}
		terms[key] = h
		costs[key] = time.Since(t0)
	}
	t0 := time.Now()
	res, err := c.commitTracked(ctx)
	if err != nil {
		return false, err
	}
	c.chargePolicies(costs, time.Since(t0))
	for key, h := range terms {
		c.notePolicySynced(key, h)
	}
	c.recordPolicyCounts()
	now := time.Now()
	if commit {
		kind := "policies"
		if res.Full {
			kind = "full"
		}
		c.committed(kind, start, now, observed)
		c.scheduleRefresh()
	}
	log.V(2).Info("Synced NetworkPolicy changes", "policies", len(keys), "operations", res.Operations,
		"elementsAdded", res.ElementsAdded, "elementsDeleted", res.ElementsDeleted, "chainsWritten", res.ChainsWritten,
		"chainsDeleted", res.ChainsDeleted, "duration", now.Sub(start))
	return true, nil
}

// applyPolicyKey applies the change of one NetworkPolicy or
// ClusterNetworkPolicy through the tracker and returns its fingerprint
// term (0: deleted); false when it needs a full build (nothing was
// changed then).
func (c *Controller) applyPolicyKey(key string) (uint64, bool) {
	if isClusterPolicyKey(key) {
		return c.applyClusterPolicy(key)
	}
	log := c.cfg.Logger.WithName("sync")
	obj, exists, err := c.polStore.GetByKey(key)
	if err != nil {
		log.Error(err, "Reading a NetworkPolicy from the cache; rebuilding", "policy", key)
		return 0, false
	}
	var np *networkingv1.NetworkPolicy
	if exists {
		var ok bool
		if np, ok = obj.(*networkingv1.NetworkPolicy); !ok {
			log.Error(fmt.Errorf("stored as %T", obj), "Unexpected NetworkPolicy object; rebuilding", "policy", key)
			return 0, false
		}
	}
	if f := c.apply.ApplyPolicy(key, np); f != compile.NoFallback {
		// The tracker is left for a Rebuild; nothing was written.
		c.fellBack(f, "policy", key)
		return 0, false
	}
	if np == nil {
		return 0, true
	}
	return objectTerm('P', np.Namespace, np.Name, np.ResourceVersion), true
}

// chargePolicies charges each namespace what its policy changes cost the
// sync: their own tracker time, and the transaction's in proportion.
func (c *Controller) chargePolicies(costs map[string]time.Duration, tx time.Duration) {
	var total time.Duration
	for _, d := range costs {
		total += d
	}
	for key, d := range costs {
		cost := d
		if total > 0 {
			cost += time.Duration(float64(tx) * float64(d) / float64(total))
		}
		c.fair.charge(policyNamespace(key), c.costOf(key, cost))
	}
}

// costOf is what a policy change cost the sync loop: measured, unless a
// test replaces it.
func (c *Controller) costOf(key string, measured time.Duration) time.Duration {
	if c.policyCost != nil {
		return c.policyCost(key, measured)
	}
	return measured
}

// notePolicySynced updates the inputs fingerprint for a NetworkPolicy or
// ClusterNetworkPolicy whose change is in the kernel: h is its term, 0
// when it was deleted.
func (c *Controller) notePolicySynced(key string, h uint64) {
	c.inputsSum -= c.policyHashes[key]
	delete(c.policyHashes, key)
	if h != 0 {
		c.policyHashes[key] = h
		c.inputsSum += h
	}
}

// recordPolicyCounts sets the programmed-policies gauges from the policies
// whose changes are in the kernel (the fingerprint's terms): after a
// policies sync the program the full build counted lags until the refresh,
// and it keeps a deleted policy's entry until then.
func (c *Controller) recordPolicyCounts() {
	nps, cnps := 0, 0
	for key := range c.policyHashes {
		if isClusterPolicyKey(key) {
			cnps++
		} else {
			nps++
		}
	}
	c.cfg.Metrics.ProgrammedPolicies.Set(float64(nps))
	c.cfg.Metrics.ProgrammedClusterPolicies.Set(float64(cnps))
}

// policyTerms are the fingerprint terms of the policies of a full build.
func policyTerms(pols []*networkingv1.NetworkPolicy) map[string]uint64 {
	out := make(map[string]uint64, len(pols))
	for _, np := range pols {
		out[np.Namespace+"/"+np.Name] = objectTerm('P', np.Namespace, np.Name, np.ResourceVersion)
	}
	return out
}

// scheduleRefresh arms the program refresh after changes the tracker
// applied. After a policy change the program lags the kernel until then:
// the refresh follows within the refresh delay. A refresh already armed
// is never pushed later: changes that keep coming (one namespace's
// edits, every 100 ms) must not keep the program, the revocation of
// flows other changes deny (OnProgram) and explain behind the kernel.
// It is built off the loop (offloop.go), so that the changes of other
// namespaces do not wait for it. After pod changes alone the program is current (the tracker derives
// it): the refresh is the consistency check, a full build compared with
// the tracked ruleset (nftpolicy_tracker_corrections_total) that also
// charges the policies for the pods they now select (docs/security.md),
// after consistencyCheckDelay or consistencyCheckFactor times the last
// build, whichever is longer, so that it takes a bounded share of a core.
func (c *Controller) scheduleRefresh() {
	var delay time.Duration
	switch {
	case c.tracker.Stale():
		delay = max(c.cfg.ProgramRefreshDelay, 2*c.lastBuild)
		if c.cfg.Evaluator.Waiting() {
			// A connection of a pod the program does not know yet is
			// held in the queue: publish now.
			delay = 0
		}
	case c.unchecked:
		least := consistencyCheckDelay
		if c.checkDelay > 0 {
			least = c.checkDelay
		}
		delay = max(least, consistencyCheckFactor*c.lastBuild)
	default:
		return
	}
	due := time.Now().Add(delay)
	if !c.refreshDue.IsZero() && !due.Before(c.refreshDue) {
		return
	}
	c.refreshDue = due
	c.refresh.Reset(delay)
}

// consistencyCheckDelay and consistencyCheckFactor bound how soon the
// consistency check follows pod changes applied incrementally: at most
// one full build in twenty of its durations.
const (
	consistencyCheckDelay  = time.Minute
	consistencyCheckFactor = 20
)

// refreshDone disarms the refresh after a full build, which published the
// current program, and ends a run of off-loop refresh builds discarded.
func (c *Controller) refreshDone() {
	c.refresh.Stop()
	c.refreshDue = time.Time{}
	c.refreshYielded = false
	// The next refresh after policy changes is built off the loop again.
	c.offloopDiscards = 0
}

// commitTracked commits the tracker's ruleset after policy or namespace
// changes; the program follows with the refresh when they left it stale.
func (c *Controller) commitTracked(ctx context.Context) (sets.Result, error) {
	res, err := c.apply.CommitPolicies(ctx)
	if err != nil {
		c.cfg.Metrics.SyncFailures.Inc()
		return res, err
	}
	if c.tracker.Stale() {
		c.kernelAhead(time.Now())
	}
	return res, nil
}
