// Package fqdn learns DNS answers for ClusterNetworkPolicy domainNames
// peers.
//
// The ruleset (pkg/compile, render_fqdn.go) queues DNS replies to local
// pods that an egress rule with domainNames applies to, on a queue of their
// own. For each reply the Learner, a pkg/queue PayloadDecider:
//
//  1. checks that it comes from a trusted DNS server (the cluster DNS
//     service's endpoints, or --dns-servers); others are never learned;
//  2. parses it with golang.org/x/net/dns/dnsmessage, follows CNAME chains
//     within the reply and takes its A and AAAA answers;
//  3. matches every name of a chain (the question and the CNAME targets)
//     against the patterns of the rules that apply to the receiving pod;
//  4. writes "pod address . answer address" into each matching rule's set
//     with a timeout of the chain's smallest TTL, clamped, in one netlink
//     batch (Writer), and records the answer for the userspace evaluator
//     (Resolved);
//  5. only then lets the kernel release the reply.
//
// The pod therefore cannot open a connection to an answer before the kernel
// admits it: the race between a lookup and the connect that follows it is
// closed by construction, not made unlikely. A reply that cannot be
// learned (malformed, truncated, split over TCP segments, untrusted) is
// released unlearned and counted; a reply whose elements could not be
// written is dropped (the pod's resolver retries) unless the agent fails
// open.
//
// The package imports pkg/compile only: cmd/nftpolicy wires the netlink
// writer (pkg/sets) and the queue runtime (pkg/queue) to it.
package fqdn
