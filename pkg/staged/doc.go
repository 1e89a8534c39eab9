// Package staged reports what staged policies (compile.StagedAnnotation)
// would do: one log line and one count per new connection whose verdict
// would change if they were enforced.
//
// The ruleset (compile.RenderConfig.StagedLogGroup) copies the first
// packet of every new connection of a local pod that a staged policy
// selects to an NFLOG group, rate limited per source in the kernel,
// without holding or deciding it. The group's reader (pkg/nflogread) hands
// the Logger (its Consumer) each copy, which it decides with the evaluator
// under the program in force and under the same input with the staged
// policies enforced (built once per program), and
// logs the connections whose verdicts differ ("would deny", "would
// allow"), naming the staged verdict's deciding policy and rule, rate
// limited again per connection and overall.
//
// It imports pkg/compile (the programs), pkg/evaluate (the one
// evaluator), pkg/queue (the packet type), pkg/nflogread and pkg/denylog
// (its configuration and flow limiter); nothing imports it but the
// command.
package staged
