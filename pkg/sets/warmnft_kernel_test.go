package sets_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// warmNode is a WarmNFT created and run in a private network namespace.
type warmNode struct {
	*kernelNode
	warm *sets.WarmNFT
}

func newWarmNode(t *testing.T) *warmNode {
	t.Helper()
	k := newKernelNode(t, false) // skips without root or nft
	inner, err := newNSNFT(k.r)
	if err != nil {
		t.Fatal(err)
	}
	var w *sets.WarmNFT
	if err := k.r.do(func() (err error) { w, err = sets.NewWarmNFT(inner, klog.Background()); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.r.do(func() error { w.Close(); return nil }) })
	return &warmNode{kernelNode: k, warm: w}
}

func (n *warmNode) run(ctx context.Context, tx *knftables.Transaction) error {
	return n.r.do(func() error { return n.warm.Run(ctx, tx) })
}

func (n *warmNode) rules(t *testing.T, chain string) string {
	t.Helper()
	return string(n.nft(t, "list", "chain", "inet", compile.TableName, chain))
}

func (n *warmNode) hasChain(t *testing.T, chain string) bool {
	t.Helper()
	var err error
	_ = n.r.do(func() error {
		err = exec.Command("nft", "list", "chain", "inet", compile.TableName, chain).Run()
		return nil
	})
	return err == nil
}

func TestWarmNFTRunsEachTransactionOnce(t *testing.T) {
	n := newWarmNode(t)
	ctx := context.Background()
	tx := n.warm.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "c"})
	tx.Add(&knftables.Rule{Chain: "c", Rule: "tcp dport 80 accept", Comment: knftables.PtrTo("first")})
	if err := n.run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if got := n.rules(t, "c"); !strings.Contains(got, `comment "first"`) {
		t.Fatalf("after the first transaction, chain c is\n%s", got)
	}
	// The second transaction goes to the process started after the first.
	for _, comment := range []string{"second", "third"} {
		tx = n.warm.NewTransaction()
		tx.Flush(&knftables.Chain{Name: "c"})
		tx.Add(&knftables.Rule{Chain: "c", Rule: "tcp dport 81 accept", Comment: knftables.PtrTo(comment)})
		if err := n.run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		got := n.rules(t, "c")
		if !strings.Contains(got, `comment "`+comment+`"`) || strings.Count(got, "accept") != 1 {
			t.Fatalf("after transaction %q, chain c is\n%s", comment, got)
		}
	}
}

func TestWarmNFTFailedTransactionAppliesNothing(t *testing.T) {
	n := newWarmNode(t)
	ctx := context.Background()
	tx := n.warm.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := n.run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = n.warm.NewTransaction()
	tx.Add(&knftables.Chain{Name: "new"})
	tx.Add(&knftables.Rule{Chain: "new", Rule: "ip saddr @missing accept"})
	err := n.run(ctx, tx)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("transaction naming a missing set: got error %v, want nft's message about it", err)
	}
	if n.hasChain(t, "new") {
		t.Fatal("the failed transaction's chain exists: it was applied in part")
	}
	// The process after a failure works.
	tx = n.warm.NewTransaction()
	tx.Add(&knftables.Chain{Name: "after"})
	if err := n.run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if !n.hasChain(t, "after") {
		t.Fatal("the transaction after a failed one was not applied")
	}
}

func TestWarmNFTRefusesBadTransactionsAndCancelledContexts(t *testing.T) {
	n := newWarmNode(t)
	tx := n.warm.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "ok"})
	tx.Add(&knftables.Rule{Rule: "accept"}) // no chain: knftables records an error
	if err := n.run(context.Background(), tx); err == nil {
		t.Fatal("a transaction knftables could not build was run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tx = n.warm.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "ok"})
	if err := n.run(ctx, tx); err == nil {
		t.Fatal("a transaction with a cancelled context was run")
	}
	if n.hasChain(t, "ok") {
		t.Fatal("a refused transaction was applied")
	}
}

func TestWarmNFTReplacesAKilledSpare(t *testing.T) {
	n := newWarmNode(t)
	// Every nft -f - of this test process's children is the spare.
	kills, killed := 0, 0
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(self) || !strings.Contains(string(stat), "(nft)") {
			continue
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		p, err := os.FindProcess(pid)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		kills, killed = kills+1, pid
	}
	if kills != 1 {
		t.Fatalf("found %d spare nft processes, want 1", kills)
	}
	// SIGKILL takes effect when the process next runs: wait for it to die.
	deadline := time.Now().Add(10 * time.Second)
	for !deadOrZombie(killed) {
		if time.Now().After(deadline) {
			t.Fatalf("nft %d did not die within 10s of SIGKILL", killed)
		}
		time.Sleep(time.Millisecond)
	}
	tx := n.warm.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "c"})
	if err := n.run(context.Background(), tx); err != nil {
		t.Fatalf("after the spare was killed: %v", err)
	}
	if !n.hasChain(t, "c") {
		t.Fatal("the transaction after the spare was killed was not applied")
	}
}

func TestWarmNFTRefusesAnotherNamespace(t *testing.T) {
	n := newWarmNode(t)
	// The test goroutine is not in the node's namespace. nft could not
	// parse the transaction, so a refusal that did not happen would change
	// nothing either.
	tx := n.warm.NewTransaction()
	tx.Add(&knftables.Rule{Chain: "c", Rule: "not-an-nft-statement"})
	err := n.warm.Run(context.Background(), tx)
	if err == nil || !strings.Contains(err.Error(), "network namespace") {
		t.Fatalf("Run from another namespace: got error %v, want a refusal", err)
	}
}

func deadOrZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// TestWarmNFTReportsEachProcess: SetOnStart reports the spare already
// started and each process started after it, before it runs anything
// (the table's watcher recognises the agent's transactions by them).
func TestWarmNFTReportsEachProcess(t *testing.T) {
	n := newWarmNode(t)
	var mu sync.Mutex
	var pids []int
	n.warm.SetOnStart(func(pid int) {
		mu.Lock()
		defer mu.Unlock()
		pids = append(pids, pid)
	})
	for range 2 {
		tx := n.warm.NewTransaction()
		tx.Add(&knftables.Table{})
		if err := n.run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The first spare, the one started after each of the two transactions.
	if len(pids) != 3 || pids[0] == pids[1] || pids[1] == pids[2] || pids[0] <= 0 {
		t.Fatalf("processes reported: %v, want 3 different pids", pids)
	}
}
