package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
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

func (o *watchOptions) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.enabled, "watch-table", true, "repair changes other processes make to table inet nftpolicy (nft flush ruleset, a firewall service's reload) as soon as the kernel reports them (its nftables notifications), rather than at the next --full-sync-period")
}

// startTableWatch starts the watcher of the table in the agent's network
// namespace: each outside change is counted and repaired at once by the
// controller, and lost notifications make a full sync.
func (o *watchOptions) startTableWatch(ctx context.Context, ctrl *controller.Controller, errs chan<- error) {
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
		OnLost: func(reason string) { ctrl.RequestFullSync(reason) },
		Logger: log,
	}
	go func() { errs <- wrapErr("table watch", tablewatch.Run(ctx, cfg)) }()
}
