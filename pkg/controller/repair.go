package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Repairs of outside changes (RequestRepair) are full syncs: the table's
// chains rewritten, its sets' elements read back and corrected, what the
// agent did not make deleted. Requests that come while one is pending or
// running are one repair; repairs start at most RepairRate a second after
// a burst of RepairBurst, so that a loop of `nft flush ruleset` costs the
// agent a bounded share of the CPU. A single outside change is repaired
// at once: the limit only delays a repair in the middle of a flood, by at
// most 1/RepairRate.
const (
	RepairRate  = 10
	RepairBurst = 10
	// OutsideChangedReason is the reason of the node's Warning Event.
	OutsideChangedReason = "OutsideChange"
	// maxRepairNotes bounds what one repair's log line and Event list.
	maxRepairNotes = 8
)

// repairState is the loop's side of repair requests.
type repairState struct {
	wake    chan struct{}
	limiter *rate.Limiter
	// timer is armed when the limiter deferred a pending repair; the
	// token it waits for is reserved already (reserved).
	timer    <-chan time.Time
	reserved bool

	mu sync.Mutex
	// notes are the pending requests' descriptions (at most
	// maxRepairNotes; more counts the rest); kinds counts outside
	// changes by kind.
	notes []string
	more  int
	kinds map[string]int
	// requested counts requests; taken is requested as the last repair
	// started. outside is set from a request until a repair that started
	// after it committed: readiness is false meanwhile.
	requested, taken uint64
	outside          atomic.Bool
	started          time.Time
	// writing is set while the loop syncs; wrote is when it last ended
	// (unix nanoseconds).
	writing atomic.Bool
	wrote   atomic.Int64
}

func newRepairState() repairState {
	return repairState{wake: make(chan struct{}, 1), limiter: rate.NewLimiter(RepairRate, RepairBurst), kinds: map[string]int{}}
}

// OutsideChange reports a change of the table that the agent did not make:
// counted by kind (table, chain, rule, set, element...), and a repair
// requested at once. what describes it for the log and the node's Event.
// Safe to call from any goroutine.
func (c *Controller) OutsideChange(kinds map[string]int, what string) {
	for k, n := range kinds {
		c.cfg.Metrics.OutsideChanges.WithLabelValues(k).Add(float64(n))
	}
	c.requestRepair(kinds, what)
}

// RequestFullSync asks the sync loop for a full sync at once (with the
// same coalescing and rate as repairs of outside changes), for reason:
// notifications of the table were lost, so what they said is unknown.
// Readiness is false until it committed. Safe to call from any goroutine.
func (c *Controller) RequestFullSync(reason string) { c.requestRepair(nil, reason) }

func (c *Controller) requestRepair(kinds map[string]int, what string) {
	r := &c.repair
	r.mu.Lock()
	r.requested++
	if len(r.notes) < maxRepairNotes {
		r.notes = append(r.notes, what)
	} else {
		r.more++
	}
	for k, n := range kinds {
		r.kinds[k] += n
	}
	r.outside.Store(true)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// beginRepair runs in the sync loop when a repair may be due: false when
// none is pending, or the limiter defers it (its timer then wakes the loop
// again). Otherwise it forces the next sync to be a full one and says why.
func (c *Controller) beginRepair() bool {
	r := &c.repair
	if r.timer != nil {
		return false
	}
	r.mu.Lock()
	pending := r.requested != r.taken
	r.mu.Unlock()
	if !pending {
		return false
	}
	if !r.reserved {
		if d := r.limiter.Reserve().Delay(); d > 0 {
			r.timer, r.reserved = time.After(d), true
			return false
		}
	}
	r.reserved = false
	r.mu.Lock()
	r.taken = r.requested
	notes, more, kinds := r.notes, r.more, r.kinds
	r.notes, r.more, r.kinds = nil, 0, map[string]int{}
	r.started = time.Now()
	r.mu.Unlock()
	what := strings.Join(notes, "; ")
	if more > 0 {
		what += fmt.Sprintf("; and %d more", more)
	}
	log := c.cfg.Logger.WithName("repair")
	if len(kinds) > 0 {
		log.Info("The table was changed by another process; repairing it with a full sync", "changes", what, "kinds", kinds)
		c.nodeEvent(corev1.EventTypeWarning, OutsideChangedReason, "Table inet nftpolicy changed by another process (%s); repaired by a full sync", what)
	} else {
		log.Info("Full sync requested", "reason", what)
	}
	c.apply.ForceFull()
	return true
}

// repairTimerFired clears the limiter's timer: the deferred repair may
// start.
func (c *Controller) repairTimerFired() { c.repair.timer = nil }

// repairSynced runs in the sync loop after each successful sync: a repair that
// started before it is done, readiness true again unless another request
// came meanwhile.
func (c *Controller) repairSynced() {
	r := &c.repair
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.outside.Load() || r.requested != r.taken || r.started.IsZero() {
		return
	}
	r.outside.Store(false)
	c.cfg.Logger.WithName("repair").Info("Table repaired", "after", time.Since(r.started))
	r.started = time.Time{}
}

// syncWriting is syncOnce, noting when the loop writes (WroteWithin).
func (c *Controller) syncWriting(ctx context.Context) error {
	c.repair.writing.Store(true)
	defer func() {
		c.repair.wrote.Store(time.Now().UnixNano())
		c.repair.writing.Store(false)
	}()
	return c.syncOnce(ctx)
}

// WroteWithin reports whether the sync loop is writing to the table or
// wrote within d: notifications lost then were most likely the loop's own
// (a full sync of a big table notifies every element and rule at once,
// more than a socket buffer holds).
func (c *Controller) WroteWithin(d time.Duration) bool {
	return c.repair.writing.Load() || time.Since(time.Unix(0, c.repair.wrote.Load())) < d
}

// nodeEvent records an Event on the node's Node object, if a recorder is
// set.
func (c *Controller) nodeEvent(eventType, reason, format string, args ...any) {
	if c.cfg.Recorder == nil {
		return
	}
	// The kubelet's Events name the node by name and use it as its UID.
	ref := &corev1.ObjectReference{Kind: "Node", Name: c.cfg.NodeName, UID: types.UID(c.cfg.NodeName)}
	c.cfg.Recorder.Eventf(ref, eventType, reason, format, args...)
}
