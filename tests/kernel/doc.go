// Package kernel runs scenarios (docs/scenario-format.md) on the real kernel
// and compares every probe with the userspace evaluator.
//
// A Cluster is a netlab lab (network namespaces: nodes node-1 and node-2
// plus any node a scenario names, one namespace per pod, external hosts
// attached to node-1) in which every node runs what the agent would run:
// compile.Build for that node, compile.Render, and a sets.Syncer that
// applies the ruleset with the real nft binary inside the node's namespace
// (every knftables call runs on a thread locked into it, so the nft child
// process inherits it); in queue mode also a queue.Runtime bound to NFQUEUE
// in that namespace, deciding with the evaluator of that node's program, and
// with the xt-compat variant the queue rule written over netlink by
// queuerule.InstallCompatQueueRule as the syncer's External installer. Probes are
// real TCP connections and UDP datagrams between the namespaces, run
// concurrently; a probe is allowed when it connects (TCP) or is echoed
// (UDP), denied when it times out, and anything else (refused, unreachable,
// wrong responder) is a harness error, not a verdict. Each probe is compared
// with evaluate.Evaluate on the cluster-wide program, the answer of
// `nftpolicy eval`.
//
// Because both executors read one compile.Program, the comparison checks
// Render, the syncer, the queue runtime and the kernel path against the
// evaluator; it cannot see a mistake in Build itself, which both would share.
//
// Tests (root only; they skip otherwise):
//
//	go test ./tests/kernel                       # scenarios in testdata/, all modes
//	hack/diff.sh --seeds 1-100 [--mode queue]    # generated scenarios (cmd/npdiff)
//
// The package is test infrastructure: it creates and deletes
// its own network namespaces and never touches the caller's namespace,
// firewall or routes. The product must not import it.
package kernel
