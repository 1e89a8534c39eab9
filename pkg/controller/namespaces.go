package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Namespace changes in hybrid and kernel mode go through the tracker one
// namespace at a time (compile.Tracker.ApplyNamespace): its new labels
// place the namespace's pods again, and the Syncer writes the difference,
// as for a NetworkPolicy change. In queue mode and when the tracker
// cannot apply one (a namespace that stages or unstages its
// NetworkPolicies, say), a namespace change is a full build.

// namespaceHandler records Namespace changes by name.
func (c *Controller) namespaceHandler() cache.ResourceEventHandlerDetailedFuncs {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: added(c.markNamespace),
		UpdateFunc: func(old, cur any) {
			if !sameResourceVersion(old, cur) {
				c.markNamespace(cur)
			}
		},
		DeleteFunc: c.markNamespace,
	}
}

// markNamespace records a Namespace change, which the tracker can apply
// alone.
func (c *Controller) markNamespace(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	c.mu.Lock()
	if err != nil {
		c.rebuild = true
	} else {
		c.nsKeys[key] = struct{}{}
	}
	c.noteChangeLocked()
	c.mu.Unlock()
	c.wake()
}

// syncNamespaces applies Namespace changes through the tracker and writes
// the new ruleset; false when one of them needs a full build. commit says
// whether this is the whole sync (no policy or pod changes follow).
func (c *Controller) syncNamespaces(ctx context.Context, names []string, start, observed time.Time, commit bool) (bool, error) {
	terms := make(map[string]uint64, len(names)) // 0: deleted
	for _, name := range names {
		h, ok := c.applyNamespace(name)
		if !ok {
			return false, nil
		}
		terms[name] = h
	}
	res, err := c.commitTracked(ctx)
	if err != nil {
		return false, err
	}
	for name, h := range terms {
		c.inputsSum -= c.nsHashes[name]
		delete(c.nsHashes, name)
		if h != 0 {
			c.nsHashes[name] = h
			c.inputsSum += h
		}
	}
	now := time.Now()
	if commit {
		kind := "namespaces"
		if res.Full {
			kind = "full"
		}
		c.committed(kind, start, now, observed)
		c.scheduleRefresh()
	}
	c.cfg.Logger.WithName("sync").V(2).Info("Synced Namespace changes", "namespaces", len(names), "operations", res.Operations,
		"elementsAdded", res.ElementsAdded, "elementsDeleted", res.ElementsDeleted, "chainsWritten", res.ChainsWritten,
		"chainsDeleted", res.ChainsDeleted, "duration", now.Sub(start))
	return true, nil
}

// applyNamespace applies the change of one Namespace through the tracker
// and returns its fingerprint term (0: deleted); false when it needs a
// full build.
func (c *Controller) applyNamespace(name string) (uint64, bool) {
	log := c.cfg.Logger.WithName("sync")
	ns, err := c.nss.Get(name)
	if apierrors.IsNotFound(err) {
		ns, err = nil, nil
	}
	if err != nil {
		log.Error(err, "Reading a Namespace from the cache; rebuilding", "namespace", name)
		return 0, false
	}
	if f := c.apply.ApplyNamespace(name, ns); f != compile.NoFallback {
		c.fellBack(f, "namespace", name)
		return 0, false
	}
	if ns == nil {
		return 0, true
	}
	return namespaceTerm(ns), true
}

// namespaceTerm is a Namespace's term of the inputs fingerprint.
func namespaceTerm(ns *corev1.Namespace) uint64 {
	return objectTerm('n', "", ns.Name, ns.ResourceVersion)
}

// namespaceTerms are the fingerprint terms of the namespaces of a full
// build, by name.
func namespaceTerms(nss []*corev1.Namespace) map[string]uint64 {
	out := make(map[string]uint64, len(nss))
	for _, ns := range nss {
		out[ns.Name] = namespaceTerm(ns)
	}
	return out
}
