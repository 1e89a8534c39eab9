// Package compile compiles the cluster's policy objects into the program and
// the desired nftables ruleset that enforce them, in full or incrementally.
//
// It owns two pure steps, and a Tracker that keeps their result current:
//
//	API objects (policies, pods, namespaces) --Build--> *Program
//	*Program --Render--> *Ruleset (the desired content of table inet nftpolicy)
//	one object's change --Tracker--> the same Ruleset, edited (or a Fallback)
//
// The Program is immutable once built and is read by both executors: the
// kernel ruleset is rendered from it, and pkg/evaluate's evaluator
// decides from it. Every object name is made in names.go; the renderer records on
// the objects what the Tracker needs, so nothing reads a name back. The
// package does no I/O, keeps no clock, and logs nothing: the same input
// gives the same output, byte for byte, which the golden tests rely on. Invalid policies never make Build fail: their problems are
// returned in Program.Problems and the invalid parts allow nothing (see
// docs/semantics.md). The README in this directory explains the hooks,
// priorities and chain layout of the rendered ruleset.
package compile
