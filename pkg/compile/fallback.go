package compile

// Fallback is why the Tracker did not apply a change (ApplyPod,
// ApplyPolicy, ApplyClusterPolicy): the caller rebuilds, and nothing was
// changed. NoFallback means the change was applied. The reasons:
//
//   - not-built: there was no Rebuild yet.
//   - queue-mode: a policy change in queue mode, where the evaluator
//     decides every selected pod's connections from the program, which
//     only a build updates.
//   - key-mismatch: the key or name given does not name the object.
//   - domain-names: a ClusterNetworkPolicy with domainNames peers before or
//     after the change, or a pod's first or last use of a combination with
//     one: the DNS capture, its subjects and the learned addresses are
//     shared state the build alone decides.
//   - address-shared: an address the pod has or had is claimed by another
//     pod too (ownership is decided over all pods).
//   - node-address: an address the pod has or had is a node's (known as
//     the node's only while no pod holds it).
//   - dns-capture: the pod starts or stops being captured for DNS learning
//     in a way that changes the capture's shape (its first subject, its
//     last, or a subject of a policy the last build did not capture for).
//   - staged: with the staged log on (RenderConfig.StagedLogGroup), a
//     change of a staged policy (before or after the change), or a pod
//     that is the first or last local subject of a staged policy: the
//     staged log's subjects and its chain are decided by a build.
//   - cost: a NetworkPolicy change whose new version might pass its budget
//     or its namespace's (Budgets; the tracker bounds what it makes
//     without matching its selectors) and might fit it too (a version
//     whose peers' matching alone passes its budget is applied, rejected
//     for its budget, as the build rejects it), or in a namespace where
//     a policy was rejected for the namespace's budget: the build charges
//     what it makes and decides. Also a pod change that might take a
//     NetworkPolicy whose peers are matched against its namespace past its
//     budget or its namespace's (tracker_budget.go re-costs as pods come).
//   - shared-set: a change after which a build would share peer sets
//     differently (peershare.go): a pod that one peer of a shared set
//     selects and another does not, a shared set falling below
//     ShareMinMembers pods, a set coming to hold exactly what another
//     holds; a NetworkPolicy change that adds, drops or reorders a peer
//     of a shared set (deleting the policy too: which peer names a set,
//     and how many share it, depend on every policy's peers, in build
//     order), or with a new peer that selects what a set holds. An edit
//     that keeps those peers, in order, is applied (checkPolicyShares).
//     A ClusterNetworkPolicy change of a policy using a shared set,
//     before or after.
//   - namespace-staged: a Namespace change that stages or unstages its
//     NetworkPolicies (ApplyNamespace): which policies are in force is
//     decided by a build.
type Fallback string

// NoFallback means the change was applied.
const NoFallback Fallback = ""

// Changes of any kind.
const FallbackNotBuilt Fallback = "not-built"

// Policy changes.
const (
	FallbackQueueMode   Fallback = "queue-mode"
	FallbackKeyMismatch Fallback = "key-mismatch"
	FallbackDomainNames Fallback = "domain-names"
	FallbackCost        Fallback = "cost"
	// FallbackSharedSet is a change of either kind (pod or policy).
	FallbackSharedSet Fallback = "shared-set"
)

// Pod changes (a pod's first or last use of a combination chain can also
// give domain-names).
const (
	FallbackAddressShared Fallback = "address-shared"
	FallbackNodeAddress   Fallback = "node-address"
	FallbackDNSCapture    Fallback = "dns-capture"
)

// FallbackStaged is a staged policy change, or a pod's first or last use
// of the staged log, with the staged log on.
const FallbackStaged Fallback = "staged"

// FallbackNamespaceStaged is a Namespace change of its stagedness.
const FallbackNamespaceStaged Fallback = "namespace-staged"

// Fallbacks lists every reason a change can fall back, for metrics.
func Fallbacks() []Fallback {
	return []Fallback{FallbackNotBuilt, FallbackQueueMode, FallbackKeyMismatch,
		FallbackDomainNames, FallbackCost, FallbackAddressShared, FallbackNodeAddress, FallbackDNSCapture, FallbackStaged, FallbackSharedSet, FallbackNamespaceStaged}
}
