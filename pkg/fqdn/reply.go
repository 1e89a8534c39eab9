package fqdn

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// CauseOutOfOrder is the Result.Cause of a TCP segment dropped because it
// starts beyond the next byte of its stream: TCP sends it again, in order.
const CauseOutOfOrder = "out_of_order"

// tracker is the learner's view of the pods' DNS traffic: their
// outstanding UDP queries and their DNS-over-TCP streams. Its zero value
// is ready. The DNS queue has one reader, so packets arrive in order and
// one at a time; the lock only guards against other callers.
type tracker struct {
	mu      sync.Mutex
	queries queryTable
	flows   flowTable
	logs    *rate.Limiter
}

// HandlePacket handles one packet queued on the DNS queue: a query of a
// local pod with domainNames rules (recorded, then released) or a reply to
// one (learned if it answers an outstanding query, then released). packet
// starts at the IP header, the UDP or TCP header at offset l4.
//
// UDP: a reply is learned only when it matches an outstanding query of the
// pod exactly (addresses, ports, ID, question), which it consumes.
//
// TCP: each connection's two streams are reassembled from the server's
// SYN-ACK on; messages are read only from the streams' message
// boundaries, replies matched to the queries read on the same connection.
// A segment that starts beyond the next byte is dropped (TCP retransmits
// it in order); the segment that completes a reply is held until the reply
// is learned; a retransmission of read bytes is released. A connection
// that is not followed (opened before the agent, evicted, past a bound) is
// never learned from: its segments are released unlearned and counted.
//
// The hold time of replies is observed.
func (l *Learner) HandlePacket(ctx context.Context, proto uint8, src, dst netip.Addr, packet []byte, l4 int) Result {
	start := time.Now()
	res, reply := l.handlePacket(ctx, proto, src.Unmap(), dst.Unmap(), packet, l4)
	if reply {
		d := time.Since(start)
		l.cfg.Metrics.hold.Observe(d.Seconds())
		if l.cfg.OnHold != nil {
			l.cfg.OnHold(d)
		}
	}
	return res
}

// handlePacket is HandlePacket; reply reports whether the packet carried
// (part of) a reply.
func (l *Learner) handlePacket(ctx context.Context, proto uint8, src, dst netip.Addr, packet []byte, l4 int) (res Result, reply bool) {
	seg, err := parseSegment(proto, packet, l4)
	if err != nil {
		return l.skip(Cause(err), src, dst), true
	}
	x := l.index()
	podOf := func(a netip.Addr) string {
		if x == nil {
			return ""
		}
		if e := x.pods[a]; e != nil {
			return e.key
		}
		return ""
	}
	t := &l.track
	t.mu.Lock()
	defer t.mu.Unlock()
	if proto == 17 {
		return l.handleUDP(ctx, seg, src, dst, podOf, x == nil)
	}
	return l.handleTCP(ctx, seg, src, dst, podOf, x == nil)
}

func (l *Learner) queryTimeout() time.Duration {
	if l.cfg.QueryTimeout > 0 {
		return l.cfg.QueryTimeout
	}
	return DefaultQueryTimeout
}

func (l *Learner) handleUDP(ctx context.Context, seg segment, src, dst netip.Addr, podOf func(netip.Addr) string, noProgram bool) (Result, bool) {
	t, m := &l.track, l.cfg.Metrics.capture
	now := l.cfg.Now()
	client, server := netip.AddrPortFrom(dst, seg.dport), netip.AddrPortFrom(src, seg.sport)
	dstPod, srcPod := podOf(dst), podOf(src)
	if seg.sport == 53 && dstPod != "" {
		id, q, ok := ReplyQuestion(seg.data)
		k := queryKey{pod: client, server: server, id: id}
		// A pod's query from port 53 to another pod's port 53 is a query
		// unless it answers one.
		if seg.dport != 53 || srcPod == "" || ok && t.queries.has(k) {
			switch {
			case !l.cfg.Trusted(src):
				return l.skip(CauseUntrusted, src, dst), true
			case !ok:
				return l.skip(unmatchedCause(seg.data), src, dst), true
			case !t.queries.take(k, q, now):
				m.outstanding.Set(float64(t.queries.len()))
				return l.skip(CauseUnsolicited, src, dst), true
			}
			m.outstanding.Set(float64(t.queries.len()))
			return l.Learn(ctx, src, dst, seg.data), true
		}
	}
	if seg.dport == 53 && srcPod != "" {
		if !l.cfg.Trusted(dst) {
			m.queriesNotRecorded.WithLabelValues(queryUntrusted).Inc()
			return Result{Release: true}, false
		}
		id, q, ok := ParseQuery(seg.data)
		if !ok {
			m.queriesNotRecorded.WithLabelValues(CauseMalformed).Inc()
			return Result{Release: true}, false
		}
		pq := pendingQuery{key: queryKey{pod: netip.AddrPortFrom(src, seg.sport), server: netip.AddrPortFrom(dst, seg.dport), id: id},
			q: q, pod: srcPod, expires: now.Add(l.queryTimeout())}
		if n := t.queries.add(pq, now); n > 0 {
			m.queriesEvicted.Add(float64(n))
			l.logLimited("Outstanding DNS queries evicted: the pod has too many; their replies will not be learned", "pod", srcPod, "evicted", n)
		}
		m.queriesRecorded.Inc()
		m.outstanding.Set(float64(t.queries.len()))
		return Result{Release: true}, false
	}
	if seg.sport == 53 {
		if noProgram {
			return l.skip(CauseNoProgram, src, dst), true
		}
		return l.skip(CauseNoMatch, src, dst), true
	}
	return Result{Release: true}, false
}

