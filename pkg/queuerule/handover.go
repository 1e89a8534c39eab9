package queuerule

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// PointQueueRule makes the queue chain table/chain send packets to the
// queues of cfg, in one transaction, so that no packet finds the chain
// empty or pointing nowhere: the way one agent hands its queued traffic to
// another that listens on other queue numbers (an agent update with both
// running side by side). With the xt-compat variant the chain's single rule
// is rewritten over netlink (InstallCompatQueueRule); with the native one,
// the chain is flushed and given the native statement by one `nft -f`
// transaction, in the calling thread's network namespace.
//
// The chain must exist (the agent's table is in place); conn is used for
// xt-compat only.
func PointQueueRule(ctx context.Context, conn *nftables.Conn, table, chain string, variant compile.QueueVariant, cfg QueueRuleConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	switch variant {
	case compile.QueueXTCompat:
		return InstallCompatQueueRule(conn, table, chain, cfg)
	case compile.QueueNative:
		script := fmt.Sprintf("flush chain inet %s %s\nadd rule inet %s %s %s\n", table, chain, table, chain, NativeQueueStatement(cfg))
		cmd := exec.CommandContext(ctx, NFTBinary, "-f", "-")
		cmd.Stdin = bytes.NewBufferString(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("pointing the queue chain at %s: %w: %s", compile.QueueRange(cfg.QueueNum, cfg.queues()), err, bytes.TrimSpace(out))
		}
		return nil
	}
	return fmt.Errorf("unknown queue variant %q", variant)
}

// QueueRuleTarget returns the first queue number the queue chain
// table/chain sends packets to (xt NFQUEUE target or native queue
// expression), and false when the chain holds no queue rule (or does not
// exist: a missing table is no error here, the agent has not synced yet).
func QueueRuleTarget(conn *nftables.Conn, table, chain string) (uint16, bool, error) {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	rules, err := conn.GetRules(t, &nftables.Chain{Table: t, Name: chain})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, false, nil
		}
		return 0, false, err
	}
	for _, r := range rules {
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Queue:
				return e.Num, true, nil
			case *expr.Target:
				if info, ok := e.Info.(*xt.Unknown); ok && e.Name == "NFQUEUE" && e.Rev == 3 && len(*info) >= 2 {
					return binary.NativeEndian.Uint16((*info)[0:2]), true, nil
				}
			}
		}
	}
	return 0, false, nil
}
