package compile

import (
	"fmt"
	"time"

	"sigs.k8s.io/knftables"
)

// Per-source shares of what the kernel hands to userspace: the NFQUEUE and
// the deny log's NFLOG group. Both are one resource per node that every
// pod's packets compete for; without a per-source bound, one pod that
// opens connections fast enough fills the queue (every other pod's queued
// connections then fail) or spends the whole log budget (every other pod's
// denials go unlogged). A meter (a dynamic set keyed by the source address,
// each element a token bucket) gives each source address its own rate and
// burst: what exceeds them is dropped and counted in the rule's counter,
// and only that source's packets are; every other source keeps its share.
//
// The meters' rules use a statement (update @set { key limit ... }) that
// the netlink writer of rules (pkg/nftnl rules.go) does not encode, so
// they live in static chains whose rules depend on the configuration only:
// nft writes them with every full sync, and no incremental sync ever
// rewrites them. The chains that may change incrementally (the deny
// chains) only jump to them.

// Defaults of the per-source shares.
//
// The held path: a connection of an unknown pod address waits in the
// kernel queue until the pod is programmed, up to UnknownPodWait (2 s), so
// a source's packets in the queue at once are at most burst + rate * 2 s.
// With the queue's default length of 4,096 packets (--max-queue-len) and a
// share of 1/16 of it per source (256 packets), rate 64/s and burst 128
// give 128 + 64 * 2 = 256: 16 sources flooding at once fill the queue, one
// or a few cannot. A pod that starts fine needs a handful of connections
// before it is known (tens of milliseconds); a known pod connecting to
// just-started pods gets 128 at once and 64 a second more. Past its share
// a source's SYN is dropped and retransmitted (after 1 s, 3 s), by when the
// pod is usually known and the kernel decides without the queue.
//
// Queue mode's path: these connections are decided at once, so what a
// source can take is a share of what a queue decides a second and, in a
// burst, of its length. Measured in the red-team lab
// (TestRedTeamQueueShareFlood: one queue, 2 vCPUs shared with the flooder
// and, at times, other jobs): with the share out of reach, one pod sending
// raw SYNs from two threads had the queue decide 72,000 to 122,000 a
// second (up to 172,000 with four threads), and the queue was full often
// enough that the kernel dropped 2-14% of what reached it, any pod's. One
// client thread on an idle node of that size opens some 14,600
// connections a second through the queue (the comparison's connection
// benchmark), so the share is 30,000/s: twice that, and less than half of
// the lowest capacity measured. Under the flood at that share the queue
// decided some 32,000 a second and never filled, and every connection of
// the other pod connected. The burst of 512 is 1/8 of the queue (whose
// socket buffer holds all of it: pkg/queue ReadBufferPerPacket). Several
// sources flooding together can still fill it, and so can one when other
// work starves the reader below the share: with another benchmark on the
// same 2 vCPUs the queue decided 21,000 to 28,000 a second under the
// flood and overflowed in 5 of 34 runs (a share of 10,000 did not in 6).
// The share trades that margin for not dropping one fast client's SYNs.
//
// The deny log (DefaultDenyLogRate and DefaultDenyLogBurst, denylog.go):
// per source 5 messages a second, burst 10, and 200 a second
// overall, burst 400 (the userspace reader writes at most 50 lines a
// second by default, after merging repeats of a flow): one pod's denials
// take at most 1/40 of the overall budget, 40 sources' denials are all
// logged at once.
//
// The DNS queue (render_fqdn.go): every query of a pod with domainNames
// rules and every reply to it passes through it, read by one reader.
// Queries are keyed by the pod's source address, replies by their
// destination (the pod): the server's address is every pod's, a share
// keyed on it would let one pod spend every pod's. Per pod and direction
// 1,000 packets a second, burst 256 (1/16 of the queue's 4,096): a pod
// holds at most 512 packets of it at once, so eight pods bursting together
// fill it, one cannot; at full rate a pod sends the reader 2,000 packets a
// second, and the reader, at some 50 µs a reply (p50 of dns_hold_us, more
// under contention), keeps up with several such pods. A pod's normal rate
// is a few to hundreds of lookups a second; with a search path (up to six
// names, A and AAAA each) a burst of 256 still covers some twenty lookups at
// once, and a TCP reply of 64 KiB is some 45 segments. Over the share a
// query is dropped (the pod's resolver retries it); so is a reply, rather
// than released unlearned: a released answer would sit in the pod's
// resolver cache for its TTL while the kernel denies its address, and a
// TCP segment released without the learner seeing it breaks the stream's
// reassembly, where a dropped one is resent in order.
const (
	DefaultDNSPodRate        = 1000
	DefaultDNSPodBurst       = 256
	DefaultHeldSourceRate    = 64
	DefaultHeldSourceBurst   = 128
	DefaultQueueSourceRate   = 30000
	DefaultQueueSourceBurst  = 512
	DefaultDenyLogTotalRate  = 200
	DefaultDenyLogTotalBurst = 400
	// sourceSetSize bounds each meter's elements (source addresses seen in
	// the last sourceSetTimeout): the kernel's memory for it. A source that
	// finds the set full is not limited, but the sources in it are.
	sourceSetSize    = 65535
	sourceSetTimeout = time.Minute
)

