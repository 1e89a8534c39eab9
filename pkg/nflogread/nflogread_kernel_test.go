package nflogread

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftpolicy/nftpolicy/pkg/internal/scratchns"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
)

// TestOneReaderForConsumersOfOneGroup: two consumers configured to the same
// NFLOG group (the deny log's and verification's groups set equal) both
// get their messages from the kernel: one socket reads the group and hands
// each message to the consumer of its prefix. Two readers of one group
// could not both be bound.
func TestOneReaderForConsumersOfOneGroup(t *testing.T) {
	name, ns := scratchns.New(t, "nflog")
	const group = 77
	ruleset := `table inet nflogtest {
	chain out {
		type filter hook output priority 0;
		udp dport 9001 log prefix "dtest" group 77
		udp dport 9002 log prefix "vtest" group 77
	}
}`
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	cmd := exec.Command("ip", "netns", "exec", name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	var mu sync.Mutex
	got := map[string][]string{}
	consumer := func(kind, prefix string) Consumer {
		return Consumer{Group: group, Name: kind, Claims: func(p string) bool { return strings.HasPrefix(p, prefix) },
			Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dropped"}, []string{"reason"}),
			Handle: func(p string, _ queue.Packet, _ time.Time) {
				mu.Lock()
				defer mu.Unlock()
				got[kind] = append(got[kind], p)
			}}
	}
	r := New(klog.Background(), int(ns.Fd()))
	r.Add(consumer("deny", "d"))
	r.Add(consumer("verify", "v"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, group) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	both := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["deny"]) > 0 && len(got["verify"]) > 0
	}
	for deadline := time.Now().Add(10 * time.Second); !both() && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		default:
		}
		send := exec.Command("ip", "netns", "exec", name, "bash", "-c", "echo x >/dev/udp/127.0.0.1/9001; echo x >/dev/udp/127.0.0.1/9002")
		if out, err := send.CombinedOutput(); err != nil {
			t.Fatalf("sending: %v: %s", err, out)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for kind, want := range map[string]string{"deny": "dtest", "verify": "vtest"} {
		if len(got[kind]) == 0 || slices.ContainsFunc(got[kind], func(p string) bool { return p != want }) {
			t.Errorf("the %s consumer got %v, want only %q messages", kind, got[kind], want)
		}
	}
}
