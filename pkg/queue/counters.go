package queue

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Protocol buckets of the verdict counters.
const (
	protoTCP = iota
	protoUDP
	protoSCTP
	protoICMP
	protoOther
	numProtoBuckets
)

var protoBucketNames = [numProtoBuckets]string{compile.ProtoTCP.Name(), compile.ProtoUDP.Name(), compile.ProtoSCTP.Name(), "icmp", "other"}

// ProtoLabel is a protocol's metric label, one of a small fixed set: tcp,
// udp (UDP-Lite too), sctp, icmp (ICMPv6 too), other.
func ProtoLabel(p uint8) string { return protoBucketNames[protoBucket(p)] }

func protoBucket(p uint8) int {
	switch p {
	case unix.IPPROTO_TCP:
		return protoTCP
	case unix.IPPROTO_UDP, unix.IPPROTO_UDPLITE:
		return protoUDP
	case unix.IPPROTO_SCTP:
		return protoSCTP
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		return protoICMP
	}
	return protoOther
}

type counters struct {
	// [0 deny, 1 allow][0 IPv4, 1 IPv6][protocol bucket]
	verdicts           [2][2][numProtoBuckets]atomic.Uint64
	received           atomic.Uint64
	malformed          atomic.Uint64
	unparsableDropped  atomic.Uint64
	panicsAccepted     atomic.Uint64
	panicsDropped      atomic.Uint64
	verdictErrors      atomic.Uint64
	receiveErrors      atomic.Uint64
	denyLogsSuppressed atomic.Uint64
	markLoops          atomic.Uint64
	batchVerdicts      atomic.Uint64
	deferred           atomic.Uint64
	deferredPending    atomic.Int64
	overflowDropped    atomic.Uint64
	overflowLogs       atomic.Uint64
	heldDroppedSource  atomic.Uint64
	heldDroppedFull    atomic.Uint64
}

func (c *counters) count(allow bool, family, proto uint8) {
	a, f := 0, 0
	if allow {
		a = 1
	}
	if family == 6 {
		f = 1
	}
	c.verdicts[a][f][protoBucket(proto)].Add(1)
}

// VerdictCount is one verdict counter of a Stats snapshot.
type VerdictCount struct {
	Allow  bool
	Family uint8  // 4 or 6
	Proto  string // "tcp" (TCP), "udp" (UDP, UDP-Lite), "sctp", "icmp" (ICMP, ICMPv6), "other"
	Count  uint64
}

// Stats is a snapshot of a Runtime's counters, all monotonic.
type Stats struct {
	// Received counts the packets read from the queues.
	Received uint64
	// Verdicts has the non-zero verdict counters of parsed packets.
	Verdicts []VerdictCount
	// Malformed counts queue messages without a packet id (no verdict possible).
	Malformed uint64
	// UnparsableDropped counts packets that could not be parsed: dropped
	// whatever the fail mode (their bytes are the sender's to choose).
	UnparsableDropped uint64
	// DeciderPanicsAccepted/Dropped count packets whose Decider panicked.
	DeciderPanicsAccepted uint64
	DeciderPanicsDropped  uint64
	// VerdictErrors counts verdicts that could not be sent (the packet then
	// stays queued until the socket closes).
	VerdictErrors uint64
	// ReceiveErrors counts socket read errors.
	ReceiveErrors uint64
	// DenyLogsSuppressed counts denials not logged because of the rate limit.
	DenyLogsSuppressed uint64
	// MarkLoops counts packets queued while already carrying AllowMark,
	// accepted without a decision: the ruleset's first rule is missing or
	// uses another mark (must stay 0).
	MarkLoops uint64
	// BatchVerdicts counts NFQNL_MSG_VERDICT_BATCH messages sent: each
	// answered several packets read in one round with the same verdict.
	BatchVerdicts uint64
	// Deferred counts packets a DeferringDecider answered later;
	// DeferredPending is how many of them wait for their verdict now.
	Deferred        uint64
	DeferredPending int64
	// OverflowDropped counts packets the kernel dropped because a queue or
	// its socket buffer was full (fail-closed), as the overflow watcher saw
	// them in the kernel's statistics; OverflowLogs counts its log lines.
	OverflowDropped uint64
	OverflowLogs    uint64
	// HeldDroppedSource and HeldDroppedFull count held packets (a Holder's)
	// dropped because their source address, or all sources, had as many
	// held as allowed (RuntimeConfig.MaxHeldPerSource, MaxQueueLen).
	HeldDroppedSource uint64
	HeldDroppedFull   uint64
}

// Allowed returns the number of allow verdicts.
func (s Stats) Allowed() uint64 { return s.sum(true) }

// Denied returns the number of deny verdicts.
func (s Stats) Denied() uint64 { return s.sum(false) }

func (s Stats) sum(allow bool) uint64 {
	var n uint64
	for _, v := range s.Verdicts {
		if v.Allow == allow {
			n += v.Count
		}
	}
	return n
}

// Stats returns a snapshot of the counters.
func (r *Runtime) Stats() Stats {
	c := &r.c
	s := Stats{
		Received:              c.received.Load(),
		Malformed:             c.malformed.Load(),
		UnparsableDropped:     c.unparsableDropped.Load(),
		DeciderPanicsAccepted: c.panicsAccepted.Load(),
		DeciderPanicsDropped:  c.panicsDropped.Load(),
		VerdictErrors:         c.verdictErrors.Load(),
		ReceiveErrors:         c.receiveErrors.Load(),
		DenyLogsSuppressed:    c.denyLogsSuppressed.Load(),
		MarkLoops:             c.markLoops.Load(),
		BatchVerdicts:         c.batchVerdicts.Load(),
		Deferred:              c.deferred.Load(),
		DeferredPending:       c.deferredPending.Load(),
		OverflowDropped:       c.overflowDropped.Load(),
		OverflowLogs:          c.overflowLogs.Load(),
		HeldDroppedSource:     c.heldDroppedSource.Load(),
		HeldDroppedFull:       c.heldDroppedFull.Load(),
	}
	for a := 0; a < 2; a++ {
		for f := 0; f < 2; f++ {
			for p := 0; p < numProtoBuckets; p++ {
				if n := c.verdicts[a][f][p].Load(); n != 0 {
					s.Verdicts = append(s.Verdicts, VerdictCount{Allow: a == 1, Family: uint8(4 + 2*f), Proto: protoBucketNames[p], Count: n})
				}
			}
		}
	}
	return s
}
