package fqdn

import (
	"context"
	"net/netip"
	"time"
)

// HandleReply handles one queued packet of a DNS reply: it takes the DNS
// message out of the UDP or TCP segment (the transport header at offset l4
// of packet, which starts at the IP header), learns it, and reports whether
// to release the packet. The hold time is observed. A TCP segment without
// data (an acknowledgement) is released at once and not counted.
func (l *Learner) HandleReply(ctx context.Context, proto uint8, src, dst netip.Addr, packet []byte, l4 int) Result {
	start := time.Now()
	msg, err := DNSPayload(proto, packet, l4)
	var res Result
	switch {
	case err != nil:
		res = l.skip(Cause(err), src, dst)
	case msg == nil:
		return Result{Release: true}
	default:
		res = l.Learn(ctx, src, dst, msg)
	}
	d := time.Since(start)
	l.cfg.Metrics.hold.Observe(d.Seconds())
	if l.cfg.OnHold != nil {
		l.cfg.OnHold(d)
	}
	return res
}
