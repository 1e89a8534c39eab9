// Package compile turns Kubernetes API objects into nftpolicy's policy model
// and that model into the desired nftables ruleset.
//
// It owns two pure steps:
//
//	API objects (policies, pods, namespaces) --Build--> *Program
//	*Program --Render--> *Ruleset (the desired content of table inet nftpolicy)
//
// The Program is immutable once built and is read by both executors: the
// kernel ruleset is rendered from it, and pkg/evaluate's evaluator decides
// from it. The package does no I/O, keeps no clock, and logs nothing: the
// same input gives the same output, byte for byte, which the golden tests
// rely on. Invalid policies never make Build fail: their problems are
// returned in Program.Problems and the invalid parts allow nothing (see
// docs/semantics.md). The README in this directory explains the hooks,
// priorities and chain layout of the rendered ruleset.
package compile
