package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// Flow is one client -> server:port TCP connection a ConnLoop opens again
// and again, and whether the policies in force allow it.
type Flow struct {
	Name    string
	From    netlab.Endpoint
	To      netip.Addr
	Port    uint16
	Allowed bool
}

// ConnLoop opens a new connection of each flow every interval until Stop,
// while a fault happens to the control plane or the agent: the kernel must
// keep enforcing the last program throughout.
type ConnLoop struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu      sync.Mutex
	tries   map[string]int
	wrong   map[string][]string // per flow: what went against its verdict
	harness []error
}

// StartConnLoop starts the loop; timeout bounds one connection (keep it
// below the 1 s initial SYN retransmission timeout, so that a connection
// whose SYN is dropped fails rather than succeeding on a retransmit).
func (c *Cluster) StartConnLoop(ctx context.Context, flows []Flow, interval, timeout time.Duration) *ConnLoop {
	ctx, cancel := context.WithCancel(ctx)
	l := &ConnLoop{cancel: cancel, tries: map[string]int{}, wrong: map[string][]string{}}
	start := time.Now()
	for _, f := range flows {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			t := time.NewTicker(interval)
			defer t.Stop()
			var probes sync.WaitGroup
			defer probes.Wait()
			for {
				probes.Add(1)
				go func() {
					defer probes.Done()
					l.probe(ctx, c.Lab, f, timeout, start)
				}()
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	return l
}

func (l *ConnLoop) probe(ctx context.Context, lab *netlab.Lab, f Flow, timeout time.Duration, start time.Time) {
	r := lab.ProbeOne(ctx, netlab.ProbeReq{From: f.From, To: f.To, Port: f.Port, Proto: netlab.TCP, Timeout: timeout})
	if ctx.Err() != nil {
		return // cut short by Stop: no outcome
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Err != nil {
		l.harness = append(l.harness, fmt.Errorf("%s: %w", f.Name, r.Err))
		return
	}
	l.tries[f.Name]++
	if r.Connected != f.Allowed {
		l.wrong[f.Name] = append(l.wrong[f.Name], fmt.Sprintf("at %v: connected %v (%s)",
			r.Sent.Sub(start).Round(time.Millisecond), r.Connected, r.Reason))
	}
}

// LoopResult is what a ConnLoop saw, per flow name.
type LoopResult struct {
	Tries map[string]int
	// Wrong lists, per flow, the connections whose outcome was not the
	// flow's verdict: a denied one that connected, an allowed one that
	// failed.
	Wrong map[string][]string
	// Harness errors (a probe that could not run), not verdicts.
	Harness []error
}

// Stop ends the loop, waits for the connections under way, and returns
// what it saw.
func (l *ConnLoop) Stop() LoopResult {
	l.cancel()
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return LoopResult{Tries: l.tries, Wrong: l.wrong, Harness: l.harness}
}

// WaitVerdict opens a connection of f every interval until one has f's
// verdict (connected if f.Allowed, refused or dropped if not), and returns
// the time that connection was sent.
func (c *Cluster) WaitVerdict(ctx context.Context, f Flow, interval, timeout time.Duration) (time.Time, error) {
	for {
		r := c.Lab.ProbeOne(ctx, netlab.ProbeReq{From: f.From, To: f.To, Port: f.Port, Proto: netlab.TCP, Timeout: timeout})
		if r.Err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", f.Name, r.Err)
		}
		if r.Connected == f.Allowed {
			return r.Sent, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s: no connection with the verdict allowed=%v: %w", f.Name, f.Allowed, ctx.Err())
		case <-time.After(interval):
		}
	}
}
