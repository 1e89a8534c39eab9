// Package uninstall removes what the agent installed on a node, and decides
// whether a stopping agent should: an agent whose DaemonSet is being
// deleted removes its table (otherwise every node keeps sending new pods'
// connections to a queue nobody reads), while one that is updated or
// restarted keeps it (the hitless handover to its successor).
//
// Everything the agent installs in the kernel is inside the table inet
// nftpolicy: its chains and sets, and the queue rules, including the
// xt-compat NFQUEUE rule, which pkg/queuerule writes into the table's own
// queue chains (the throwaway table of its probe never outlives the probe's
// batch). Deleting the table removes them all, in one transaction. Besides
// the kernel, the agent keeps the program snapshot in --state-dir (a tmpfs
// on the node).
package uninstall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// RemoveTable deletes the table inet nftpolicy from the kernel of conn's
// network namespace. It reports whether there was one; no table is no
// error (removal is idempotent).
func RemoveTable(conn *nftables.Conn) (bool, error) {
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("listing the inet tables: %w", err)
	}
	found := false
	for _, t := range tables {
		if t.Name == compile.TableName {
			found = true
		}
	}
	if !found {
		return false, nil
	}
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: compile.TableName})
	if err := conn.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) { // removed meanwhile
			return false, nil
		}
		return false, fmt.Errorf("deleting table inet %s: %w", compile.TableName, err)
	}
	return true, nil
}

// statePrefixes are the names of the files the agent writes in --state-dir:
// the program snapshots (evaluate.SnapshotFile) and their temporary files.
var statePrefixes = []string{"program-input-", ".snapshot-"}

// RemoveState deletes the agent's files in its state directory dir and
// returns their paths. A missing directory is no error; the directory
// itself stays (it is the DaemonSet's hostPath mount point).
func RemoveState(dir string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !hasStatePrefix(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

func hasStatePrefix(name string) bool {
	for _, p := range statePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
