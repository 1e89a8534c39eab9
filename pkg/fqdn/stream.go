package fqdn

import (
	"encoding/binary"
)

// DNS over TCP is a byte stream of messages, each after a two-byte length
// (RFC 1035 4.2.2, RFC 7766). A segment may start anywhere in that stream:
// inside a message, inside a TXT record a pod chose, at a length prefix
// the pod forged there. Only the stream read from its start says where
// messages begin, so the learner reassembles each direction of each TCP
// connection it captures (Stream) and learns only the messages it read
// from message boundaries.

// MaxFrame is the most one framed message takes on a stream: the length
// and 65535 bytes.
const MaxFrame = 2 + 0xffff

// Stream reads one direction of a TCP connection as framed DNS messages,
// in sequence order. Its zero value is not ready: Start it.
//
// Feed never changes the stream: it returns what a segment would make of
// it (the messages it completes, the state after), and Commit applies
// that once the segment is released. A segment that is dropped (its
// answers could not be written) therefore leaves the stream as it was, and
// its retransmission is read afresh.
type Stream struct {
	// next is the sequence number of the next byte to read.
	next uint32
	// buf holds the unfinished message's bytes from its length prefix on
	// (at most MaxFrame-1).
	buf []byte
	// limit is the largest message (after the prefix) accepted.
	limit int
}

// Start readies s for a stream whose first byte has sequence number next,
// accepting messages of at most limit bytes (0: 65535).
func (s *Stream) Start(next uint32, limit int) {
	if limit <= 0 || limit > 0xffff {
		limit = 0xffff
	}
	*s = Stream{next: next, limit: limit}
}

// Next returns the sequence number of the next byte the stream reads.
func (s *Stream) Next() uint32 { return s.next }

// Buffered returns the memory the stream holds (its buffer's capacity).
func (s *Stream) Buffered() int { return cap(s.buf) }

// FeedKind is what a segment is to a stream.
type FeedKind uint8

// What a segment is to a stream.
const (
	// FeedOld: no byte the stream has not read (no data, or a
	// retransmission of read bytes): release it, nothing to learn.
	FeedOld FeedKind = iota
	// FeedNew: it carries the next bytes; Fed.Msgs are the messages they
	// complete.
	FeedNew
	// FeedFuture: it starts beyond the next byte (a segment before it is
	// missing): drop it, TCP sends it again after the missing one.
	FeedFuture
	// FeedTooLong: a message longer than the stream's limit: the stream
	// cannot be followed.
	FeedTooLong
)

// Fed is what Feed made of a segment.
type Fed struct {
	Kind FeedKind
	// Msgs are the messages the segment completes, without their length
	// prefixes, in stream order. They alias the stream's memory and the
	// segment's: use them before Commit and before the next Feed.
	Msgs [][]byte
	next uint32
	// grow: the unfinished message goes on, and rest is appended to it;
	// otherwise rest replaces it.
	grow bool
	rest []byte
}

// Feed reads a segment whose first data byte has sequence number seq. It
// does not change s (see Commit). Its work is linear in the new bytes and
// in the messages they complete: the unfinished message is copied once,
// when it completes.
func (s *Stream) Feed(seq uint32, data []byte) Fed {
	if len(data) == 0 {
		return Fed{Kind: FeedOld}
	}
	d := int32(seq - s.next)
	if d > 0 {
		return Fed{Kind: FeedFuture}
	}
	// Bytes before next were read: a receiver takes the rest of a
	// partial retransmission the same way (it trims what it has).
	skip := uint32(-int64(d))
	if uint64(skip) >= uint64(len(data)) {
		return Fed{Kind: FeedOld}
	}
	data = data[skip:]
	f := Fed{Kind: FeedNew, next: s.next + uint32(len(data))}
	if b := len(s.buf); b > 0 {
		// The unfinished message: its length is in the buffer, or in
		// its first byte and the segment's.
		var n int
		if b >= 2 {
			n = int(binary.BigEndian.Uint16(s.buf))
		} else {
			n = int(s.buf[0])<<8 | int(data[0])
		}
		if n > s.limit {
			return Fed{Kind: FeedTooLong}
		}
		k := 2 + n - b // the message's bytes in this segment
		if k > len(data) {
			f.grow, f.rest = true, data
			return f
		}
		// Copied out of s.buf's array: Commit may reuse it.
		msg := make([]byte, 0, 2+n)
		msg = append(append(msg, s.buf...), data[:k]...)
		f.Msgs = append(f.Msgs, msg[2:])
		data = data[k:]
	}
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		if n > s.limit {
			return Fed{Kind: FeedTooLong}
		}
		if len(data) < 2+n {
			break
		}
		f.Msgs = append(f.Msgs, data[2:2+n:2+n])
		data = data[2+n:]
	}
	f.rest = data
	return f
}

// Pending returns how many bytes of unfinished message s holds after
// Commit(f): what f would make it buffer.
func (s *Stream) Pending(f Fed) int {
	if f.Kind != FeedNew {
		return len(s.buf)
	}
	if f.grow {
		return len(s.buf) + len(f.rest)
	}
	return len(f.rest)
}

// Commit applies what Feed returned for a segment that is released. A Fed
// of another kind than FeedNew changes nothing.
func (s *Stream) Commit(f Fed) {
	if f.Kind != FeedNew {
		return
	}
	s.next = f.next
	switch {
	case f.grow:
		s.buf = append(s.buf, f.rest...)
	case len(f.rest) == 0:
		s.buf = nil
	case cap(s.buf) >= len(f.rest) && cap(s.buf) <= 2*len(f.rest)+64:
		// rest lies in the segment, or in a message copied out of s.buf.
		s.buf = s.buf[:len(f.rest)]
		copy(s.buf, f.rest)
	default:
		s.buf = append([]byte(nil), f.rest...)
	}
}
