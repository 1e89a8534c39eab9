package compile

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Staged subjects: a program built without Input.EnforceStaged leaves the
// staged policies out, but records which local pods they select
// (Pod.StagedSubject) and their names (Program.StagedPolicies). Only
// those pods' verdicts can change once the staged policies are enforced,
// so only their connections are copied to the staged log
// (render_staged.go); everything else stays on the kernel fast path.

// stagedSubject is one staged policy's selection: a NetworkPolicy's
// podSelector in its namespace, or a ClusterNetworkPolicy's subject, and
// the directions it can change (a NetworkPolicy's policyTypes, a
// ClusterNetworkPolicy's directions with rules).
type stagedSubject struct {
	name    string
	ns      string
	target  labels.Selector
	cluster *clusterSubject
	dirs    [2]bool
}

// matches reports whether the staged policy selects a pod of namespace ns
// (labels nsl) with labels pl.
func (s *stagedSubject) matches(ns string, nsl labels.Set, pl map[string]string) bool {
	if s.cluster != nil {
		return s.cluster.matchesLabels(nsl, pl)
	}
	return s.ns == ns && s.target.Matches(labels.Set(pl))
}

// collectStaged records the staged policies of the input (none when the
// input enforces them).
func (b *builder) collectStaged(in Input) {
	if b.stagedNS == nil {
		return
	}
	for _, np := range in.Policies {
		if b.enforced(np) {
			continue
		}
		pr := &problems{}
		target, ok := pr.parseSelector(field.NewPath("spec", "podSelector"), &np.Spec.PodSelector)
		if !ok {
			target = labels.Everything() // as the build reads an invalid selector
		}
		s := stagedSubject{name: policyKey(np), ns: np.Namespace, target: target}
		s.dirs[Ingress], s.dirs[Egress] = pr.policyTypes(&np.Spec)
		b.staged = append(b.staged, s)
	}
	for _, cnp := range in.ClusterPolicies {
		if b.enforcedClusterPolicy(cnp) {
			continue
		}
		b.staged = append(b.staged, b.stagedClusterSubject(cnp))
	}
	slices.SortFunc(b.staged, func(x, y stagedSubject) int { return strings.Compare(x.name, y.name) })
	b.staged = slices.CompactFunc(b.staged, func(x, y stagedSubject) bool { return x.name == y.name })
	for i := range b.staged {
		b.prog.StagedPolicies = append(b.prog.StagedPolicies, b.staged[i].name)
	}
}

// stagedClusterSubject is a staged ClusterNetworkPolicy's selection.
func (b *builder) stagedClusterSubject(cnp *npav1beta1.ClusterNetworkPolicy) stagedSubject {
	subj, _ := b.clusterSubject(&problems{}, field.NewPath("spec", "subject"), &cnp.Spec.Subject)
	s := stagedSubject{name: cnp.Name, cluster: &subj}
	s.dirs[Ingress], s.dirs[Egress] = len(cnp.Spec.Ingress) > 0, len(cnp.Spec.Egress) > 0
	return s
}

// markStaged sets Pod.StagedSubject on the local pods of the program.
func (b *builder) markStaged() {
	if len(b.staged) == 0 {
		return
	}
	for i := range b.prog.Pods {
		pod := &b.prog.Pods[i]
		if pod.Local {
			pod.StagedSubject = b.stagedDirs(pod.Namespace, pod.Labels)
		}
	}
}

// stagedDirs returns the directions in which a staged policy selects a
// pod of namespace ns with labels pl.
func (b *builder) stagedDirs(ns string, pl map[string]string) [2]bool {
	var out [2]bool
	if len(b.staged) == 0 {
		return out
	}
	nsl := b.nsLabels[ns]
	if nsl == nil {
		nsl = labels.Set{NamespaceNameLabel: ns}
	}
	for i := range b.staged {
		s := &b.staged[i]
		if (s.dirs[Ingress] && !out[Ingress] || s.dirs[Egress] && !out[Egress]) && s.matches(ns, nsl, pl) {
			out[Ingress] = out[Ingress] || s.dirs[Ingress]
			out[Egress] = out[Egress] || s.dirs[Egress]
		}
	}
	return out
}

// isStaged reports whether the last build left a policy out as staged (a
// NetworkPolicy by key, a ClusterNetworkPolicy by name).
func (b *builder) isStaged(name string) bool {
	_, ok := slices.BinarySearchFunc(b.staged, name, func(s stagedSubject, n string) int { return strings.Compare(s.name, n) })
	return ok
}

// stagedLocal reports whether a pod is a local subject of a staged policy.
func stagedLocal(pod *Pod) bool {
	return pod != nil && pod.Local && (pod.StagedSubject[Ingress] || pod.StagedSubject[Egress])
}

// indexStaged counts the local staged subjects of the last build.
func (t *Tracker) indexStaged() {
	t.stagedUse = 0
	for i := range t.prog.Pods {
		if stagedLocal(&t.prog.Pods[i]) {
			t.stagedUse++
		}
	}
}

// stagedChange returns how a pod change moves the number of local staged
// subjects. The staged log's chain and sets exist while there is one
// (render_staged.go): the first and the last change the ruleset's shape,
// which a build decides.
func (t *Tracker) stagedChange(old, cur *Pod) (int, Fallback) {
	if t.cfg.StagedLogGroup == 0 {
		return 0, NoFallback
	}
	delta := 0
	if stagedLocal(old) {
		delta--
	}
	if stagedLocal(cur) {
		delta++
	}
	if n := t.stagedUse + delta; (t.stagedUse == 0) != (n == 0) {
		return 0, FallbackStaged
	}
	return delta, NoFallback
}

// stagedPolicyChange tells whether a policy change (new, nil when deleted)
// touches a staged policy while the staged log is on: its subjects are
// the staged log's, which a build decides.
func (t *Tracker) stagedPolicyChange(name string, staged bool) Fallback {
	if t.cfg.StagedLogGroup == 0 || t.b == nil {
		return NoFallback
	}
	if staged || t.b.isStaged(name) {
		return FallbackStaged
	}
	return NoFallback
}
