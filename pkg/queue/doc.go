// Package queue is nftpolicy's NFQUEUE runtime: it reads the packets the
// ruleset queues and answers each with the verdict of its Decider.
//
// Which packets are queued is the ruleset's choice (pkg/compile): in
// `--mode queue`, the first packet of every new connection that a local
// pod's isolation concerns, in the chains that would otherwise decide it in
// the kernel; in hybrid mode only the new connections of pod addresses no
// program knows yet, because every policy verdict is decided by the
// kernel's sets and chains; in kernel mode nothing. The agent's Decider is
// pkg/evaluate's Evaluator (Evaluating), a Holder: a connection of an
// unknown pod address is held until the pod is programmed, bounded,
// and answered from its own goroutine (hold.go).
//
// The runtime (runtime.go) binds the queues and reads each on an OS thread
// of its own with blocking reads into a fixed buffer, speaking
// nfnetlink_queue directly (reader_linux.go, nfqmsg.go); it parses each
// packet's headers without allocating (packet.go), asks its Decider (which
// may answer later: DeferringDecider), and answers with one verdict, the
// verdicts of the packets read together in one write (a batch verdict when
// they are all the same): an allowed packet is repeated through the base
// chain with nftpolicy's mark bit added to the marks it already carries,
// which the ruleset's first rule moves into the connection's mark so that
// the connection's later packets are accepted without being queued; a
// denied packet is dropped; an unparsable packet is dropped; a packet whose
// Decider panicked is accepted without being remembered under --fail-open,
// and dropped otherwise. A queue that overflows drops (never the kernel's
// fail-open flag), and held packets are bounded per source (hold.go). It
// counts its verdicts (counters.go) and reads the kernel's per-queue
// statistics (kernelstats.go), logging queue overflows (overflow_linux.go).
//
// An agent being replaced hands its queues over to its successor
// (handover.go).
package queue
