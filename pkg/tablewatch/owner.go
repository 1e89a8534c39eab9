package tablewatch

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// AgentProcName is the command name of the agent's process, as the kernel
// reports it (comm, at most 15 bytes).
const AgentProcName = "nftpolicy"

// recentChildren is how many child processes (nft) Owner remembers: a
// transaction's notifications are read after the process that committed
// it may have exited, and pids are not reused that quickly.
const recentChildren = 32

// Owner decides whether a transaction is this agent's own. The kernel
// names the committing process (NFTA_GEN_PROC_PID, in its initial pid
// namespace) and the netlink port id of the socket that sent the batch;
// the agent commits in-process (netlink batches: its pid) and through
// nft processes it starts (their pids, and port ids that equal their pids
// as this process sees them, where the port id was free). In a pid
// namespace (a container without hostPID) the kernel's pid differs from
// os.Getpid: the watcher's probe transaction teaches the kernel's pid of
// this process (Learn). Another agent of this node (the old one during an
// update) counts as own too: its process is named AgentProcName, or is an
// nft whose parent is.
//
// Misjudging an own transaction as outside costs one needless repair (a
// full sync, rate-limited); misjudging an outside one as own leaves it to
// the periodic full sync. Safe for concurrent use.
type Owner struct {
	self uint32
	// proc reads /proc/<pid>/stat; a test replaces it.
	proc func(pid uint32) (name string, ppid uint32, ok bool)

	mu       sync.Mutex
	learned  uint32
	children [recentChildren]uint32
	next     int
}

// NewOwner returns the Owner of this process.
func NewOwner() *Owner {
	return &Owner{self: uint32(os.Getpid()), proc: procStat}
}

// AddChild records a child process that may commit transactions (an nft
// the agent started).
func (o *Owner) AddChild(pid int) {
	if o == nil || pid <= 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.children[o.next] = uint32(pid)
	o.next = (o.next + 1) % recentChildren
}

// Learn records the pid the kernel reports for this process.
func (o *Owner) Learn(pid uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.learned = pid
}

func (o *Owner) child(pid uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.children {
		if c != 0 && c == pid {
			return true
		}
	}
	return false
}

// Own reports whether t was committed by this agent or another agent of
// the node.
func (o *Owner) Own(t *Transaction) bool {
	o.mu.Lock()
	learned := o.learned
	o.mu.Unlock()
	switch {
	case t.Probe:
		return true
	case t.PID == o.self || (learned != 0 && t.PID == learned):
		return true
	case o.child(t.PID) || o.child(t.PortID):
		return true
	case t.Proc == AgentProcName:
		// The command name alone: any process can take it, but one with
		// CAP_NET_ADMIN can change the table anyway; this is about
		// accidents, not attacks (docs/security.md).
		return true
	}
	// An nft started by another agent of this node (its update's
	// successor or predecessor), read while it still exists.
	if name, ppid, ok := o.proc(t.PID); ok && name == "nft" {
		if pname, _, ok := o.proc(ppid); ok && pname == AgentProcName {
			return true
		}
	}
	return false
}

// procStat reads a process's command name and parent pid.
func procStat(pid uint32) (string, uint32, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || end+2 > len(b) {
		return "", 0, false
	}
	fields := bytes.Fields(b[end+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.ParseUint(string(fields[1]), 10, 32)
	if err != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), uint32(ppid), true
}
