package sets

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	// The package's tests name a helper sync.
	stdsync "sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// Why mdlayher/netlink and not google/nftables' SetAddElements: the
// messages are few and simple (NEWSETELEM and DELSETELEM between
// BATCH_BEGIN and BATCH_END), and writing them here keeps what google/nftables
// does not offer: the bytes nft writes, including the "open interval"
// element flag (a userdata TLV next to the comment; nft 1.0.6 lists a set
// the same without it, later versions read it); socket buffers sized for
// the batch (Conn.Flush uses the default ones, a few hundred kilobytes,
// and expects one reply per message within them); extended error messages;
// and a connection dropped after any failure, so that no late reply is
// read as the next batch's. mdlayher/netlink opens the socket and runs the
// dumps; a batch is encoded into one buffer (nlbatch.go) and written, and
// its acknowledgements read (nlacks.go), on the socket's raw fd.

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (kernel 5.6), missing from
// x/sys/unix.
const nftaSetElemKeyEnd = 10

// Socket buffers asked for (SO_SNDBUFFORCE, SO_RCVBUFFORCE need
// CAP_NET_ADMIN, which the agent has; without it the kernel's maximum
// applies). A batch must fit in one send buffer: the kernel reads one batch
// from one message.
const netlinkBufferBytes = 8 << 20

// dumpBufferBytes is the receive buffer of one netlink message (dial).
const dumpBufferBytes = 64 << 10

// elementListBytes bounds one message's element list: a netlink attribute
// length is 16 bits.
const elementListBytes = 60 << 10

// NetlinkElements writes set and map element changes of the nftpolicy table
// over netlink, every change of a sync in one nfnetlink batch, which the
// kernel commits as one transaction or not at all. It replaces, for syncs
// that only change elements (pod churn), the nft process knftables starts:
// no process, no parsing. Safe for concurrent use, though the Syncer does
// not need it.
type NetlinkElements struct {
	netNS   int
	table   string
	timeout time.Duration

	mu   stdsync.Mutex
	conn *netlink.Conn
	// seq is the sequence number of the last message sent.
	seq uint32
	// ackBuf receives acknowledgements (readAcks).
	ackBuf []byte
	// maxBytes and maxMessages are what the connection's buffers hold: a
	// bigger batch goes to nft instead.
	maxBytes, maxMessages int
}

// NewNetlinkElements returns a writer for the inet table of that name in
// the network namespace netNSFd refers to (0: the namespace of the calling
// thread when the connection is opened). The connection opens on first
// use, and again after any failure.
func NewNetlinkElements(table string, netNSFd int) *NetlinkElements {
	return &NetlinkElements{netNS: netNSFd, table: table, timeout: 10 * time.Second}
}

// Close closes the connection.
func (w *NetlinkElements) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closeLocked()
}

func (w *NetlinkElements) closeLocked() error {
	if w.conn == nil {
		return nil
	}
	err := w.conn.Close()
	w.conn = nil
	return err
}

func (w *NetlinkElements) dial() error {
	// A fixed receive buffer of 64 KiB: the kernel sizes a dump's messages
	// after the reader's biggest buffer, up to 32 KiB, and restarts the walk
	// of a set from its first element for each message; with the default
	// (a buffer of exactly the message peeked) a dump's messages stay at
	// 4 KiB and reading 50k elements costs a third of a second.
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.netNS, MessageBufferSize: dumpBufferBytes})
	if err != nil {
		return fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	// Error replies do not carry a copy of the request (up to 64 KiB
	// each). Extended acknowledgements are left off: mdlayher/netlink
	// v1.11 cannot parse an error carrying both.
	_ = c.SetOption(netlink.CapAcknowledge, true)
	setBuffer(c, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF)
	setBuffer(c, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF)
	wb, err1 := c.WriteBuffer()
	rb, err2 := c.ReadBuffer()
	if err := errors.Join(err1, err2); err != nil {
		c.Close()
		return fmt.Errorf("reading netlink socket buffer sizes: %w", err)
	}
	// The kernel refuses a message longer than the send buffer less 32
	// bytes; every acknowledgement takes about 1 KiB of receive buffer
	// (its socket buffer's true size), all of them queued at commit.
	w.conn, w.maxBytes, w.maxMessages = c, wb-4096, rb/2048
	return nil
}

