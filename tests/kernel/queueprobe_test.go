package kernel

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// TestQueueProbeKeepsQueuedPackets: the agent probes the kernel's queue
// support in its own network namespace at every start, while the queues of
// the agent it replaces (an update) or its own just bound queues (a
// restart) hold packets. Unregistering any netfilter hook drops every
// packet waiting in every queue of the namespace, so the probes must not
// register one: a packet held in a bound but unread queue is still there
// after both probes. The last step shows that the check can fail: "nft -c"
// of a base chain, what the native probe used to check, drops it.
func TestQueueProbeKeepsQueuedPackets(t *testing.T) {
	requireRoot(t)
	const node, queueNum, port = "node-1", 300, 9
	lab, err := netlab.New(netlab.Config{Prefix: netlab.RandomPrefix("qpr"), Nodes: []netlab.NodeSpec{{Name: node}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("closing the lab: %v", err)
		}
	})
	var nodeIP netip.Addr
	if ips, err := lab.IPs(netlab.Node(node)); err != nil || len(ips) == 0 || !ips[0].Is4() {
		t.Fatalf("the node's addresses: %v %v", ips, err)
	} else {
		nodeIP = ips[0]
	}

	// Local UDP packets to port 9 are queued by an xt NFQUEUE rule in a
	// regular chain jumped to from the output hook.
	if _, err := lab.NodeExecInput(node, []byte("table inet qtest {\n"+
		"\tchain out {\n\t\ttype filter hook output priority 0; policy accept;\n\t\tudp dport 9 jump to-queue\n\t}\n"+
		"\tchain to-queue {\n\t}\n}\n"), "nft", "-f", "-"); err != nil {
		t.Fatalf("loading the test table: %v", err)
	}
	nsPath, err := lab.NodeNetnsPath(node)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	if err := queuerule.InstallCompatQueueRule(conn, "qtest", "to-queue", queuerule.QueueRuleConfig{QueueNum: queueNum}); err != nil {
		t.Fatalf("installing the queue rule: %v", err)
	}

	// The queue is bound and never read: Hold stays open.
	hold := make(chan struct{})
	rt, err := queue.NewRuntime(queue.RuntimeConfig{QueueNum: queueNum, AllowMark: 0x100000, NetNS: int(ns.Fd()), Hold: hold}.Defaults(),
		queue.DeciderFunc(func(queue.Packet) (bool, string) { return true, "test" }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	t.Cleanup(func() { close(hold); cancel(); <-done })
	select {
	case <-rt.Ready():
	case err := <-done:
		t.Fatalf("queue runtime: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("queue runtime not ready after 10s")
	}

	queued := func() uint32 {
		t.Helper()
		var total uint32
		if err := lab.InNode(node, func() error {
			st, err := queue.ReadKernelQueueStats()
			for _, s := range st {
				if s.QueueNum == queueNum {
					total = s.QueueTotal
				}
			}
			return err
		}); err != nil {
			t.Fatalf("reading the queue statistics: %v", err)
		}
		return total
	}
	if err := lab.InNode(node, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(nodeIP, port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("held"))
		return err
	}); err != nil {
		t.Fatalf("sending the packet to queue: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for queued() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := queued(); n != 1 {
		t.Fatalf("%d packets waiting in queue %d, want the 1 just sent", n, queueNum)
	}

	probe := func(what string, fn func() error) {
		t.Helper()
		if err := lab.InNode(node, fn); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	probe("the native probe", func() error { _, err := queuerule.ProbeNativeQueue(ctx); return err })
	if n := queued(); n != 1 {
		t.Errorf("after the native queue probe: %d packets waiting, want 1 (the probe dropped the queued packet)", n)
	}
	probe("the xt probe", func() error { _, err := queuerule.KernelQueueProber{NetNS: ns}.CompatQueue(ctx); return err })
	if n := queued(); n != 1 {
		t.Errorf("after the xt NFQUEUE probe: %d packets waiting, want 1 (the probe dropped the queued packet)", n)
	}

	if _, err := lab.NodeExecInput(node, []byte("table inet qcheck {\n\tchain c {\n\t\ttype filter hook forward priority 0; policy accept;\n\t}\n}\n"),
		"nft", "-c", "-f", "-"); err != nil {
		t.Fatalf("nft -c of a base chain: %v", err)
	}
	if n := queued(); n != 0 {
		t.Errorf("after nft -c of a base chain: %d packets waiting; the kernel no longer drops queued packets on a hook's removal, and this test no longer shows what the probes avoid", n)
	}
}
