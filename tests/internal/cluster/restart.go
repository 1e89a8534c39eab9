package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// RestartLoad describes connections opened continuously while a node's
// agent is killed with SIGKILL and started again.
type RestartLoad struct {
	// Node whose agent is restarted.
	Node string
	// Good and Bad connect to Server:Port (TCP), the first allowed, the
	// second denied by the policies in force.
	Good, Bad netlab.Endpoint
	Server    netip.Addr
	Port      uint16
	// Interval between connection launches from each client, Duration of
	// the load, KillAfter: when in the load the agent is killed.
	Interval, Duration, KillAfter time.Duration
	// ConnTimeout bounds one connection; below the 1 s initial SYN
	// retransmission timeout, so a connection whose SYN is dropped fails
	// rather than succeeding later on a retransmit.
	ConnTimeout time.Duration
	// QueueNum, if not 0, is the agent's first queue and Queues its
	// --queues: RunRestartLoad then records when the new agent listens on
	// all of them (RestartResult.BoundAt).
	QueueNum uint16
	// Update replaces the SIGKILL and restart by an update with maxSurge
	// (Agent.Update): the successor starts while the old agent runs, and
	// the old one gets SIGTERM once the successor listens on the alternate
	// queue range (after QueueNum's, Queues long) and the queue rule points
	// there. Queue mode only.
	Update bool
	// StopFirst (with Update) sends the old agent SIGTERM before the
	// successor starts (Agent.UpdateStoppedFirst, StopFirst ahead): what
	// the DaemonSet controller can do when the new pod's readiness probe
	// reaches the old agent on their shared host port. BoundAt stays 0.
	StopFirst time.Duration
	Queues    uint16
}

// Attempt is one connection of the load.
type Attempt struct {
	At     time.Duration // start, from the beginning of the load
	OK     bool
	Detail string
}

// RestartResult is what RunRestartLoad saw; times are from the start of
// the load.
type RestartResult struct {
	Good, Bad []Attempt // sorted by start
	KillAt    time.Duration
	// BoundAt: the new agent listens on every queue of its range.
	BoundAt time.Duration
	// ReadyAt: the new agent's /readyz answers 200 (first sync committed).
	ReadyAt time.Duration
}

// RunRestartLoad runs the load and the restart, and returns once both are
// done and the new agent is ready.
func (c *Cluster) RunRestartLoad(ctx context.Context, l RestartLoad) (*RestartResult, error) {
	agent := c.Agent(l.Node)
	if agent == nil {
		return nil, fmt.Errorf("cluster: no agent on %s", l.Node)
	}
	res := &RestartResult{}
	var (
		mu         sync.Mutex
		wg         sync.WaitGroup
		restartErr error
		restarted  = make(chan struct{})
	)
	dial := func(from netlab.Endpoint, at time.Duration, out *[]Attempt) {
		defer wg.Done()
		r := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: from, To: l.Server, Port: l.Port, Proto: netlab.TCP, Timeout: l.ConnTimeout})
		mu.Lock()
		defer mu.Unlock()
		if r.Err != nil {
			r.Reason = "harness: " + r.Err.Error()
		}
		*out = append(*out, Attempt{At: at, OK: r.Connected, Detail: r.Reason})
	}
	start := time.Now()
	go func() {
		defer close(restarted)
		time.Sleep(l.KillAfter)
		res.KillAt = time.Since(start)
		if l.Update && l.StopFirst > 0 {
			if restartErr = agent.UpdateStoppedFirst(l.StopFirst, 10*time.Second); restartErr == nil {
				restartErr = agent.WaitReady(ctx)
			}
			res.ReadyAt = time.Since(start)
			return
		}
		if l.Update {
			alt := queue.AlternateRange(l.QueueNum, max(l.Queues, 1))
			restartErr = agent.Update(func() error {
				at, err := c.waitQueueBound(ctx, l.Node, alt, max(l.Queues, 1))
				if err != nil {
					return err
				}
				res.BoundAt = at.Sub(start)
				return c.waitQueueRule(ctx, l.Node, alt)
			}, 10*time.Second)
			if restartErr == nil {
				restartErr = agent.WaitReady(ctx)
			}
			res.ReadyAt = time.Since(start)
			return
		}
		if restartErr = agent.Kill(); restartErr != nil {
			return
		}
		if restartErr = agent.Start(); restartErr != nil {
			return
		}
		if l.QueueNum != 0 {
			var at time.Time
			if at, restartErr = c.waitQueueBound(ctx, l.Node, l.QueueNum, max(l.Queues, 1)); restartErr != nil {
				return
			}
			res.BoundAt = at.Sub(start)
		}
		restartErr = agent.WaitReady(ctx)
		res.ReadyAt = time.Since(start)
	}()
	tick := time.NewTicker(l.Interval)
	for now := time.Now(); now.Sub(start) < l.Duration; now = <-tick.C {
		at := now.Sub(start)
		wg.Add(2)
		go dial(l.Good, at, &res.Good)
		go dial(l.Bad, at, &res.Bad)
	}
	tick.Stop()
	wg.Wait()
	<-restarted
	if restartErr != nil {
		return nil, fmt.Errorf("restarting the agent of %s: %w", l.Node, restartErr)
	}
	for _, a := range [][]Attempt{res.Good, res.Bad} {
		sort.Slice(a, func(i, j int) bool { return a[i].At < a[j].At })
	}
	return res, nil
}

