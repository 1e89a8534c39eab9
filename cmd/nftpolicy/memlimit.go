package main

import (
	"fmt"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// memoryLimitEnv carries the container's memory limit in bytes; install.yaml
// sets it with a resourceFieldRef to limits.memory.
const memoryLimitEnv = "NFTPOLICY_MEMORY_LIMIT"

// memoryLimitShare is the part of the container's limit given to the Go heap
// as its soft limit: the rest is for stacks, the runtime, and what the
// kernel counts against the cgroup besides the heap.
const memoryLimitShare = 0.9

// noLimit is above any memory limit a cgroup v1 reports as "unlimited"
// (the page-rounded maximum of int64).
const noLimit = math.MaxInt64 / 2

// memoryLimit finds the container's memory limit: $NFTPOLICY_MEMORY_LIMIT,
// else the cgroup's (v2 memory.max, v1 memory.limit_in_bytes). It returns 0
// when there is none. A malformed $NFTPOLICY_MEMORY_LIMIT is an error; an
// unreadable cgroup only means there is no limit to follow.
func memoryLimit(getenv func(string) string, readFile func(string) ([]byte, error)) (int64, string, error) {
	if v := strings.TrimSpace(getenv(memoryLimitEnv)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return 0, "", fmt.Errorf("$%s=%q: must be a positive number of bytes (a resourceFieldRef to limits.memory)", memoryLimitEnv, v)
		}
		return n, "$" + memoryLimitEnv, nil
	}
	for _, file := range cgroupLimitFiles(readFile) {
		data, err := readFile(file)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(data))
		if v == "max" {
			return 0, file, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		if n >= noLimit {
			return 0, file, nil
		}
		return n, file, nil
	}
	return 0, "", nil
}

// cgroupLimitFiles lists the files that may hold this process's memory
// limit, most specific first: its own cgroup's (from /proc/self/cgroup),
// then the cgroup root's, which is the container's own in a private cgroup
// namespace.
func cgroupLimitFiles(readFile func(string) ([]byte, error)) []string {
	var out []string
	if data, err := readFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
				continue
			}
			switch {
			case parts[0] == "0" && parts[1] == "":
				out = append(out, path.Join("/sys/fs/cgroup", parts[2], "memory.max"))
			case hasController(parts[1], "memory"):
				out = append(out, path.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes"))
			}
		}
	}
	return append(out, "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// applyMemoryLimit gives the Go runtime a soft memory limit of 90% of the
// container's, so that the heap is collected harder before the kernel kills
// the agent, unless $GOMEMLIMIT already set one.
func applyMemoryLimit(logger klog.Logger) error {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		logger.V(1).Info("Memory limit set by $GOMEMLIMIT", "gomemlimit", v)
		return nil
	}
	limit, source, err := memoryLimit(os.Getenv, os.ReadFile)
	if err != nil {
		return err
	}
	if limit == 0 {
		logger.V(1).Info("No container memory limit found; the Go heap has no soft limit", "source", source)
		return nil
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	logger.Info("Go memory limit set from the container's", "containerLimitBytes", limit, "goMemLimitBytes", soft, "source", source)
	return nil
}
