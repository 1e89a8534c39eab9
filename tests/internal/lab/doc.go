// Package lab runs a cluster's nodes in network namespaces with the
// agent's parts in process, tells them what to enforce, and probes them.
//
// A Lab is a netlab lab (nodes node-1 and node-2 plus any node a scenario
// names, one namespace per pod, external hosts attached to node-1) in
// which every node runs what the agent would run (tests/internal/inproc):
// compile.Build for that node, compile.Render, and a sets.Syncer that
// applies the ruleset inside the node's namespace; in hybrid and queue
// mode also a queue.Runtime bound to NFQUEUE in that namespace, deciding
// with the evaluator of that node's program, and with Config.Revoke a
// conntrack revoker. What the nodes enforce comes from a scenario
// (docs/scenario-format.md: Apply, Check) or from API objects the caller
// edits (Know, SetPolicy, Publish), so that a pod can send before the
// agents know it.
//
// Probes are real TCP connections and UDP datagrams between the
// namespaces, run concurrently; a probe is allowed when it connects (TCP)
// or is echoed (UDP), denied when it times out, and anything else
// (refused, unreachable, wrong responder) is a harness error, not a
// verdict. Every result is an Outcome: what the kernel did next to the
// verdict the probe should get, for a scenario's probes evaluate.Evaluate on
// the cluster-wide program (the answer of `nftpolicy eval`). Because both
// read one compile.Program, the comparison checks Render, the syncer, the
// queue runtime and the kernel path against the evaluator; it cannot see a
// mistake in Build itself, which both would share.
//
// The kernel suite (tests/kernel), the red-team attacks (tests/redteam)
// and the benchmarks (tests/bench) use it; tests that need the real agent
// binary and an API server use tests/internal/cluster. The package is test
// infrastructure: it needs root, creates and deletes its own network
// namespaces and never touches the caller's namespace, firewall or routes.
// The product must not import it.
package lab
