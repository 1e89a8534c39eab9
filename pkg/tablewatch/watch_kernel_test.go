package tablewatch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/internal/scratchns"
)

// scratchNetns creates the test's network namespace (scratchns.New).
func scratchNetns(t *testing.T) (string, *os.File) {
	t.Helper()
	return scratchns.New(t, "watch")
}

func nftCmd(ns string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
}

// TestWatchKernel reads the kernel's real notifications: the process's own
// netlink transactions (from another thread than the main one) and those
// of an nft it started and registered are not reported, nor another
// table's change; `nft flush ruleset` by an unregistered nft is, with the
// table's deletion and its committer.
func TestWatchKernel(t *testing.T) {
	ns, f := scratchNetns(t)
	owner := NewOwner()
	outside := make(chan Transaction, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	subscribed := make(chan struct{}, 1)
	go func() {
		done <- Run(ctx, Config{Table: "nftpolicy", NetNS: int(f.Fd()), Owner: owner, Subscribed: func() { subscribed <- struct{}{} },
			OnOutside: func(tx Transaction) { outside <- tx },
			OnLost:    func(reason string) { t.Errorf("lost notifications: %s", reason) }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("not subscribed")
	}

	// Own, in process: the table and a chain over netlink.
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "nftpolicy"})
	conn.AddChain(&nftables.Chain{Table: table, Name: "input"})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	// Own, an nft the agent started.
	cmd := nftCmd(ns, "add", "chain", "inet", "nftpolicy", "forward")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	owner.AddChild(cmd.Process.Pid)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// Another table, by anyone.
	if out, err := nftCmd(ns, "add", "table", "inet", "other").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// Outside: the whole ruleset flushed.
	if out, err := nftCmd(ns, "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	select {
	case tx := <-outside:
		if tx.Counts["table"] != 1 || tx.Counts["chain"] != 2 || tx.Proc != "nft" || tx.PID == 0 || !strings.Contains(tx.Summary(), "delete table") {
			t.Errorf("the flush was reported as %+v (%s)", tx, tx.Summary())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nft flush ruleset was not reported")
	}
	select {
	case tx := <-outside:
		t.Errorf("another report: %+v (%s)", tx, tx.Summary())
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWatchKernelOverrun: a transaction whose notifications overrun the
// socket (20,000 elements, a 64 KiB buffer) is reported as lost
// notifications, and the watch goes on: the next outside change is
// reported.
func TestWatchKernelOverrun(t *testing.T) {
	ns, f := scratchNetns(t)
	lost := make(chan string, 16)
	outside := make(chan Transaction, 64)
	subscribed := make(chan struct{}, 1)
	// The watcher reads nothing until the big transaction is in: Subscribed
	// runs before its first read. Without the wait, a reader that keeps up
	// with the kernel's burst sees no overrun.
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Table: "nftpolicy", NetNS: int(f.Fd()), Owner: NewOwner(), ReceiveBuffer: 64 << 10,
			Subscribed: func() { subscribed <- struct{}{}; <-release },
			OnOutside:  func(tx Transaction) { outside <- tx },
			OnLost:     func(reason string) { lost <- reason }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	<-subscribed
	var b strings.Builder
	b.WriteString("add table inet nftpolicy\nadd set inet nftpolicy s { type ipv4_addr; }\n")
	for i := range 20000 {
		fmt.Fprintf(&b, "add element inet nftpolicy s { 10.%d.%d.%d }\n", i>>16, (i>>8)&255, i&255)
	}
	cmd := nftCmd(ns, "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	out, err := cmd.CombinedOutput()
	close(release)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	select {
	case reason := <-lost:
		if !strings.Contains(reason, "ENOBUFS") {
			t.Errorf("lost: %q", reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the overrun was not reported")
	}
	// Drain what was read of the big transaction, then one more change.
	time.Sleep(200 * time.Millisecond)
	for len(outside) > 0 {
		<-outside
	}
	if out, err := nftCmd(ns, "delete", "set", "inet", "nftpolicy", "s").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case tx := <-outside:
			// The first transaction read after an overrun may also hold
			// what the socket kept of the lost one (whose end was lost):
			// it ends with the deletion's, the only one after the drain.
			if tx.Counts["set"] >= 1 {
				return
			}
		case <-deadline:
			t.Fatal("the change after the overrun was not reported")
		}
	}
}
