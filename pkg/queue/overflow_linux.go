package queue

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The kernel tells a queue's listener nothing about the packets it could
// not queue: when the queue is full (or the socket buffer is) it drops them,
// or with fail-open accepts them, and only counts the drops in
// /proc/net/netfilter/nfnetlink_queue. The overflow watcher reads those
// counters for the Runtime's queues, adds the drops to Stats and logs them,
// once per overflowLogEvery at most, so that an operator sees in the log
// that connections are failing because the agent cannot keep up.
const (
	overflowCheckEvery = time.Second
	overflowLogEvery   = 10 * time.Second
)

type overflowWatcher struct {
	r    *Runtime
	nsfd int
	// last holds each queue's queue_dropped + user_dropped at the last look.
	last     map[uint16]uint32
	lastLog  time.Time
	unlogged uint64
}

// newOverflowWatcher prepares a watcher of the queues' namespace: NetNS, or
// the calling thread's (where Run opened the sockets).
func (r *Runtime) newOverflowWatcher() (*overflowWatcher, error) {
	var fd int
	var err error
	if r.cfg.NetNS != 0 {
		fd, err = unix.Dup(r.cfg.NetNS)
	} else {
		fd, err = threadNetNS()
	}
	if err != nil {
		return nil, err
	}
	return &overflowWatcher{r: r, nsfd: fd, last: map[uint16]uint32{}}, nil
}

func (w *overflowWatcher) run(stop <-chan struct{}) {
	// Never unlocked: the thread enters the queues' namespace and leaves
	// it by exiting with this goroutine.
	runtime.LockOSThread()
	err := unix.Setns(w.nsfd, unix.CLONE_NEWNET)
	unix.Close(w.nsfd)
	if err != nil {
		w.r.log.Info("Cannot enter the queues' network namespace; queue overflows are only in the metrics", "err", err)
		return
	}
	w.check(time.Now(), true)
	t := time.NewTicker(overflowCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			w.check(now, false)
		}
	}
}

// check reads the kernel's counters; the first look only sets the baseline
// (drops before this Runtime bound the queues are not its own).
func (w *overflowWatcher) check(now time.Time, baseline bool) {
	st, err := ReadKernelQueueStats()
	if err != nil {
		return
	}
	cfg := w.r.cfg
	var grew uint64
	for _, s := range st {
		if s.QueueNum < cfg.QueueNum || s.QueueNum >= cfg.QueueNum+cfg.Queues {
			continue
		}
		cur := s.QueueDropped + s.UserDropped
		if prev, ok := w.last[s.QueueNum]; ok && !baseline {
			grew += uint64(cur - prev) // uint32 arithmetic: wraps like the kernel's counters
		}
		w.last[s.QueueNum] = cur
	}
	if grew == 0 {
		return
	}
	w.r.c.overflowDropped.Add(grew)
	w.unlogged += grew
	if !w.lastLog.IsZero() && now.Sub(w.lastLog) < overflowLogEvery {
		return
	}
	w.r.log.Error(nil, "Queue full: the kernel dropped queued packets of new connections (fail-closed); the agent does not answer fast enough or --max-queue-len is too small",
		"firstQueue", cfg.QueueNum, "queues", cfg.Queues, "droppedSinceLastLog", w.unlogged, "maxQueueLen", cfg.MaxQueueLen)
	w.r.c.overflowLogs.Add(1)
	w.unlogged = 0
	w.lastLog = now
}
