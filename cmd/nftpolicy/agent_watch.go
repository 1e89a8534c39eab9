package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/tablewatch"
)

// watchOptions are the flags of the table's watcher.
type watchOptions struct {
	enabled bool
	// owner recognises the agent's transactions: newSyncer registers the
	// nft processes it starts; nil when it cannot (no spare nft), and the
	// watcher does not run.
	owner *tablewatch.Owner
}

// startTableWatch starts the watcher of the table in the agent's network
// namespace: each outside change is counted and repaired at once by the
// controller, and lost notifications make a full sync (lostNotifications).
func (o *watchOptions) startTableWatch(ctx context.Context, ctrl *controller.Controller) {
	log := klog.FromContext(ctx).WithName("tablewatch")
	if !o.enabled {
		return
	}
	if o.owner == nil {
		log.Info("Not watching the table: nft transactions are not run by processes the agent knows; outside changes are repaired at --full-sync-period only")
		return
	}
	cfg := tablewatch.Config{
		Table: compile.TableName,
		Owner: o.owner,
		OnOutside: func(t tablewatch.Transaction) {
			ctrl.OutsideChange(t.Counts, fmt.Sprintf("%s, by %s (pid %d, generation %d)", t.Summary(), t.Proc, t.PID, t.Gen))
		},
		OnLost: (&lostNotifications{ctrl: ctrl, log: log}).lost,
		Logger: log,
	}
	go func() {
		// Without the watch the agent still enforces, and the periodic
		// full sync repairs: no reason to stop it.
		if err := tablewatch.Run(ctx, cfg); err != nil {
			log.Error(err, "Not watching the table; outside changes are repaired at --full-sync-period only")
		}
	}()
}

// ownOverrunWindow: notifications lost while the sync loop writes, or
// this soon after, are taken for the loop's own.
const ownOverrunWindow = 2 * time.Second

// ownOverrunResync bounds the full syncs made for notifications lost
// during the agent's own writes: a full sync of a big table notifies more
// than the socket holds, and a full sync after each such overrun would
// overrun again, endlessly.
const ownOverrunResync = time.Minute

// lostNotifications decides what lost notifications cost: a full sync at
// once, unless the agent was writing (then at most one a minute).
type lostNotifications struct {
	ctrl interface {
		WroteWithin(time.Duration) bool
		RequestFullSync(reason string)
	}
	log  klog.Logger
	last time.Time
}

func (l *lostNotifications) lost(reason string) {
	if l.ctrl.WroteWithin(ownOverrunWindow) {
		if time.Since(l.last) < ownOverrunResync {
			l.log.V(2).Info("Notifications lost while the agent wrote; full sync already made within the last minute", "reason", reason)
			return
		}
		l.last = time.Now()
	}
	l.ctrl.RequestFullSync(reason)
}
