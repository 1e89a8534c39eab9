// Package kernel is the real-kernel suite: it runs scenarios
// (docs/scenario-format.md) in a lab (tests/internal/lab) and checks every
// probe against the userspace evaluator, in every mode, after full and
// incremental syncs, and the attacks' windows (new pods, revocation, DNS
// learning, the deny log); Minimize shrinks a scenario on which they
// disagree. Each of those runs over IPv6 too: dual-stack and IPv6-only pods
// probed per family (testdata/dualstack.yaml), the new-pod window and
// revocation per family, an AAAA answer from the DNS server's IPv6
// address, the deny log line of an IPv6 denial.
//
// Tests (root only; they skip otherwise):
//
//	go test ./tests/kernel                       # scenarios in testdata/, all modes
//	hack/diff.sh --seeds 1-100 [--mode queue]    # generated scenarios (cmd/npdiff)
//
// The product must not import it.
package kernel
