// Package status answers "is my policy in force on every node?".
//
// Each agent keeps one cluster-scoped NodeEnforcement object (group
// nftpolicy.io, named after its node, owned by the Node) current: through
// which resourceVersion every NetworkPolicy and ClusterNetworkPolicy
// change is in its kernel (watermarks), the last policy changes it
// programmed with their change-to-enforced latency, deletions included,
// the policies it enforces only fail-closed (invalid, unsupported, too
// large), and whether its syncs are failing. The Reporter writes it after
// each commit, one write in flight per node, coalescing what happens
// meanwhile.
//
// Clients (kubectl nftpolicy status and wait) list the NodeEnforcements
// and the agents' pods, and decide per policy with Cluster.Evaluate: a
// node enforces a policy's current version when its agent pod is Ready,
// its watermark for the policy's kind is at least the policy's
// resourceVersion (resourceVersions are compared as the API defines,
// k8s.io/apimachinery/pkg/util/resourceversion), and its syncs are not
// failing. A deletion is enforced once the node's watermark reaches the
// deletion's resourceVersion, or it reports the deletion among its last
// changes.
package status
