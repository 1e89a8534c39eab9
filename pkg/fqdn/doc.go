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
//  5. parses it with golang.org/x/net/dns/dnsmessage (ParseMessage) and
//     finds, for each question, the addresses it resolves to: those the
//     question owns, and those of the owners it reaches through the
//     reply's CNAME records along a chain that starts at it. Records no
//     chain from the question reaches are ignored; loops and chains longer
//     than 16 names end. A reply cannot make an address stand for a name
//     that does not resolve to it ("x.attacker.test A addr" next to
//     "x.attacker.test CNAME www.example.com" admits addr for
//     x.attacker.test only);
//  6. learns AAAA answers only as IPv6 addresses: IPv4-mapped answers
//     (::ffff:a.b.c.d), which a dual-stack socket would reach over IPv4
//     from the pod's IPv4 address, and unspecified, loopback, multicast and
//     broadcast answers are not learned (counted by cause);
//  7. matches the question, and only the question, against the patterns
//     of the rules that apply to the receiving pod: the trusted resolver
//     answers the name the pod asked, but the records it relays past the
//     question were written by the zones the chain passes through, and a
//     zone the pod controls may alias its name to any other
//     ("y.attacker.test CNAME www.example.com", "www.example.com A addr"
//     admits addr for no rule naming www.example.com); the store keeps
//     the question, so Resolved and later programs' sets agree;
//  8. writes "pod address . answer address" into each matching rule's set
//     with a timeout of the chain's smallest TTL, clamped, in one netlink
//     batch (Writer), and records the matching names in the pod's store
//     for the userspace evaluator (Resolved);
//  9. only then lets the kernel release the reply.
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
// # The store
//
// Each pod's answers are kept in a store of its own, behind a lock of its
// own, reached through the pod index (an atomic pointer, rebuilt once per
// program): a reply takes only its pod's lock, and so does the evaluator's
// Resolved, which looks up the pod, then the few names that resolved to
// the peer address, then matches their patterns. A reply's work is
// proportional to its records, not to what the pod learned before. A pod
// keeps at most Config.MaxNamesPerPod names and MaxAddrsPerPod
// name-address pairs (--fqdn-max-names-per-pod, --fqdn-max-addresses-per-
// pod); past them the names it learned least recently are evicted
// (nftpolicy_dns_learned_evictions_total) and the kernel elements of the
// addresses no kept name resolves to are deleted, so a pod that floods its
// resolver bounds its own memory and elements and slows no other pod.
// Expired answers are dropped lazily.
//
// # Program changes
//
// The controller calls OnProgram after each publication. A pod that is no
// longer a local subject of a domainNames rule, or whose addresses
// changed, loses its store and its elements are deleted from the kernel:
// a pod given the same address later inherits nothing. In hybrid mode the
// controller applies pod changes to the kernel before it publishes a
// program; it calls OnPodApplied with each, and a departed pod's elements
// are deleted then, before a new pod can hold its address. A pod whose rules
// have sets it did not have before (a new rule, or a set replaced because
// the rule's names changed) gets the store's unexpired answers that those
// rules match written into them: narrowing a rule keeps what still
// matches, widening admits only what the pod resolved. At the agent's
// first publication the rules' sets are read back and the elements a
// previous agent process wrote for pods that are no longer subjects are
// deleted; an element of a pod deleted while no agent ran whose address a
// new subject of the same rule already holds cannot be told apart and
// stays until its timeout.
//
// The package imports pkg/compile only: pkg/fqdn/wire connects it to the
// netlink writer (pkg/sets) and the queue runtime (pkg/queue).
package fqdn
