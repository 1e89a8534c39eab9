package tablewatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
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
	Logger klog.Logger
}

// Run reads notifications until ctx ends. Its socket is subscribed before
// it returns from the first dial; a failure after that is reported to
// OnLost and the socket opened again.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	probe := fmt.Sprintf("nftpolicy-probe-%d", os.Getpid())
	first := true
	for {
		err := watchOnce(ctx, cfg, probe, first)
		if ctx.Err() != nil {
			return nil
		}
		if first && err != nil {
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

// watchOnce opens a subscribed socket, sends the probe transaction on the
// first call, and reads until an error other than an overrun.
func watchOnce(ctx context.Context, cfg Config, probe string, first bool) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: cfg.NetNS})
	if err != nil {
		return fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer func() {
		if stop() {
			_ = c.Close()
		}
	}()
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("subscribing to nftables notifications: %w", err)
	}
	setReceiveBuffer(c)
	if first {
		if err := sendProbe(cfg.NetNS, probe); err != nil {
			// Without it, in a pid namespace, the agent's own netlink
			// transactions look like outside changes until identified by
			// name.
			cfg.Logger.Error(err, "Could not send the probe transaction; own transactions are recognised by process name and child pids only")
		}
	}
	d := Decoder{Table: cfg.Table, ProbeTable: probe}
	for {
		msgs, err := c.Receive()
		if errors.Is(err, unix.ENOBUFS) {
			d.Reset()
			cfg.OnLost("the notification socket overran (ENOBUFS)")
			continue
		}
		if err != nil {
			return err
		}
		for _, m := range msgs {
			t, ok := d.Decode(m)
			if !ok {
				continue
			}
			if t.Probe {
				cfg.Owner.Learn(t.PID)
			}
			if !t.Touched() || cfg.Owner.Own(&t) {
				continue
			}
			cfg.OnOutside(t)
		}
	}
}

func setReceiveBuffer(c *netlink.Conn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, receiveBufferBytes) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, receiveBufferBytes)
		}
	})
}

// sendProbe commits one transaction that creates and deletes the probe
// table: its NEWGEN names this process as the kernel sees it.
func sendProbe(netNS int, name string) error {
	var opts []nftables.ConnOption
	if netNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(netNS))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	conn.DelTable(t)
	return conn.Flush()
}
