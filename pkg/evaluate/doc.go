// Package evaluate decides a connection in userspace from a compiled policy
// program, as the kernel ruleset rendered from the same program decides it.
//
// Evaluate and EvaluateResolved read only an immutable *compile.Program
// through its evaluator layout (compile.EvalIndex); they never read
// listers or parse selectors, and deciding allocates nothing. Explain
// answers "why can't A reach B?" over the same program: the deciding rules
// and the nearest misses (explain.go); it is not on the packet path.
//
// An Evaluator holds the program in force on a node, published by Swap
// after the kernel transaction rendered from the same program committed.
// pkg/queue decides queued packets with it (queue.Evaluating), including
// the connections of pod addresses no program knows yet, which wait,
// bounded, for the pod to be programmed (unknown.go); pkg/conntrack asks
// it whether a connection's earlier program admitted it (DecideSides,
// DecideSidesBefore). A restarted agent decides from a snapshot of the
// program in force until its first sync (snapshot.go: Swap removes the
// snapshot before publishing and writes the new one afterwards).
package evaluate
