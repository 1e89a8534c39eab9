package queue

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The reader: one netlink socket per queue, read by one goroutine locked
// to its OS thread with blocking recvfrom(2) into a fixed buffer. Blocking
// reads on a locked thread let the kernel wake exactly that thread when a
// packet is queued; a socket in Go's netpoller instead wakes the poller,
// which then schedules the reading goroutine onto some thread (one or two
// futex wake-ups more per packet). The buffer is sized for the copy range,
// so no MSG_PEEK is needed to size it. Verdicts of the packets read in one
// go are written with one sendmsg(2).
//
// Only the blocking read goes through the Go scheduler (syscall.Syscall:
// the runtime may hand the reader's P to other goroutines while it waits).
// The calls that cannot block, the MSG_DONTWAIT reads and the verdict
// writes, are raw system calls: each scheduler-visible system call may
// wake the runtime's sysmon thread, whose polling a busy queue then pays
// for; the raw calls do not (docs/performance.md, "The queue path's
// latency"). A verdict write re-injects the packet, during which the
// reader keeps its P, as it would running Go code.

// readTimeout bounds a blocking read so that the reader notices shutdown:
// closing a netlink socket does not wake a thread blocked reading it.
const readTimeout = 200 * time.Millisecond

// maxBatch bounds how many packets one read round takes before answering.
const maxBatch = 64

// qsock is one bound queue socket.
type qsock struct {
	queue uint16
	fd    int

	// mu guards fd against verdicts of deferred decisions (Later) arriving
	// after the socket is closed, when the number may name another file.
	mu     sync.RWMutex
	closed bool

	// pending counts the packets whose decision was deferred and not yet
	// answered. While it is not 0 the reader never sends a batch verdict,
	// which would also answer those packets.
	pending atomic.Int64
}

// openQueueSocket opens a netlink socket in the calling thread's network
// namespace (or in netns, if not 0), binds queue num and configures it.
func openQueueSocket(netns int, num uint16, copyRange, maxLen, flags uint32, readBuffer int, writeTimeout time.Duration) (*qsock, error) {
	fd, err := socketIn(netns)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	q := &qsock{queue: num, fd: fd}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("binding netlink socket: %w", err)
	}
	// Overruns are the kernel's business (drop, or accept with fail-open,
	// counted in its statistics): do not surface them as ENOBUFS reads.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_NO_ENOBUFS, 1)
	if readBuffer > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, readBuffer); err != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, readBuffer)
		}
	}
	tv := unix.NsecToTimeval(readTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("SO_RCVTIMEO: %w", err)
	}
	if writeTimeout > 0 {
		wtv := unix.NsecToTimeval(writeTimeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &wtv); err != nil {
			return nil, fmt.Errorf("SO_SNDTIMEO: %w", err)
		}
	}
	if err := q.request(configMsg(num, copyRange, maxLen, flags)); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("binding queue %d: %w (another process, e.g. another agent, listens on it)", num, err)
		}
		return nil, fmt.Errorf("binding queue %d (copy range %d, max length %d, flags %#x): %w", num, copyRange, maxLen, flags, err)
	}
	ok = true
	return q, nil
}

// socketIn creates the netlink socket, in netns when it is not 0: on a
// thread of its own that is never returned to the Go scheduler (it exits
// with the goroutine), so no other goroutine runs in that namespace.
func socketIn(netns int) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	}
	if netns == 0 {
		return open()
	}
	type res struct {
		fd  int
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves the namespace by exiting
		if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
			c <- res{-1, fmt.Errorf("setns: %w", err)}
			return
		}
		fd, err := open()
		c <- res{fd, err}
	}()
	r := <-c
	return r.fd, r.err
}

// request sends a configuration message and waits for its acknowledgement.
// Packets cannot arrive yet: the queue is not configured until it returns.
func (q *qsock) request(msg []byte) error {
	if _, err := unix.Write(q.fd, msg); err != nil {
		return err
	}
	_, wantSeq, _, _, _ := nextNetlinkMsg(msg)
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(q.fd, buf)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		b := buf[:n]
		for len(b) > 0 {
			typ, _, body, rest, err := nextNetlinkMsg(b)
			if err != nil {
				return err
			}
			b = rest
			if typ != nlmsgError {
				continue
			}
			errno, seq, ok := netlinkErrno(body)
			if !ok || seq != wantSeq {
				continue
			}
			if errno != 0 {
				return unix.Errno(errno)
			}
			return nil
		}
	}
}

// write sends b (one or more verdict messages). It is used by the reader
// thread and by deferred verdicts of other goroutines; netlink sockets
// accept concurrent sendmsg calls.
func (q *qsock) write(b []byte) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return errQueueClosed
	}
	if len(b) == 0 {
		return nil
	}
	for {
		// Raw: a netlink write to the kernel does not block (see the
		// file's comment).
		_, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(q.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

var errQueueClosed = errors.New("nfqueue socket closed")

// close closes the socket. The kernel unbinds the queue and drops the
// packets still waiting for a verdict.
func (q *qsock) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		unix.Close(q.fd)
	}
}