// waitQueueBound polls the kernel's queue statistics in node's namespace
// every millisecond until each of the n queues from first has a listener
// again (the killed agent's went with its socket), and returns when it saw
// them all.
func (c *Cluster) waitQueueBound(ctx context.Context, node string, first, n uint16) (time.Time, error) {
	for {
		var bound bool
		err := c.Lab.InNode(node, func() error {
			st, err := queue.ReadKernelQueueStats()
			bound = queue.BoundQueues(st, first, n) == int(n)
			if errors.Is(err, os.ErrNotExist) {
				return nil // nfnetlink_queue not loaded yet: nobody listens
			}
			return err
		})
		if err != nil {
			return time.Time{}, err
		}
		if bound {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// waitQueueRule polls node's queue rule until it sends packets to queue
// num (the successor's first sync committed).
func (c *Cluster) waitQueueRule(ctx context.Context, node string, num uint16) error {
	for {
		var target uint16
		var ok bool
		err := c.Lab.InNode(node, func() error {
			conn, err := nftables.New()
			if err != nil {
				return err
			}
			defer conn.CloseLasting()
			target, ok, err = queuerule.QueueRuleTarget(conn, compile.TableName, compile.ChainQueue)
			return err
		})
		if err != nil {
			return err
		}
		if ok && target == num {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// AdmittedDenied counts the denied client's connections that succeeded.
func (r *RestartResult) AdmittedDenied() int {
	n := 0
	for _, a := range r.Bad {
		if a.OK {
			n++
		}
	}
	return n
}

// FailedAllowed counts the allowed client's connections that failed.
func (r *RestartResult) FailedAllowed() int {
	n := 0
	for _, a := range r.Good {
		if !a.OK {
			n++
		}
	}
	return n
}

// GapRun is a run of consecutive failed allowed connections.
type GapRun struct {
	N int
	// First and Last failed; Next is the start of the first success after
	// them (the end of the load if none).
	First, Last, Next time.Duration
	Detail            string // the first failure's reason
}

// Gap is from the start of the first failed connection to the start of the
// first one that succeeded after it.
func (g GapRun) Gap() time.Duration {
	if g.N == 0 {
		return 0
	}
	return g.Next - g.First
}

// LongestGap returns the longest run of failed allowed connections; end is
// the load's duration.
func (r *RestartResult) LongestGap(end time.Duration) GapRun {
	var run, cur GapRun
	for i, a := range r.Good {
		if a.OK {
			cur = GapRun{}
			continue
		}
		if cur.N == 0 {
			cur.First, cur.Detail = a.At, a.Detail
		}
		cur.N++
		cur.Last = a.At
		cur.Next = end
		if i+1 < len(r.Good) {
			cur.Next = r.Good[i+1].At
		}
		if cur.Gap() > run.Gap() {
			run = cur
		}
	}
	return run
}
