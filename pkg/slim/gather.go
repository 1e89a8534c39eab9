package slim

import (
	"context"
	"net"
	"time"
)

// gatherWait is how long a read waits, after one that emptied the socket
// of a small amount, for more to arrive.
const (
	gatherWait  = 5 * time.Millisecond
	gatherBelow = 32 << 10
)

// gatheringConn lets data gather in the socket between reads of a
// trickle. An API server that writes the pod watch's initial events slower
// than the agent reads them flushes each event on its own (whenever its
// queue is empty): a TLS record and a TCP segment per pod, every pod of
// the cluster when the agent starts, which read one at a time cost a
// system call and a wake-up of the reading goroutine each. Waiting
// gatherWait after a read that found little lets the next read take
// dozens of them at once. A read that filled its buffer is followed at
// once; an event arriving alone (a pod change) waits for nothing; one
// arriving right after another, at most gatherWait.
type gatheringConn struct {
	net.Conn
	short bool
	sleep func(time.Duration)
}

func (c *gatheringConn) Read(p []byte) (int, error) {
	if c.short {
		c.sleep(gatherWait)
	}
	n, err := c.Conn.Read(p)
	c.short = n < len(p) && n < gatherBelow
	return n, err
}

// gatheringDial dials with dial (nil: a net.Dialer's) and wraps the
// connection.
func gatheringDial(dial func(ctx context.Context, network, address string) (net.Conn, error)) func(ctx context.Context, network, address string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return &gatheringConn{Conn: conn, sleep: time.Sleep}, nil
	}
}
