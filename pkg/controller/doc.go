// Package controller keeps the node's ruleset and the evaluator's program in
// step with the API objects.
//
// It runs client-go informers for NetworkPolicies, Namespaces and Nodes
// (slimmed by a transform to what policies read), a pod store
// (pkg/podstore: every pod, as it is stored, in one map), an informer for
// ClusterNetworkPolicies that runs while discovery says their CRD is
// served, event handlers that only mark the state dirty, and one sync loop
// that compiles, applies one transaction, and then publishes the program
// to the evaluator and runs the hooks, through its Applier (apply.go), the
// one copy of that sequence, which the in-process test harness
// (tests/internal/inproc) drives too; the loop's passes are shared fairly between
// namespaces by what their policy changes cost (fairshare.go). Nothing is
// written to the kernel before every informer has synced (the
// ClusterNetworkPolicy one is waited for a bounded time: its CRD may be
// missing, or unreadable). It also reports invalid policies of both APIs
// (log, metric, Event) and exposes the agent's metrics.
package controller