// queueShareChains renders the chains that bound each source's share of
// the queue before the queue chain: ChainQueueHeld for the unknown-pod
// rules, ChainQueueShare for queue mode's dispatch.
func (r *renderer) queueShareChains() {
	if r.cfg.QueuesUnknownPods() {
		r.sourceLimitChain(ChainQueueHeld, meterHeld, r.cfg.HeldSourceRate, r.cfg.HeldSourceBurst, gotoV(ChainQueue),
			"new connections of unknown pod addresses: each source address may hold a bounded share of the queue")
	}
	if r.cfg.Mode == ModeQueue {
		r.sourceLimitChain(ChainQueueShare, meterQueue, r.cfg.QueueSourceRate, r.cfg.QueueSourceBurst, gotoV(ChainQueue),
			"new connections decided in userspace: each source address gets a bounded share of the queue")
	}
}

// dnsShareChains renders the chains that bound each local pod's share of
// the DNS queue before ChainDNS: ChainDNSQueryShare keyed by the query's
// source, ChainDNSReplyShare by the reply's destination.
func (r *renderer) dnsShareChains() {
	r.sourceLimitChain(ChainDNSQueryShare, meterDNSQuery, r.cfg.DNSPodRate, r.cfg.DNSPodBurst, gotoV(ChainDNS),
		"DNS queries of pods with domainNames rules: each pod gets a bounded share of the DNS queue")
	r.destLimitChain(ChainDNSReplyShare, meterDNSReply, r.cfg.DNSPodRate, r.cfg.DNSPodBurst, gotoV(ChainDNS),
		"DNS replies to pods with domainNames rules: each pod gets a bounded share of the DNS queue")
}

// denyLogLimits renders ChainDenyLogLimits: a packet over its source's
// rate or over the overall rate is dropped here unlogged (every packet
// that reaches it is being denied); the others return to their deny chain,
// which logs them.
func (r *renderer) denyLogLimits() {
	if r.cfg.DenyLogGroup == 0 {
		return
	}
	c := r.sourceLimitChain(ChainDenyLogLimits, meterDenyLog, r.cfg.DenyLogRate, r.cfg.DenyLogBurst, RuleVerdict{},
		"deny log budget: per source address and overall; over it a denied packet is dropped unlogged")
	c.Rules = append(c.Rules, mkRule([]RuleExpr{limitOver(r.cfg.DenyLogTotalRate, r.cfg.DenyLogTotalBurst)}, counted(drop()),
		"over the overall deny log budget"))
}