// unmatchedCause is why a message that is not a response with one question
// is not learned.
func unmatchedCause(msg []byte) string {
	if _, err := ParseReply(msg); err != nil {
		return Cause(err)
	}
	return CauseUnsolicited
}

func (l *Learner) handleTCP(ctx context.Context, seg segment, src, dst netip.Addr, podOf func(netip.Addr) string, noProgram bool) (Result, bool) {
	t, m := &l.track, l.cfg.Metrics.capture
	now := l.cfg.Now()
	defer func() { m.streams.Set(float64(t.flows.len())) }()
	src4, dst4 := netip.AddrPortFrom(src, seg.sport), netip.AddrPortFrom(dst, seg.dport)
	if f := t.flows.get(flowKey{client: dst4, server: src4}); f != nil {
		return l.serverSegment(ctx, f, seg, src, dst, now)
	}
	if f := t.flows.get(flowKey{client: src4, server: dst4}); f != nil {
		return l.clientSegment(f, seg, now), false
	}
	if seg.sport == 53 && seg.flags&(tcpSYN|tcpACK|tcpRST) == tcpSYN|tcpACK {
		// The server accepts a connection of a pod: follow both streams
		// from here. Its ACK is the pod's first sequence number plus one.
		if pod := podOf(dst); pod != "" && l.cfg.Trusted(src) {
			f := &flow{key: flowKey{client: dst4, server: src4}, pod: pod, isn: seg.seq}
			f.up.Start(seg.ack, MaxQueryMessage)
			f.down.Start(seg.seq+1, 0)
			t.flows.add(f, now, func(old *flow) { l.untrack(old, untrackEvicted) })
		}
		return Result{Release: true}, false
	}
	if len(seg.data) == 0 {
		return Result{Release: true}, false
	}
	switch {
	case seg.sport == 53 && podOf(dst) != "":
		if !l.cfg.Trusted(src) {
			return l.skip(CauseUntrusted, src, dst), true
		}
		return l.skip(CauseUntracked, src, dst), true
	case seg.sport == 53 && noProgram:
		return l.skip(CauseNoProgram, src, dst), true
	case seg.sport == 53:
		return l.skip(CauseNoMatch, src, dst), true
	case seg.dport == 53 && podOf(src) != "":
		m.queriesNotRecorded.WithLabelValues(CauseUntracked).Inc()
	}
	return Result{Release: true}, false
}

