package tablewatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// receiveBufferBytes is the notification socket's receive buffer: a flush
// of a big table notifies every rule and set of it at once, and a buffer
// that overruns loses notifications (then OnLost).
const receiveBufferBytes = 8 << 20

// redialDelay is how long the watcher waits before it opens its socket
// again after a failure.
const redialDelay = time.Second

// Config configures Run.
type Config struct {
	// Table is the inet table watched.
	Table string
	// NetNS is a file descriptor of the network namespace watched (0: the
	// calling thread's).
	NetNS int
	// Owner recognises the agent's own transactions.
	Owner *Owner
	// OnOutside is called, from Run's goroutine, with each transaction
	// that changed Table and was not the agent's.
	OnOutside func(Transaction)
	// OnLost is called when notifications may have been lost (the socket
	// overran, or failed and was opened again): whatever they said is
	// unknown, and only a full sync repairs it.
	OnLost func(reason string)
	// ReceiveBuffer is the socket's receive buffer in bytes (0:
	// receiveBufferBytes).
	ReceiveBuffer int
	// Subscribed, if set, is called each time the socket is subscribed:
	// changes committed after it are read.
	Subscribed func()
	Logger     klog.Logger
}

// Run reads notifications until ctx ends. It returns an error only when
// its first socket cannot be opened and subscribed; a failure after that
// is reported to OnLost and the socket opened again.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	first := true
	for {
		subscribed, err := watchOnce(ctx, cfg)
		if ctx.Err() != nil {
			return nil
		}
		if first && !subscribed {
			return err
		}
		first = false
		cfg.Logger.Error(err, "Reading nftables notifications failed; opening the socket again", "in", redialDelay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(redialDelay):
		}
		cfg.OnLost("the notification socket failed: " + err.Error())
	}
}

// watchOnce opens a subscribed socket and reads until an error other than
// an overrun; subscribed says whether it got as far as reading.
func watchOnce(ctx context.Context, cfg Config) (subscribed bool, err error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: cfg.NetNS})
	if err != nil {
		return false, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer func() {
		if stop() {
			_ = c.Close()
		}
	}()
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return false, fmt.Errorf("subscribing to nftables notifications: %w", err)
	}
	setReceiveBuffer(c, cmp.Or(cfg.ReceiveBuffer, receiveBufferBytes))
	if cfg.Subscribed != nil {
		cfg.Subscribed()
	}
	d := Decoder{Table: cfg.Table}
	for {
		msgs, err := c.Receive()
		if errors.Is(err, unix.ENOBUFS) {
			d.Reset()
			cfg.OnLost("the notification socket overran (ENOBUFS)")
			continue
		}
		if err != nil {
			return true, err
		}
		for _, m := range msgs {
			t, ok := d.Decode(m)
			if !ok {
				continue
			}
			if !t.Touched() || cfg.Owner.Own(&t) {
				continue
			}
			cfg.OnOutside(t)
		}
	}
}

func setReceiveBuffer(c *netlink.Conn, bytes int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, bytes)
		}
	})
}
