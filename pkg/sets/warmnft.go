package sets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	gosync "sync"
	"syscall"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"
)

// WarmNFT is a knftables.Interface whose Run hands each transaction to an
// `nft -f -` process started before it was needed, and starts the next one
// once the transaction is done. Starting nft (exec, loading its shared
// libraries, initializing libnftables) is most of what a small transaction
// costs; a process started in advance has done all that and waits, blocked
// on its standard input, for the commands. It reads the kernel's state only
// after it has parsed them, so an old spare is never stale, and each
// transaction is still one nft invocation: one kernel transaction, applied
// whole or not at all, and a process that fails takes no other transaction
// with it. Everything but Run is the wrapped Interface's.
//
// A process inherits the network namespace of the thread that starts it:
// WarmNFT notes the namespace it was created in and refuses transactions
// from a thread in another one (a goroutine locked to a thread that
// switched namespaces): knftables would have applied them there, and a
// process started there would program that namespace's firewall.
// Safe for concurrent use (transactions run one at a time).
type WarmNFT struct {
	knftables.Interface
	path   string
	logger klog.Logger
	netns  nsID

	mu    gosync.Mutex
	spare *nftProcess
	// onStart is called with each process's pid as it starts
	// (SetOnStart).
	onStart func(pid int)
}

// nftProcess is a started `nft -f -` waiting for its input.
type nftProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	done   chan struct{} // closed when the process has exited
	err    error         // cmd.Wait's result, set before done is closed
}

// NewWarmNFT wraps inner (knftables.New for the same table) and starts the
// first spare nft. Close stops the spare.
func NewWarmNFT(inner knftables.Interface, logger klog.Logger) (*WarmNFT, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("looking up nft: %w", err)
	}
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	ns, err := currentNetNS()
	if err != nil {
		return nil, err
	}
	w := &WarmNFT{Interface: inner, path: path, logger: logger, netns: ns}
	if w.spare, err = w.start(); err != nil {
		return nil, err
	}
	return w, nil
}

// nsID identifies a network namespace: the device and inode of its
// /proc file.
type nsID struct{ dev, ino uint64 }

// currentNetNS is the network namespace of the calling thread; lock the
// goroutine to its thread to rely on it.
func currentNetNS() (nsID, error) {
	fi, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return nsID{}, fmt.Errorf("reading the network namespace: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nsID{}, fmt.Errorf("reading the network namespace: no inode in %T", fi.Sys())
	}
	return nsID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// checkNetNS fails when the calling thread is in another network
// namespace than the one w was created in.
func (w *WarmNFT) checkNetNS() error {
	ns, err := currentNetNS()
	if err != nil {
		return err
	}
	if ns != w.netns {
		return errors.New("nft: called from a thread in another network namespace than the one WarmNFT was created in")
	}
	return nil
}

func (w *WarmNFT) start() (*nftProcess, error) {
	// The child is forked from this thread: it must stay the thread whose
	// namespace was checked.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := w.checkNetNS(); err != nil {
		return nil, err
	}
	p := &nftProcess{done: make(chan struct{})}
	// Not bound to a context: the process outlives the call that starts
	// it. Run kills it when its own context ends.
	p.cmd = exec.Command(w.path, "-f", "-")
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("starting nft: %w", err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting nft: %w", err)
	}
	if w.onStart != nil {
		w.onStart(p.cmd.Process.Pid)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// SetOnStart makes w call f with the pid of each nft process it starts,
// the spare already started included, before the process can commit
// anything: the table's watcher (pkg/tablewatch) recognises the agent's
// own transactions by the committing process.
func (w *WarmNFT) SetOnStart(f func(pid int)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onStart = f
	if w.spare != nil {
		f(w.spare.cmd.Process.Pid)
	}
}

// errorMarker starts the line knftables appends to a transaction's text
// when building it failed (Transaction.String); no command line starts so.
const errorMarker = "# ERROR: "

// Run is part of knftables.Interface: it writes the transaction to the
// spare process and waits for it to exit.
func (w *WarmNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("transaction not run: %w", context.Cause(ctx))
	}
	// The spare programs the namespace it was started in: a caller in
	// another one (whose transactions knftables would apply there) gets an
	// error, every time, not only when a process must be started.
	runtime.LockOSThread()
	err := w.checkNetNS()
	runtime.UnlockOSThread()
	if err != nil {
		return err
	}
	text := tx.String()
	if i := strings.Index(text, errorMarker); i == 0 || (i > 0 && text[i-1] == '\n') {
		// knftables.Run would return the transaction's error unrun; nft
		// would read the marker as a comment and apply the rest.
		return fmt.Errorf("transaction not run: %s", strings.TrimSpace(text[i+len(errorMarker):]))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.spare
	w.spare = nil
	if p != nil && p.exited() {
		// It died before it got its input (killed from outside): it ran
		// nothing. Start another.
		w.logger.V(2).Info("Spare nft process had exited; starting another", "pid", p.cmd.Process.Pid)
		p = nil
	}
	if p == nil {
		var err error
		if p, err = w.start(); err != nil {
			return err
		}
	}
	err = p.run(ctx, text)
	// The next transaction's process starts now, after this one ended, so
	// the two never compete for the CPU; a failure to start is retried by
	// the next Run.
	if next, serr := w.start(); serr != nil {
		w.logger.Error(serr, "Could not start the next nft process; the next transaction starts its own")
	} else {
		w.spare = next
	}
	return err
}

// exited reports whether the process has died: reaped already, or a
// zombie whose exit the waiting goroutine has not collected yet.
func (p *nftProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// run feeds text to the process and waits for it to exit; ctx ending
// kills it. A killed nft committed its batch whole or not at all; either
// way the error makes the caller's next sync a full one.
func (p *nftProcess) run(ctx context.Context, text string) error {
	stop := context.AfterFunc(ctx, func() { _ = p.cmd.Process.Kill() })
	defer stop()
	_, werr := io.WriteString(p.stdin, text)
	cerr := p.stdin.Close()
	<-p.done
	if p.err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("nft: %w", context.Cause(ctx))
		}
		if msg := strings.TrimSpace(p.stderr.String()); msg != "" {
			return fmt.Errorf("nft: %s (%w)", msg, p.err)
		}
		return fmt.Errorf("nft: %w", p.err)
	}
	// nft exited 0 but did not read everything: it cannot have applied
	// the whole transaction.
	if err := errors.Join(werr, cerr); err != nil {
		return fmt.Errorf("writing to nft: %w", err)
	}
	return nil
}

// Close stops the spare process: it reads an empty input, applies
// nothing and exits.
func (w *WarmNFT) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.spare != nil {
		_ = w.spare.stdin.Close()
		<-w.spare.done
		w.spare = nil
	}
}