// sourceLimitChain renders a chain that drops, and counts, the packets of a
// source address over rate/burst, per family, with its meters (named after
// prefix, meterSetName), and ends with last (if any).
func (r *renderer) sourceLimitChain(name, prefix string, rate, burst uint32, last RuleVerdict, comment string) *Chain {
	return r.addrLimitChain(name, prefix, true, rate, burst, last, comment)
}

// destLimitChain is sourceLimitChain keyed by the destination address:
// the share of the address packets go to, as the replies to a pod are.
func (r *renderer) destLimitChain(name, prefix string, rate, burst uint32, last RuleVerdict, comment string) *Chain {
	return r.addrLimitChain(name, prefix, false, rate, burst, last, comment)
}

// addrLimitChain renders a meter chain keyed by the packet's source or
// destination address, its meters named after prefix; it drops what is
// over the limit.
func (r *renderer) addrLimitChain(name, prefix string, bySource bool, rate, burst uint32, last RuleVerdict, comment string) *Chain {
	return r.addrLimitChainOver(name, prefix, bySource, rate, burst, last, drop(), comment)
}

// addrLimitChainOver is addrLimitChain with the verdict of what is over
// the limit: drop, or return for a chain that must not decide.
func (r *renderer) addrLimitChainOver(name, prefix string, bySource bool, rate, burst uint32, last, over RuleVerdict, comment string) *Chain {
	field, what := "saddr", "source"
	if !bySource {
		field, what = "daddr", "destination"
	}
	c := &Chain{Chain: knftables.Chain{Name: name, Comment: ptr(comment)}}
	for _, v4 := range []bool{true, false} {
		set := meterSetName(prefix, bySource, v4)
		r.addSet(&Set{Dynamic: true, Key: []KeyKind{addrKind(v4)}, Set: &knftables.Set{Name: set,
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Size: ptr(uint64(sourceSetSize)), Timeout: ptr(sourceSetTimeout),
			Comment: ptr(fmt.Sprintf("per %s address: %d packets/second, burst %d (written by the rules of %s)", what, rate, burst, name))}})
		c.Rules = append(c.Rules, mkRule([]RuleExpr{meter(set, addrField(v4, field), rate, burst, true)}, counted(over), "over this "+what+"'s share"))
	}
	if last.Kind != VerdictNone {
		c.Rules = append(c.Rules, mkRule(nil, plain(last), ""))
	}
	r.addChain(c)
	return c
}

// validateShares checks the per-source rates of a configuration.
func (c *RenderConfig) validateShares() error {
	for _, l := range []struct {
		what        string
		rate, burst uint32
	}{
		{"held connections per source", c.HeldSourceRate, c.HeldSourceBurst},
		{"queued connections per source", c.QueueSourceRate, c.QueueSourceBurst},
		{"DNS packets per pod", c.DNSPodRate, c.DNSPodBurst},
	} {
		if l.rate == 0 || l.burst == 0 {
			return fmt.Errorf("%s: rate %d/second burst %d: both must be positive", l.what, l.rate, l.burst)
		}
	}
	if c.DenyLogGroup != 0 && (c.DenyLogTotalRate == 0 || c.DenyLogTotalBurst == 0) {
		return fmt.Errorf("deny log overall rate %d/second burst %d: both must be positive", c.DenyLogTotalRate, c.DenyLogTotalBurst)
	}
	return nil
}

// shareDefaults fills the per-source rates left zero.
func (c *RenderConfig) shareDefaults() {
	def := func(v *uint32, d uint32) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.HeldSourceRate, DefaultHeldSourceRate)
	def(&c.HeldSourceBurst, DefaultHeldSourceBurst)
	def(&c.QueueSourceRate, DefaultQueueSourceRate)
	def(&c.QueueSourceBurst, DefaultQueueSourceBurst)
	def(&c.DNSPodRate, DefaultDNSPodRate)
	def(&c.DNSPodBurst, DefaultDNSPodBurst)
	if c.DenyLogGroup != 0 {
		def(&c.DenyLogTotalRate, DefaultDenyLogTotalRate)
		def(&c.DenyLogTotalBurst, DefaultDenyLogTotalBurst)
	}
}
