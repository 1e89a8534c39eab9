// Package inproc runs what `nftpolicy agent` runs on one node, inside the
// test process and without an API server: a pkg/sets syncer writing the
// node's table over netlink in the node's network namespace, and in queue
// mode the evaluator and the NFQUEUE runtime bound in that namespace. The
// caller builds the programs (compile.Build) and hands them to Apply; Apply
// and ApplyPodEvents run the agent's own sequence, controller.Applier
// (commit, then publish to the evaluator and run the agent's hooks), not a
// copy of it.
// In hybrid mode the runtime runs too: the ruleset queues new connections
// of pod addresses no program knows yet.
//
// tests/internal/lab runs one per node; tests that need the real agent
// binary and an API server use tests/internal/cluster instead.
package inproc
