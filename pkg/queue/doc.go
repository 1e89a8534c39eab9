// Package queue is nftpolicy's userspace executor: the evaluator that
// decides a connection from the policy program, and the NFQUEUE runtime
// that feeds it the first packet of each queued connection.
//
// The evaluator reads only an immutable *compile.Program published through
// an atomic pointer (after the kernel transaction rendered from the same
// program committed); it never reads listers or parses selectors, and it
// allocates nothing per verdict. The runtime parses headers without
// allocation, asks the evaluator, and answers with one verdict: an allowed
// packet is repeated through the chain with nftpolicy's mark bit (kept
// together with every mark bit it does not own), which the ruleset moves
// into the connection's mark so later packets of the connection are never
// queued again; a denied packet is dropped.
package queue