// serverSegment handles a segment of a tracked connection from the server.
func (l *Learner) serverSegment(ctx context.Context, f *flow, seg segment, src, dst netip.Addr, now time.Time) (Result, bool) {
	t := &l.track
	t.flows.touch(f, now)
	switch {
	case seg.flags&tcpRST != 0:
		t.flows.remove(f)
		return Result{Release: true}, false
	case seg.flags&tcpSYN != 0:
		if !f.lost && seg.seq != f.isn {
			l.untrack(f, untrackISN)
		}
		return Result{Release: true}, false
	case f.lost:
		if seg.flags&tcpFIN != 0 {
			t.flows.remove(f)
		}
		if len(seg.data) == 0 {
			return Result{Release: true}, false
		}
		return l.skip(CauseUntracked, src, dst), true
	case seg.cut:
		l.untrack(f, untrackTruncate)
		return l.skip(CauseUntracked, src, dst), true
	}
	fed := f.down.Feed(seg.seq, seg.data)
	switch fed.Kind {
	case FeedOld:
		if seg.flags&tcpFIN != 0 && seg.seq+uint32(len(seg.data)) == f.down.Next() {
			t.flows.remove(f)
		}
		return Result{Release: true}, len(seg.data) > 0
	case FeedFuture:
		l.cfg.Metrics.capture.segmentsDropped.Inc()
		return Result{Cause: CauseOutOfOrder}, true
	case FeedTooLong:
		l.untrack(f, untrackTooLong)
		return l.skip(CauseUntracked, src, dst), true
	}
	if !l.keepsBuffers(f, f.up.Buffered()+f.down.Pending(fed)) {
		return l.skip(CauseUntracked, src, dst), true
	}
	queries := slices.Clone(f.queries)
	res := Result{Release: true}
	learned := false
	for _, msg := range fed.Msgs {
		id, q, ok := ReplyQuestion(msg)
		i := slices.Index(f.queries, streamQuery{id: id, q: q})
		if !ok || i < 0 {
			cause := CauseUnsolicited
			if !ok {
				cause = unmatchedCause(msg)
			}
			r := l.skip(cause, src, dst)
			if !learned {
				res.Cause = r.Cause
			}
			continue
		}
		f.queries = slices.Delete(f.queries, i, i+1)
		r := l.Learn(ctx, src, dst, msg)
		if !r.Release {
			// The segment is dropped: the stream stays as it was, the
			// retransmission is read (and learned) afresh.
			f.queries = queries
			return r, true
		}
		res.Learned += r.Learned
		if r.Cause == "" {
			learned = true
			res.Cause = ""
		} else if !learned {
			res.Cause = r.Cause
		}
	}
	f.down.Commit(fed)
	t.flows.setBytes(f, f.up.Buffered()+f.down.Buffered())
	if seg.flags&tcpFIN != 0 {
		t.flows.remove(f)
	}
	return res, true
}

// clientSegment handles a segment of a tracked connection from the pod:
// the queries it completes are recorded.
func (l *Learner) clientSegment(f *flow, seg segment, now time.Time) Result {
	t, m := &l.track, l.cfg.Metrics.capture
	t.flows.touch(f, now)
	switch {
	case seg.flags&tcpRST != 0:
		t.flows.remove(f)
		return Result{Release: true}
	case f.lost:
		if len(seg.data) > 0 {
			m.queriesNotRecorded.WithLabelValues(CauseUntracked).Inc()
		}
		return Result{Release: true}
	case seg.cut:
		l.untrack(f, untrackTruncate)
		return Result{Release: true}
	}
	fed := f.up.Feed(seg.seq, seg.data)
	switch fed.Kind {
	case FeedOld:
		return Result{Release: true}
	case FeedFuture:
		m.segmentsDropped.Inc()
		return Result{Cause: CauseOutOfOrder}
	case FeedTooLong:
		l.untrack(f, untrackTooLong)
		return Result{Release: true}
	}
	if !l.keepsBuffers(f, f.down.Buffered()+f.up.Pending(fed)) {
		return Result{Release: true}
	}
	for _, msg := range fed.Msgs {
		id, q, ok := ParseQuery(msg)
		if !ok {
			m.queriesNotRecorded.WithLabelValues(CauseMalformed).Inc()
			continue
		}
		if len(f.queries) >= MaxStreamQueries {
			f.queries = slices.Delete(f.queries, 0, 1)
			m.queriesEvicted.Inc()
		}
		f.queries = append(f.queries, streamQuery{id: id, q: q})
		m.queriesRecorded.Inc()
	}
	f.up.Commit(fed)
	t.flows.setBytes(f, f.up.Buffered()+f.down.Buffered())
	return Result{Release: true}
}

// keepsBuffers reports whether f may buffer about n bytes; if not, f is no
// longer followed.
func (l *Learner) keepsBuffers(f *flow, n int) bool {
	if l.track.flows.fits(f, n) {
		return true
	}
	l.untrack(f, untrackBuffer)
	return false
}

// untrack stops following f's streams (counted, logged rate-limited).
func (l *Learner) untrack(f *flow, cause string) {
	l.track.flows.lose(f)
	l.cfg.Metrics.capture.streamsUntracked.WithLabelValues(cause).Inc()
	l.logLimited("DNS-over-TCP connection no longer followed: its replies are released unlearned", "cause", cause, "pod", f.pod,
		"client", f.key.client, "server", f.key.server)
}

// logLimited logs at V(2), at most a few lines a second.
func (l *Learner) logLimited(msg string, kv ...any) {
	t := &l.track
	if t.logs == nil {
		t.logs = rate.NewLimiter(5, 10)
	}
	if v := l.cfg.Logger.V(2); v.Enabled() && t.logs.Allow() {
		v.Info(msg, kv...)
	}
}
