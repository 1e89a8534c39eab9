package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/nftables"
	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/uninstall"
)

const cleanupUsage = `usage: nftpolicy cleanup [--state-dir DIR] [--cni-bin-dir DIR --cni-conf-dir DIR] [--force]

Removes what the nftpolicy agent installed on this node, for a node whose
agent is gone (an agent whose DaemonSet is deleted does it itself): the
table inet nftpolicy with its chains, sets and queue rules (the xt-compat
NFQUEUE rule included: it lives in the table), and with --state-dir the
program snapshot, and with --cni-bin-dir and --cni-conf-dir the boot
plugin (nftpolicy-boot, taken out of the CNI configuration before the
table goes, so that no new pod is held with no agent to release it). Run
it as root in the node's network namespace (a pod with hostNetwork and
NET_ADMIN: see docs/uninstall.md). Idempotent: with nothing to remove it
says so and succeeds.

It refuses while an agent listens on the queues the table's queue rules
point at (removing the table under a running agent leaves its node open
until the agent's next sync); --force removes it anyway.

Exit status: 0 removed or nothing to remove, 1 failed or refused, 2 bad usage.`

// runCleanup is `nftpolicy cleanup`.
func runCleanup(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("cleanup", pflag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "the agent's --state-dir on this node (e.g. /run/nftpolicy): its program snapshot is removed too")
	force := fs.Bool("force", false, "remove the table even while an agent listens on its queues")
	var dirs cniDirs
	dirs.addFlags(fs, "", "")
	if code, ok := parseFlags(fs, args, stderr, cleanupUsage); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nftpolicy cleanup: unexpected argument %q\n", fs.Arg(0))
		return exitBadInput
	}
	if (dirs.bin == "") != (dirs.conf == "") {
		fmt.Fprintln(stderr, "nftpolicy cleanup: --cni-bin-dir and --cni-conf-dir go together")
		return exitBadInput
	}
	if err := cleanup(stdout, *stateDir, dirs, *force); err != nil {
		fmt.Fprintf(stderr, "nftpolicy cleanup: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func cleanup(stdout io.Writer, stateDir string, dirs cniDirs, force bool) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening netlink: %w", err)
	}
	defer conn.CloseLasting()
	if !force {
		if q, ok, err := runningAgent(conn); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("an nftpolicy agent runs on this node (it listens on queue %d, where table inet %s queues): "+
				"removing the table would leave the node unprotected until its next sync; stop it first (delete its DaemonSet), or use --force", q, compile.TableName)
		}
	}
	if err := removeBootPlugin(stdout, dirs); err != nil {
		return err
	}
	had, err := uninstall.RemoveTable(conn)
	if err != nil {
		return err
	}
	if had {
		fmt.Fprintf(stdout, "removed table inet %s (its chains, sets and queue rules)\n", compile.TableName)
	} else {
		fmt.Fprintf(stdout, "no table inet %s on this node: nothing to remove\n", compile.TableName)
	}
	// Check, as the table is what makes a node drop traffic.
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("checking the removal: %w", err)
	}
	for _, t := range tables {
		if t.Name == compile.TableName {
			return fmt.Errorf("table inet %s is still there (an agent re-created it?)", compile.TableName)
		}
	}
	files, err := uninstall.RemoveState(stateDir)
	for _, f := range files {
		fmt.Fprintf(stdout, "removed %s\n", f)
	}
	if err != nil {
		return fmt.Errorf("--state-dir %s: %w", stateDir, err)
	}
	return nil
}

// runningAgent returns the queue a listener serves for the table's queue
// rules (connection or DNS queue), if any: an agent runs on the node.
func runningAgent(conn *nftables.Conn) (uint16, bool, error) {
	stats, err := queue.ReadKernelQueueStats()
	if errors.Is(err, os.ErrNotExist) { // nfnetlink_queue not loaded: nobody listens
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the kernel's queue statistics: %w", err)
	}
	for _, chain := range []string{compile.ChainQueue, compile.ChainDNS} {
		q, ok, err := queuerule.QueueRuleTarget(conn, compile.TableName, chain)
		if err != nil {
			return 0, false, fmt.Errorf("reading the queue rule of chain %s: %w", chain, err)
		}
		if ok && queue.BoundQueues(stats, q, 1) > 0 {
			return q, true, nil
		}
	}
	return 0, false, nil
}