func setBuffer(c *netlink.Conn, force, plain int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, netlinkBufferBytes) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, plain, netlinkBufferBytes)
		}
	})
}

// errBatchTooBig sends a batch to nft: it would not fit the socket.
var errBatchTooBig = errors.New("element batch larger than the netlink socket buffers")

// write sends the batch and waits for the kernel's verdict.
func (w *NetlinkElements) write(ctx context.Context, b *elementBatch) error {
	batch := b.finish()
	if batch == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		if err := w.dial(); err != nil {
			return err
		}
	}
	if len(batch) > w.maxBytes || b.msgs > w.maxMessages {
		return fmt.Errorf("%w: %d messages, %d bytes", errBatchTooBig, b.msgs, len(batch))
	}
	if err := w.roundTrip(ctx, batch, b.msgs); err != nil {
		// Replies may still be queued: never read them as the next
		// batch's.
		_ = w.closeLocked()
		return err
	}
	return nil
}

// roundTrip sends an encoded batch of msgs element messages in one write
// (the kernel reads a batch from one message) and waits for their
// acknowledgements.
func (w *NetlinkElements) roundTrip(ctx context.Context, batch []byte, msgs int) error {
	deadline := time.Now().Add(w.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// The write's deadline is cleared after it: the connection's later
	// requests (dumps, through mdlayher/netlink) set only read deadlines.
	if err := w.conn.SetDeadline(deadline); err != nil {
		return err
	}
	defer func() { _ = w.conn.SetWriteDeadline(time.Time{}) }()
	// Sequence numbers: BATCH_BEGIN has first, the element messages the
	// msgs that follow.
	first := w.seq + 1
	batchMessages(batch, func(off int) {
		w.seq++
		binary.NativeEndian.PutUint32(batch[off+8:], w.seq)
	})
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("sending element batch: %w", err)
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		n, werr = unix.Write(int(fd), batch)
		return werr != unix.EAGAIN
	})
	switch {
	case err != nil:
		return fmt.Errorf("sending element batch: %w", err)
	case werr != nil:
		return fmt.Errorf("sending element batch: %w", werr)
	case n != len(batch):
		return fmt.Errorf("sending element batch: %d of %d bytes written", n, len(batch))
	}
	// One acknowledgement per element message (not for BATCH_BEGIN and
	// BATCH_END); a failed batch answers with its errors, or with a single
	// error when the commit itself fails, and is wholly aborted.
	return w.readAcks(rc, first, msgs)
}

// newBatch starts an element batch of this writer's table for about
// elements elements.
func (w *NetlinkElements) newBatch(elements int) *elementBatch {
	return newElementBatch(w.table, min(elements*elementSizeHint+256, netlinkBufferBytes))
}

// nfgenmsg is struct nfgenmsg: family, version, resource id (big endian).
func nfgenmsg(family uint8, resID uint16) []byte {
	return []byte{family, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}
}

// elementOnlyDiff returns, for each set whose elements differ, the indices
// of the elements to delete (in old's set) and add (in desired's), when
// that is all that separates the two rulesets: same table, chains, rules
// and set declarations. ok is false otherwise.
func elementOnlyDiff(old, desired *compile.Ruleset) (diffs []setDiff, ok bool) {
	if !equalStrPtr(old.Table.Comment, desired.Table.Comment) ||
		len(old.Chains) != len(desired.Chains) || len(old.Sets) != len(desired.Sets) {
		return nil, false
	}
	for n, c := range desired.Chains {
		prev, ok := old.Chains[n]
		if !ok || prev != c && (prev.External != c.External || !equalRules(prev.Rules, c.Rules)) {
			return nil, false
		}
	}
	for _, n := range desired.SortedSetNames() {
		set := desired.Sets[n]
		prev, ok := old.Sets[n]
		if !ok || !sameDeclaration(prev, set) {
			return nil, false
		}
		if prev == set || equalElements(prev.Elements, set.Elements) {
			continue
		}
		add, del := diffElements(prev, set)
		diffs = append(diffs, setDiff{name: n, prev: prev, set: set, add: add, del: del})
	}
	return diffs, true
}

