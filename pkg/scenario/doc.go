// Package scenario is the scenario file format (docs/scenario-format.md):
// it reads and validates a small cluster, its policies and the connections
// to try, and gives what the compiler, the evaluator and the harnesses need
// from it, the verdict every probe should get included.
package scenario
