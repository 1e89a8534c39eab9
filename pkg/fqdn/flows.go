package fqdn

import (
	"container/list"
	"net/netip"
	"time"
)

// Bounds of TCP stream tracking. A pod's resolver holds a connection or
// two per server; a tracked stream buffers at most one unfinished message
// per direction. A pod past its bounds loses its own oldest streams; the
// overall bounds cap the learner's memory whatever the number of pods.
const (
	MaxStreamsPerPod     = 16
	MaxStreams           = 4096
	MaxStreamBytesPerPod = 1 << 20
	MaxStreamBytes       = 32 << 20
	// MaxQueryMessage bounds a query on a stream: one question and EDNS
	// options (padding, cookies) fit in far less.
	MaxQueryMessage = 4096
	// MaxStreamQueries bounds the outstanding queries of one stream.
	MaxStreamQueries = 64
	// StreamIdle forgets a stream idle that long (servers close idle
	// connections after seconds).
	StreamIdle = 2 * time.Minute
)

// Why a stream stopped being followed: the values of the cause label of
// nftpolicy_dns_tcp_streams_untracked_total.
const (
	untrackEvicted  = "evicted"
	untrackBuffer   = "buffer_limit"
	untrackTooLong  = "message_too_long"
	untrackISN      = "syn_mismatch"
	untrackTruncate = "truncated_capture"
)

// flowKey is a TCP connection: the pod's end and the server's.
type flowKey struct{ client, server netip.AddrPort }

// flow is one tracked DNS-over-TCP connection.
type flow struct {
	key flowKey
	pod string
	// isn is the server's initial sequence number (its SYN-ACK's).
	isn uint32
	// up carries the pod's queries, down the server's replies.
	up, down Stream
	// queries are the queries read on up and not answered yet, oldest
	// first.
	queries []streamQuery
	// lost: the stream is no longer followed; what it carries is released
	// unlearned. Kept (without buffers) so a retransmitted SYN-ACK does not
	// restart it mid-stream.
	lost  bool
	last  time.Time
	elem  *list.Element
	bytes int
}

type streamQuery struct {
	id uint16
	q  Question
}

// flowTable holds the tracked streams, least recently used first. Not safe
// for concurrent use (tracker's lock).
type flowTable struct {
	m      map[flowKey]*flow
	lru    list.List
	perPod map[string]*podStreams
	bytes  int
}

type podStreams struct{ n, bytes int }

func (t *flowTable) get(k flowKey) *flow {
	return t.m[k]
}

// touch marks f used now.
func (t *flowTable) touch(f *flow, now time.Time) {
	f.last = now
	t.lru.MoveToBack(f.elem)
}

// add starts tracking a connection, evicting (and counting in evicted) the
// pod's least recently used stream past MaxStreamsPerPod, the overall
// least recently used past MaxStreams, and streams idle for StreamIdle.
func (t *flowTable) add(f *flow, now time.Time, evicted func(*flow)) {
	if t.m == nil {
		t.m, t.perPod = map[flowKey]*flow{}, map[string]*podStreams{}
		t.lru.Init()
	}
	for e := t.lru.Front(); e != nil; e = t.lru.Front() {
		old := e.Value.(*flow)
		if now.Sub(old.last) < StreamIdle {
			break
		}
		t.remove(old)
	}
	if ps := t.perPod[f.pod]; ps != nil && ps.n >= MaxStreamsPerPod {
		for e := t.lru.Front(); e != nil; e = e.Next() {
			if old := e.Value.(*flow); old.pod == f.pod {
				if !old.lost {
					evicted(old)
				}
				t.remove(old)
				break
			}
		}
	}
	if len(t.m) >= MaxStreams {
		old := t.lru.Front().Value.(*flow)
		if !old.lost {
			evicted(old)
		}
		t.remove(old)
	}
	f.last = now
	f.elem = t.lru.PushBack(f)
	t.m[f.key] = f
	ps := t.perPod[f.pod]
	if ps == nil {
		ps = &podStreams{}
		t.perPod[f.pod] = ps
	}
	ps.n++
}

// remove stops tracking f and frees its buffers.
func (t *flowTable) remove(f *flow) {
	if t.m[f.key] != f {
		return
	}
	t.setBytes(f, 0)
	delete(t.m, f.key)
	t.lru.Remove(f.elem)
	if ps := t.perPod[f.pod]; ps != nil {
		if ps.n--; ps.n <= 0 {
			delete(t.perPod, f.pod)
		}
	}
}

// lose stops following f's stream: its buffers and queries go, the entry
// stays (marked lost).
func (t *flowTable) lose(f *flow) {
	t.setBytes(f, 0)
	f.lost = true
	f.up, f.down, f.queries = Stream{}, Stream{}, nil
}

// setBytes accounts f's buffers as n bytes.
func (t *flowTable) setBytes(f *flow, n int) {
	d := n - f.bytes
	f.bytes = n
	t.bytes += d
	if ps := t.perPod[f.pod]; ps != nil {
		ps.bytes += d
	}
}

// fits reports whether f may hold n bytes of buffers: within the pod's
// and the overall budget.
func (t *flowTable) fits(f *flow, n int) bool {
	d := n - f.bytes
	if d <= 0 {
		return true
	}
	ps := t.perPod[f.pod]
	return t.bytes+d <= MaxStreamBytes && (ps == nil || ps.bytes+d <= MaxStreamBytesPerPod)
}

// len returns the number of tracked streams (lost ones included).
func (t *flowTable) len() int { return len(t.m) }
