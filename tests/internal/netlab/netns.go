package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// NetnsDir is where `ip netns` keeps its named network namespaces.
const NetnsDir = "/run/netns"

// ErrClosed is returned when the lab, or the namespace an operation targets,
// has already been torn down.
var ErrClosed = errors.New("netlab: closed")

// nsHandle is an open reference to a named network namespace. The fd is kept
// open for the lifetime of the handle so that setns is a single syscall.
type nsHandle struct {
	name string

	mu sync.RWMutex // RLock while the fd is in use, Lock to close it
	fd int          // -1 once closed
}

func (h *nsHandle) path() string { return filepath.Join(NetnsDir, h.name) }

// close waits for in-flight users of the fd and closes it.
func (h *nsHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
}

// run executes fn on a locked OS thread that has been switched into the
// namespace. See runInNetns.
func (h *nsHandle) run(fn func() error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.fd < 0 {
		return fmt.Errorf("netns %s: %w", h.name, ErrClosed)
	}
	return runInNetns(h.fd, fn)
}

// withFD calls fn with the namespace fd, keeping it open meanwhile.
func (h *nsHandle) withFD(fn func(fd int) error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.fd < 0 {
		return fmt.Errorf("netns %s: %w", h.name, ErrClosed)
	}
	return fn(h.fd)
}

// withRtnl runs fn with an rtnetlink socket bound to h's namespace.
func withRtnl(h *nsHandle, fn func(r *rtnl) error) error {
	r, err := h.rtnl()
	if err != nil {
		return err
	}
	defer r.close()
	return fn(r)
}

// socket creates a non-blocking, close-on-exec socket inside the namespace.
// The socket stays bound to that namespace whatever thread later uses it.
func (h *nsHandle) socket(domain, typ int) (int, error) {
	fd := -1
	err := h.run(func() error {
		var err error
		fd, err = unix.Socket(domain, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("socket in netns %s: %w", h.name, err)
	}
	return fd, nil
}

// writeSysctls writes /proc/sys/<path> = value pairs inside the namespace
// (net sysctls resolve against the calling thread's network namespace).
func (h *nsHandle) writeSysctls(kv ...string) error {
	return h.run(func() error {
		for i := 0; i+1 < len(kv); i += 2 {
			p := filepath.Join("/proc/sys", kv[i])
			if err := os.WriteFile(p, []byte(kv[i+1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s in %s: %w", kv[i], kv[i+1], h.name, err)
			}
		}
		return nil
	})
}

// EnterNetnsForGood locks the calling goroutine to its OS thread for good
// and moves the thread into the network namespace at path (a
// /run/netns/NAME). For a process of its own (a benchmark's client, a
// flooder) whose threads run in a lab namespace until they end: the
// thread is never unlocked, so the Go runtime discards it when the
// goroutine ends and no other goroutine runs in that namespace.
func EnterNetnsForGood(path string) error {
	runtime.LockOSThread()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = unix.Setns(fd, unix.CLONE_NEWNET)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("setns %s: %w", path, err)
	}
	return nil
}

// runInNetns runs fn on a fresh goroutine locked to its OS thread, with that
// thread switched into the network namespace referred to by fd. See onThread.
func runInNetns(fd int, fn func() error) error {
	return onThread(func() error { return unix.Setns(fd, unix.CLONE_NEWNET) }, fn)
}

// onThread runs enter and then fn on a fresh goroutine locked to its OS
// thread. Afterwards the thread's original network namespace is restored; if
// that fails the thread is left locked so the Go runtime destroys it when the
// goroutine exits, hence no other goroutine ever runs in a wrong namespace.
// Goroutines started by fn do NOT inherit the namespace, but sockets
// (including netlink sockets) created by fn stay bound to it.
func onThread(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		res := errors.New("netlab: function run in netns did not return (runtime.Goexit?)")
		defer func() { errc <- res }()

		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			res = fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := enter(); err != nil {
			// enter may have failed half-way: restore to be sure.
			if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
			res = fmt.Errorf("enter netns: %w", err)
			return
		}
		defer func() {
			if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
				// Keep the thread locked: it is discarded when we exit.
				res = errors.Join(res, fmt.Errorf("restore netns: %w", err))
				return
			}
			runtime.UnlockOSThread()
		}()
		res = fn()
	}()
	return <-errc
}

var netnsDirOnce sync.Once
var netnsDirErr error

// ensureNetnsDir prepares /run/netns like `ip netns add` does: a shared
// mount point, so namespace bind mounts propagate to other mount namespaces.
func ensureNetnsDir() error {
	netnsDirOnce.Do(func() {
		if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
			netnsDirErr = err
			return
		}
		err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == unix.EINVAL { // not a mount point yet
			if err = unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			netnsDirErr = fmt.Errorf("prepare %s: %w", NetnsDir, err)
		}
	})
	return netnsDirErr
}

// createNetns creates a new named network namespace (equivalent to
// `ip netns add name`, without spawning a process) and returns a handle.
func createNetns(name string) (*nsHandle, error) {
	if err := ensureNetnsDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(NetnsDir, name)
	f, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	unix.Close(f)
	fd := -1
	err = onThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount %s: %w", path, err)
		}
		var err error
		fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	return &nsHandle{name: name, fd: fd}, nil
}

func runCmd(stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "),
			err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// listNetns returns the names of all named network namespaces with the given
// prefix.
func listNetns(prefix string) ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// deleteNetns deletes the named namespaces like `ip netns del` (detach the
// bind mount, remove the file) and reports the ones that could not be
// removed. Missing namespaces are not an error. The kernel frees a namespace
// (and its interfaces) once no mount, fd, socket or process refers to it.
func deleteNetns(names []string) error {
	var errs []error
	for _, n := range names {
		path := filepath.Join(NetnsDir, n)
		if _, err := os.Lstat(path); err != nil {
			continue
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CleanupStale deletes every named network namespace whose name starts with
// prefix, e.g. leftovers of a crashed test run. Labs never start processes,
// so deleting the namespaces (which destroys their veths, routes and nftables
// state) is the whole cleanup. prefix must be at least 2 characters; choose it
// so that it cannot match namespaces owned by concurrently running labs.
func CleanupStale(prefix string) error {
	if len(prefix) < 2 {
		return fmt.Errorf("netlab: CleanupStale prefix %q too short", prefix)
	}
	names, err := listNetns(prefix)
	if err != nil {
		return err
	}
	return deleteNetns(names)
}
