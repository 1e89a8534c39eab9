// Package fqdn learns DNS answers for ClusterNetworkPolicy domainNames
// peers.
//
// The ruleset (pkg/compile, render_fqdn.go) queues, on a queue of their
// own read by one reader, the DNS traffic of local pods that an egress
// rule with domainNames applies to: their queries (once the policy accepted
// them) and the replies to them, over UDP and TCP. The Learner, through a
// pkg/queue PayloadDecider (HandlePacket):
//
//  1. records each query (the pod's address and port, the server's, the
//     transaction ID, the question) for a few seconds (Config.QueryTimeout)
//     and releases it;
//  2. takes a reply only if it answers an outstanding query of the pod
//     exactly, and consumes that query; anything else (a spoofed reply, one
//     for a question the pod never asked, a second reply) is released
//     unlearned and counted;
//  3. reads DNS over TCP as the pod's resolver does: each connection's
//     two streams are reassembled from the server's SYN-ACK on (Stream),
//     messages are taken only from message boundaries, never from where a
//     segment happens to start; a segment beyond the next byte is dropped
//     (TCP resends it in order), a retransmission released, the segment
//     that completes a reply held until it is learned; a connection the
//     learner does not follow (opened before it, or past its bounds) is
//     never learned from;
//  4. checks that the reply comes from a trusted DNS server (the cluster DNS
//     service's endpoints, or --dns-servers); others are never learned;
//  5. parses it with golang.org/x/net/dns/dnsmessage, follows CNAME chains
//     within the reply and takes its A and AAAA answers, matching the
//     chain's names against the patterns of the rules that apply to the
//     receiving pod (Learn);
//  6. writes "pod address . answer address" into each matching rule's set
//     with a timeout of the chain's smallest TTL, clamped, in one netlink
//     batch (Writer), and records the answer for the userspace evaluator
//     (Resolved);
//  7. only then lets the kernel release the reply.
//
// The pod therefore cannot open a connection to an answer before the kernel
// admits it: the race between a lookup and the connect that follows it is
// closed by construction, not made unlikely. A reply that cannot be
// learned is released unlearned and counted: releasing never widens
// access, learning what the pod did not ask, or bytes it reads as the
// middle of a message, would. A reply whose elements could not be written
// is dropped (the pod's resolver retries; over TCP the stream is rolled
// back and the retransmission learned) unless the agent fails open.
//
// Queries, streams and their buffers are bounded per pod and per node
// (MaxQueriesPerPod, MaxStreamsPerPod, MaxStreamBytesPerPod and the
// overall bounds); past them a pod loses its own oldest state, counted.
// Query matching does not stop a pod that can spoof the server's address
// and sees or guesses an outstanding query of another pod (its ports, ID
// and question): the kernel's source-address validation does.
//
// The package imports pkg/compile only: cmd/nftpolicy wires the netlink
// writer (pkg/sets) and the queue runtime (pkg/queue) to it.
package fqdn
