// Package bench measures nftpolicy on this machine: the cost of enforcement
// on real connections between network namespaces, the delay from an API
// write to the first connection that observes the new verdict, and the
// agent's footprint with tens of thousands of pods in a real API server.
// hack/bench.sh runs it (through cmd/nftbench) together with the Go
// benchmarks of pkg/sets and pkg/evaluate and prints docs/performance.md's
// table.
//
// Every measurement of a data path is reported against a control measured
// in the same run, interleaved with it round by round: the machines it runs
// on are shared and noisy, so bare times mean little.
//
// The package is test infrastructure: it needs root, creates and deletes its
// own network namespaces and never touches the caller's namespace, firewall
// or routes. Load is bounded in connections and in time.
package bench
