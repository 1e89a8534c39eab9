package nflogread

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// copyRange is how much of each packet the kernel copies: enough for an
// IPv6 header, a few extension headers and the ports.
const copyRange = 256

// Consumer takes the messages of a group that carry its prefixes.
type Consumer struct {
	// Group is the NFLOG group it reads.
	Group uint16
	// Name says what it does, in the reader's log lines ("Reading the
	// deny log").
	Name string
	// Claims reports whether a message's prefix is the consumer's. A
	// message no consumer of its group claims goes to the group's first
	// consumer (which counts it as unknown).
	Claims func(prefix string) bool
	// Handle takes one message: its prefix, the start of its packet and
	// when it was read.
	Handle func(prefix string, p queue.Packet, now time.Time)
	// Dropped counts the consumer's messages the reader could not hand
	// over, by reason: "unparsable" (a packet too short or not IP),
	// "read_error" (the socket's buffer overflowed: messages were lost).
	Dropped *prometheus.CounterVec
	// Logger writes the reader's lines about the consumer (Name when the
	// group is bound, read errors at verbosity 2); the reader's when unset.
	Logger klog.Logger
}

// Deliver hands one message to c: its packet parsed, or counted as
// unparsable.
func (c Consumer) Deliver(prefix string, payload []byte, now time.Time) {
	p, err := queue.ParsePacket(payload)
	if err != nil {
		c.Dropped.WithLabelValues("unparsable").Inc()
		return
	}
	c.Handle(prefix, p, now)
}

// Readers are the agent's NFLOG readers, one per group. Add every
// consumer before the first Run.
type Readers struct {
	log    klog.Logger
	netns  int
	groups map[uint16][]*Consumer
}

// New returns the readers of the groups of network namespace netns (a
// file descriptor; 0: the caller's).
func New(log klog.Logger, netns int) *Readers {
	return &Readers{log: log, netns: netns, groups: map[uint16][]*Consumer{}}
}

// Add makes c a consumer of its group.
func (r *Readers) Add(c Consumer) { r.groups[c.Group] = append(r.groups[c.Group], &c) }

// Groups are the groups consumed, in order.
func (r *Readers) Groups() []uint16 { return slices.Sorted(maps.Keys(r.groups)) }

// Deliver hands one message of group to the consumer that claims its
// prefix (the group's first when none does); nothing when the group has
// no consumer.
func (r *Readers) Deliver(group uint16, prefix string, payload []byte, now time.Time) {
	cs := r.groups[group]
	if len(cs) == 0 {
		return
	}
	c := cs[0]
	if len(cs) > 1 {
		for _, x := range cs {
			if x.Claims != nil && x.Claims(prefix) {
				c = x
				break
			}
		}
	}
	c.Deliver(prefix, payload, now)
}

// Run reads group until ctx ends, handing each message over (Deliver);
// read errors are counted for each of the group's consumers, since any of
// them may have lost messages.
func (r *Readers) Run(ctx context.Context, group uint16) error {
	cs := r.groups[group]
	if len(cs) == 0 {
		return fmt.Errorf("NFLOG group %d: no consumer", group)
	}
	logs := make([]klog.Logger, len(cs))
	for i, c := range cs {
		if logs[i] = c.Logger; logs[i].GetSink() == nil {
			logs[i] = r.log
		}
	}
	// QThresh 1: the kernel sends each message at once. Its default
	// batches up to 100 messages or one second, which would delay a lone
	// message's line by a second; the kernel's limits keep the message
	// rate low.
	nf, err := nflog.Open(&nflog.Config{Group: group, Copymode: nflog.CopyPacket, Bufsize: copyRange, NetNS: r.netns, QThresh: 1,
		Logger: nflogLogger{r.log}})
	if err != nil {
		return fmt.Errorf("opening NFLOG group %d: %w", group, err)
	}
	defer nf.Close()
	err = nf.RegisterWithErrorFunc(ctx, func(a nflog.Attribute) int {
		if a.Prefix != nil && a.Payload != nil {
			r.Deliver(group, *a.Prefix, *a.Payload, time.Now())
		}
		return 0
	}, func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		for i, c := range cs {
			logs[i].V(2).Info(c.Name, "err", err)
			c.Dropped.WithLabelValues("read_error").Inc()
		}
		return 0
	})
	if err != nil {
		return fmt.Errorf("binding NFLOG group %d: %w", group, err)
	}
	for i, c := range cs {
		logs[i].Info(c.Name, "group", group)
	}
	<-ctx.Done()
	return nil
}

// nflogLogger adapts klog to go-nflog's logger; it reports its shutdown
// through Errorf, so everything goes to verbose levels.
type nflogLogger struct{ l klog.Logger }

func (n nflogLogger) Debugf(format string, args ...any) {
	if v := n.l.V(5); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...))
	}
}

func (n nflogLogger) Errorf(format string, args ...any) {
	if v := n.l.V(3); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...))
	}
}
