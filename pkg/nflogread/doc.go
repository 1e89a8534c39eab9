// Package nflogread is the agent's one NFLOG reader: one socket per group,
// one parser of the packets' start (pkg/queue's), and the consumers that
// claim the group's messages by their prefix: the deny log (pkg/denylog),
// the staged log (pkg/staged) and runtime verification (pkg/verify). Each
// consumer keeps its own metrics; the reader counts what it cannot hand
// over (read errors, unparsable packets) in the consumer's dropped
// counter.
//
// Groups configured to the same number share one reader, which hands each
// message to the consumer whose prefix it carries: the kernel delivers a
// group to one socket only, so a second reader of it would never be
// bound.
//
// It imports pkg/queue (the packet parser) only.
package nflogread
