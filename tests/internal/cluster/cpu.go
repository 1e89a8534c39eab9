package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100 on
// every architecture Linux builds Kubernetes nodes for).
const userHZ = 100

// CPUTime returns the user plus system CPU time the running agent process
// has used, from /proc/PID/stat (10 ms resolution), of the PID
// EnforcerPid checks.
func (a *Agent) CPUTime() (time.Duration, error) {
	pid, err := a.EnforcerPid()
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("cluster: the agent of %s: %w", a.Node, err)
	}
	return parseProcStatCPU(string(data))
}

// EnforcerPid returns the PID of the running agent after checking that it
// is the enforcer's binary itself (/proc/PID/exe), not a wrapper (ip netns
// exec, unshare and sh all exec, so the PID is the agent's): a wrapper's
// CPU time and memory would be close to zero and look like a cheap agent.
func (a *Agent) EnforcerPid() (int, error) {
	pid := a.Pid()
	if pid == 0 {
		return 0, fmt.Errorf("cluster: the agent of %s is not running", a.Node)
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	exe, err := os.Stat(filepath.Join(proc, "exe"))
	if err != nil {
		return 0, fmt.Errorf("cluster: the agent of %s: %w", a.Node, err)
	}
	bin, err := os.Stat(a.c.bin)
	if err != nil {
		return 0, fmt.Errorf("cluster: the agent binary: %w", err)
	}
	if !os.SameFile(exe, bin) {
		target, _ := os.Readlink(filepath.Join(proc, "exe"))
		return 0, fmt.Errorf("cluster: pid %d of the agent of %s runs %s, not %s", pid, a.Node, target, a.c.bin)
	}
	return pid, nil
}

// parseProcStatCPU returns utime+stime of a /proc/PID/stat line. The
// command name (field 2) is in parentheses and may hold spaces and ')', so
// the fields are counted after its last ')'.
func parseProcStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("cluster: /proc/PID/stat without a command name: %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("cluster: /proc/PID/stat has %d fields after the command name, want at least 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cluster: /proc/PID/stat utime/stime %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
