package queue

import (
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
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

var protoBucketNames = [numProtoBuckets]string{"tcp", "udp", "sctp", "icmp", "other"}

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

// ProtoName returns a short name of an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_UDPLITE:
		return "udplite"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_DCCP:
		return "dccp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

type counters struct {
	// [0 deny, 1 allow][0 IPv4, 1 IPv6][protocol bucket]
	verdicts           [2][2][numProtoBuckets]atomic.Uint64
	received           atomic.Uint64
	malformed          atomic.Uint64
	unparsableAccepted atomic.Uint64
	unparsableDropped  atomic.Uint64
	panicsAccepted     atomic.Uint64
	panicsDropped      atomic.Uint64
	verdictErrors      atomic.Uint64
	receiveErrors      atomic.Uint64
	denyLogsSuppressed atomic.Uint64
	markLoops          atomic.Uint64
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
	// UnparsableAccepted/Dropped count packets that could not be parsed,
	// answered by FailOpen.
	UnparsableAccepted uint64
	UnparsableDropped  uint64
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
		UnparsableAccepted:    c.unparsableAccepted.Load(),
		UnparsableDropped:     c.unparsableDropped.Load(),
		DeciderPanicsAccepted: c.panicsAccepted.Load(),
		DeciderPanicsDropped:  c.panicsDropped.Load(),
		VerdictErrors:         c.verdictErrors.Load(),
		ReceiveErrors:         c.receiveErrors.Load(),
		DenyLogsSuppressed:    c.denyLogsSuppressed.Load(),
		MarkLoops:             c.markLoops.Load(),
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
