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
// names the committing task (NFTA_GEN_PROC_PID: the thread's id, in the
// kernel's initial pid namespace, and its command name) and the netlink
// port id of the socket that sent the batch. The agent commits in-process
// (netlink batches, from any of its threads) and through nft processes it
// starts (their pids, and port ids that nft binds to its pid as its own
// pid namespace sees it). In-process commits are recognised by thread
// (/proc/self/task) and, in a pid namespace (a container without hostPID)
// where the kernel's ids are not this process's, by the threads' command
// name, AgentProcName; the nft processes by pid or port id. Another agent
// of this node (the old one during an update) counts as own too: its
// threads are named AgentProcName, its nft processes are children of one.
//
// Misjudging an own transaction as outside costs one needless repair (a
// full sync, rate-limited); misjudging an outside one as own leaves it to
// the periodic full sync. Safe for concurrent use.
type Owner struct {
	self uint32
	// proc reads /proc/<pid>/stat; a test replaces it.
	proc func(pid uint32) (name string, ppid uint32, ok bool)

	// thread reports whether a thread id is one of this process's; a
	// test replaces it.
	thread func(tid uint32) bool

	mu       sync.Mutex
	children [recentChildren]uint32
	next     int
}

// NewOwner returns the Owner of this process.
func NewOwner() *Owner {
	return &Owner{self: uint32(os.Getpid()), proc: procStat, thread: ownThread}
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
	switch {
	case t.PID == o.self || o.thread(t.PID):
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

// ownThread reports whether tid is a thread of this process.
func ownThread(tid uint32) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
	return err == nil
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
