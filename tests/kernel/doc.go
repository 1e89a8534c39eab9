// Package kernel is the real-kernel suite: it runs scenarios
// (docs/scenario-format.md) in a lab (tests/internal/lab) and checks every
// probe against the userspace evaluator, in every mode, after full and
// incremental syncs, and the attacks' windows (new pods, revocation, DNS
// learning, the deny log); Minimize shrinks a scenario on which they
// disagree.
//
// Tests (root only; they skip otherwise):
//
//	go test ./tests/kernel                       # scenarios in testdata/, all modes
//	hack/diff.sh --seeds 1-100 [--mode queue]    # generated scenarios (cmd/npdiff)
//
// The product must not import it.
package kernel