// recv reads one datagram without allocating: blocking, or with dontWait
// returning (0, EAGAIN) when none is waiting, as a raw system call (see
// the file's comment).
func (q *qsock) recv(buf []byte, dontWait bool) (int, error) {
	syscall6, flags := unix.Syscall6, 0
	if dontWait {
		syscall6, flags = unix.RawSyscall6, unix.MSG_DONTWAIT
	}
	n, _, e := syscall6(unix.SYS_RECVFROM, uintptr(q.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// pendingVerdict is a verdict decided in the current read round, sent at
// its end.
type pendingVerdict struct {
	id, verdict uint32
	setMark     bool
	mark        uint32
}

// reader is the per-queue loop.
type reader struct {
	r   *Runtime
	q   *qsock
	buf []byte
	out []byte
	vs  []pendingVerdict
	// noBatch turns batch verdicts off for good once a packet of this
	// queue may have stayed queued unanswered (a failed write, a message
	// without a usable id): a batch verdict would answer it too.
	noBatch bool
}

func newReader(r *Runtime, q *qsock) *reader {
	return &reader{
		r: r, q: q,
		// The copy range bounds the payload; 4 KiB covers the headers and
		// the other attributes (interfaces, timestamps, conntrack info).
		buf: make([]byte, int(r.cfg.CopyRange)+4096),
		out: make([]byte, maxBatch*verdictMsgSz),
		vs:  make([]pendingVerdict, 0, maxBatch),
	}
}

// run reads and answers packets until stop is closed or the socket fails.
func (rd *reader) run(stop <-chan struct{}) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if h := rd.r.cfg.Hold; h != nil {
		select {
		case <-h:
		case <-stop:
			return nil
		}
	}
	for {
		n, err := rd.q.recv(rd.buf, false)
		if err != nil {
			select {
			case <-stop:
				return nil
			default:
			}
			if err == unix.EAGAIN || err == unix.EINTR {
				continue // the read timeout: look at stop again
			}
			if err == unix.ENOBUFS {
				rd.r.c.receiveErrors.Add(1)
				continue
			}
			rd.r.c.receiveErrors.Add(1)
			return fmt.Errorf("reading nfqueue %d: %w", rd.q.queue, err)
		}
		rd.handleDatagram(rd.buf[:n])
		// Take what else is waiting, up to maxBatch, before answering: one
		// write then carries all their verdicts.
		for len(rd.vs) < maxBatch {
			n, err := rd.q.recv(rd.buf, true)
			if err != nil {
				break
			}
			rd.handleDatagram(rd.buf[:n])
		}
		rd.flush()
	}
}

func (rd *reader) handleDatagram(b []byte) {
	for len(b) > 0 {
		typ, _, body, rest, err := nextNetlinkMsg(b)
		if err != nil {
			rd.r.c.malformed.Add(1)
			rd.noBatch = true
			return
		}
		b = rest
		switch {
		case typ == nlmsgError:
			// Verdicts ask for no acknowledgement; the kernel answers only
			// those it refused (e.g. ENOENT: the id is not queued any more).
			if errno, _, ok := netlinkErrno(body); ok && errno != 0 {
				rd.r.c.verdictErrors.Add(1)
				rd.r.log.V(2).Info("Kernel refused an nfqueue verdict", "queue", rd.q.queue, "err", unix.Errno(errno))
			}
		case typ == nlmsgDone:
		case typ == nfnlSubsysQueue<<8|nfqnlMsgPacket:
			var m queueMsg
			if err := parseQueueMsg(body, &m); err != nil {
				rd.r.c.received.Add(1)
				rd.r.c.malformed.Add(1)
				rd.noBatch = true
				continue
			}
			rd.r.handlePacket(rd, &m)
		}
	}
}

// verdict records the verdict of packet id for the end of the round.
func (rd *reader) verdict(id, verdict uint32, setMark bool, mark uint32) {
	rd.vs = append(rd.vs, pendingVerdict{id: id, verdict: verdict, setMark: setMark, mark: mark})
}

// flush sends the round's verdicts: one NFQNL_MSG_VERDICT_BATCH when they
// are all the same and no deferred decision is outstanding (a batch
// verdict answers every queued packet with an id up to its own, which
// then are exactly the round's packets: ids are given in order, and the
// earlier rounds were all answered), else one message each, all in one
// write.
func (rd *reader) flush() {
	vs := rd.vs
	if len(vs) == 0 {
		return
	}
	rd.vs = vs[:0]
	// A datagram may carry several packets: write at most maxBatch
	// verdicts (the size of out) at a time.
	for len(vs) > maxBatch {
		rd.send(vs[:maxBatch])
		vs = vs[maxBatch:]
	}
	rd.send(vs)
}

// send writes the verdicts of vs (at most maxBatch).
func (rd *reader) send(vs []pendingVerdict) {
	same := len(vs) > 1 && !rd.noBatch && rd.q.pending.Load() == 0
	for i := 1; same && i < len(vs); i++ {
		same = vs[i].verdict == vs[0].verdict && vs[i].setMark == vs[0].setMark && vs[i].mark == vs[0].mark
	}
	var n int
	if same {
		last := vs[0].id
		for _, v := range vs[1:] {
			if int32(v.id-last) > 0 {
				last = v.id
			}
		}
		n = appendVerdict(rd.out, rd.q.queue, true, last, vs[0].verdict, vs[0].setMark, vs[0].mark)
		rd.r.c.batchVerdicts.Add(1)
	} else {
		for _, v := range vs {
			n += appendVerdict(rd.out[n:], rd.q.queue, false, v.id, v.verdict, v.setMark, v.mark)
		}
	}
	if err := rd.q.write(rd.out[:n]); err != nil {
		rd.noBatch = true
		rd.r.c.verdictErrors.Add(uint64(len(vs)))
		rd.r.log.Error(err, "Cannot send nfqueue verdicts", "queue", rd.q.queue, "packets", len(vs))
	}
}

// sendOne sends a single verdict from any goroutine (a deferred decision).
func (q *qsock) sendOne(id, verdict uint32, setMark bool, mark uint32) error {
	var b [verdictMsgSz]byte
	n := appendVerdict(b[:], q.queue, false, id, verdict, setMark, mark)
	return q.write(b[:n])
}

// threadNetNS opens the network namespace of the calling thread, for the
// statistics watcher.
func threadNetNS() (int, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return -1, err
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	return fd, err
}