type setDiff struct {
	name      string
	prev, set *compile.Set
	add, del  []int
}

func sameDeclaration(a, b *compile.Set) bool {
	switch {
	case a.Set != nil && b.Set != nil:
		x, y := a.Set, b.Set
		return x.Type == y.Type && x.TypeOf == y.TypeOf && slices.Equal(x.Flags, y.Flags) &&
			equalPtr(x.Timeout, y.Timeout) && equalPtr(x.GCInterval, y.GCInterval) && equalPtr(x.Size, y.Size) &&
			equalPtr(x.Policy, y.Policy) && equalPtr(x.AutoMerge, y.AutoMerge) && equalPtr(x.Comment, y.Comment)
	case a.Map != nil && b.Map != nil:
		x, y := a.Map, b.Map
		return x.Type == y.Type && x.TypeOf == y.TypeOf && slices.Equal(x.Flags, y.Flags) &&
			equalPtr(x.Timeout, y.Timeout) && equalPtr(x.GCInterval, y.GCInterval) && equalPtr(x.Size, y.Size) &&
			equalPtr(x.Policy, y.Policy) && equalPtr(x.Comment, y.Comment)
	}
	return false
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// encodeDiffs encodes element changes into one batch: every set's
// deletions, then every set's additions (so that an element whose data
// changed is replaced within the batch). An error means the netlink path
// cannot express them (errUnsupported) or an element is malformed.
func (w *NetlinkElements) encodeDiffs(diffs []setDiff) (b *elementBatch, added, deleted int, err error) {
	layouts := make([]elementLayout, len(diffs))
	for i, d := range diffs {
		if layouts[i], err = layoutOf(d.set); err != nil {
			return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
		}
		added += len(d.add)
		deleted += len(d.del)
	}
	b = w.newBatch(added + deleted)
	var els [2]nlElement
	for i, d := range diffs {
		for _, j := range d.del {
			if err := b.addElement(d.name, unix.NFT_MSG_DELSETELEM, &layouts[i], &d.prev.Elements[j], &els); err != nil {
				return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
			}
		}
	}
	for i, d := range diffs {
		for _, j := range d.add {
			if err := b.addElement(d.name, unix.NFT_MSG_NEWSETELEM, &layouts[i], &d.set.Elements[j], &els); err != nil {
				return nil, 0, 0, fmt.Errorf("set %s: %w", d.name, err)
			}
		}
	}
	return b, added, deleted, nil
}

// netlinkSync handles a sync that only changes elements: one netlink batch.
// handled is false when the change is more than elements, or when the
// batch cannot be written over netlink (a type it does not know, a batch
// bigger than the socket): the caller writes it with nft. A batch the
// kernel refuses changed nothing; it is counted and followed at once by a
// full sync.
func (s *Syncer) netlinkSync(ctx context.Context, desired *compile.Ruleset) (res Result, handled bool, err error) {
	diffs, ok := elementOnlyDiff(s.applied, desired)
	if !ok {
		return res, false, nil
	}
	if len(diffs) == 0 {
		return res, true, nil
	}
	batch, added, deleted, err := s.cfg.Netlink.encodeDiffs(diffs)
	if err != nil {
		s.cfg.Logger.V(2).Info("Element changes go through nft", "reason", err)
		return res, false, nil
	}
	return s.netlinkWrite(ctx, desired, batch,
		Result{Netlink: true, Operations: added + deleted, ElementsAdded: added, ElementsDeleted: deleted})
}

// netlinkWrite sends a sync's batch, whose changes res counts. handled is
// false when the batch is too big for the socket (the caller writes the
// sync with nft). A batch the kernel refuses changed nothing; it is counted
// and followed at once by a full sync.
func (s *Syncer) netlinkWrite(ctx context.Context, desired *compile.Ruleset, batch *elementBatch, res Result) (_ Result, handled bool, _ error) {
	err := s.cfg.Netlink.write(ctx, batch)
	if errors.Is(err, errBatchTooBig) {
		s.cfg.Logger.V(2).Info("Changes go through nft", "reason", err)
		return Result{}, false, nil
	}
	if err != nil {
		n := s.netlinkFallbacks.Add(1)
		s.cfg.Logger.Error(err, "Netlink batch failed, the kernel is unchanged; falling back to a full sync",
			"operations", res.Operations, "elementsAdded", res.ElementsAdded, "elementsDeleted", res.ElementsDeleted,
			"chainsWritten", res.ChainsWritten, "chainsDeleted", res.ChainsDeleted, "fallbacks", n)
		full, err := s.full(ctx, desired)
		full.NetlinkFallback = true
		return full, true, err
	}
	return res, true, nil
}

// netlinkObjects writes a sync that changes chains, rules or set
// declarations (a policy edit, a rebuild) as one netlink batch
// (nlobjects.go). handled is false when a change is outside what the batch
// can express: the caller writes the whole sync with nft.
func (s *Syncer) netlinkObjects(ctx context.Context, desired *compile.Ruleset, shared compile.Delta) (res Result, handled bool, err error) {
	w := &nlWriter{b: s.cfg.Netlink.newBatch(64), desired: desired}
	if err := writeDiff(s.applied, desired, shared, w, &res); err != nil {
		s.cfg.Logger.V(2).Info("Changes go through nft", "reason", err)
		return Result{}, false, nil
	}
	res.Netlink, res.Operations = true, w.ops
	if w.ops == 0 {
		return res, true, nil
	}
	return s.netlinkWrite(ctx, desired, w.b, res)
}

// nlWriter writes a diff into a netlink batch; ops counts its operations
// (elements, chains, rules, sets, as an nft transaction counts them).
type nlWriter struct {
	b       *elementBatch
	desired *compile.Ruleset
	ops     int
	setIDs  uint32
	layouts map[string]*elementLayout
	els     [2]nlElement
}

func (w *nlWriter) addChain(c *knftables.Chain) error {
	w.ops++
	return w.b.addChain(c)
}

func (w *nlWriter) addSet(s *compile.Set) error {
	w.ops++
	w.setIDs++
	if err := w.b.addSet(s, w.setIDs); err != nil {
		return err
	}
	for i := range s.Elements {
		if err := w.element(s, &s.Elements[i], unix.NFT_MSG_NEWSETELEM); err != nil {
			return err
		}
	}
	return nil
}

func (w *nlWriter) delElement(s *compile.Set, e *knftables.Element) error {
	return w.element(s, e, unix.NFT_MSG_DELSETELEM)
}

func (w *nlWriter) addElement(s *compile.Set, e *knftables.Element) error {
	return w.element(s, e, unix.NFT_MSG_NEWSETELEM)
}

func (w *nlWriter) element(s *compile.Set, e *knftables.Element, op uint16) error {
	name := s.Name()
	l, ok := w.layouts[name]
	if !ok {
		lo, err := layoutOf(s)
		if err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		l = &lo
		if w.layouts == nil {
			w.layouts = map[string]*elementLayout{}
		}
		w.layouts[name] = l
	}
	w.ops++
	if err := w.b.addElement(name, op, l, e, &w.els); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

func (w *nlWriter) flushChain(name string) error {
	w.ops++
	w.b.flushChain(name)
	return nil
}

func (w *nlWriter) addRule(chain string, r *knftables.Rule) error {
	w.ops++
	return w.b.addRule(chain, r, func(n string) *compile.Set { return w.desired.Sets[n] })
}

func (w *nlWriter) delChain(name string) error {
	w.ops++
	w.b.delChain(name)
	return nil
}

func (w *nlWriter) delSet(s *compile.Set) error {
	w.ops++
	w.b.delSet(s.Name())
	return nil
}

// NetlinkFallbacks is the number of netlink element batches the kernel
// refused since the Syncer was created (each followed by a full sync). Safe
// to call from any goroutine (a metrics collector).
func (s *Syncer) NetlinkFallbacks() int64 { return s.netlinkFallbacks.Load() }
