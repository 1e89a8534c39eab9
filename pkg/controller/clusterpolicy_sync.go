package controller

import (
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// ClusterNetworkPolicy changes take the NetworkPolicy path (policies.go):
// the informer's events mark the policy's key, its name (cluster-scoped,
// so without the "/" of a NetworkPolicy's key), and syncPolicies applies
// it through compile.Tracker.ApplyClusterPolicy. The API appearing or
// going away, and the changes the tracker does not apply alone, are full
// builds.

// isClusterPolicyKey reports whether a policy key names a
// ClusterNetworkPolicy.
func isClusterPolicyKey(key string) bool { return !strings.Contains(key, "/") }

// get returns the ClusterNetworkPolicy to enforce with this name, nil when
// there is none; ok is false when the API is not enforced now (a full
// build decides).
func (w *clusterPolicies) get(name string) (cnp *npav1beta1.ClusterNetworkPolicy, ok bool, err error) {
	l := w.active()
	if l == nil {
		return nil, false, nil
	}
	cnp, err = l.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	return cnp, true, nil
}

// applyClusterPolicy applies one ClusterNetworkPolicy change through the
// tracker and returns its fingerprint term (0 when deleted); false when a
// full build must do it (nothing was changed then).
func (c *Controller) applyClusterPolicy(name string) (term uint64, ok bool) {
	log := c.cfg.Logger.WithName("sync")
	cnp, ok, err := c.cnps.get(name)
	if err != nil {
		log.Error(fmt.Errorf("reading a ClusterNetworkPolicy from the cache: %w", err), "Rebuilding", "clusterPolicy", name)
		return 0, false
	}
	if !ok {
		return 0, false
	}
	if f := c.apply.ApplyClusterPolicy(name, cnp); f != compile.NoFallback {
		c.fellBack(f, "clusterPolicy", name)
		return 0, false
	}
	if cnp != nil {
		term = objectTerm('C', "", cnp.Name, cnp.ResourceVersion)
	}
	return term, true
}

// fellBack counts and logs a change the tracker left to a full rebuild;
// kind and key name the changed object.
func (c *Controller) fellBack(f compile.Fallback, kind, key string) {
	c.cfg.Metrics.IncrementalFallbacks.WithLabelValues(string(f)).Inc()
	c.cfg.Logger.WithName("sync").V(2).Info("Change left to a full rebuild", "reason", string(f), kind, key)
}

// clusterPolicyTerms are the fingerprint terms of the ClusterNetworkPolicies
// of a full build, by name.
func clusterPolicyTerms(cnps []*npav1beta1.ClusterNetworkPolicy) map[string]uint64 {
	out := make(map[string]uint64, len(cnps))
	for _, cnp := range cnps {
		out[cnp.Name] = objectTerm('C', "", cnp.Name, cnp.ResourceVersion)
	}
	return out
}

// policyChanged passes an informer event on: to changedPolicy when set,
// as a change of everything otherwise. The initial list's objects are
// changes here too: the informer starts when the API appears, after the
// first sync.
func (w *clusterPolicies) policyChanged(obj any, ev policyEvent) {
	if w.changedPolicy != nil {
		w.changedPolicy(obj, ev)
		return
	}
	w.changed()
}
