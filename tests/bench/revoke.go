package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
)

// RevokeConfig configures RunRevoke.
type RevokeConfig struct {
	// Entries is how many conntrack entries the node holds during the pass.
	Entries int
	Logf    func(format string, args ...any)
}

// RunRevoke measures what one revocation pass over a large conntrack table
// adds to the agent's resident memory
// (revocation_extra_rss_mb_<entries/1000>k_conntrack: the process's peak
// RSS during the pass minus its RSS before) and how long it takes
// (revocation_pass_ms_<n>k_conntrack). node-1 of a lab gets Entries UDP
// entries from x/a to ports of x/b (both on node-1), written over
// ctnetlink with a ten-minute timeout (as many UDP flows of a pod would
// make, without waiting for them); an edit of x/b's policy that changes no
// verdict makes every entry decided and none deleted. The revoker
// runs in this process, as in the agent.
func RunRevoke(ctx context.Context, cfg RevokeConfig) (*Result, error) {
	l, err := lab.New(ctx, nil, lab.Config{})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	l.Namespace("x", nil)
	a := lab.PodSpec{Namespace: "x", Name: "a", Node: 0, IP: lab.PodIP(0, 0), Labels: map[string]string{"app": "a"}}
	b := lab.PodSpec{Namespace: "x", Name: "b", Node: 0, IP: lab.PodIP(0, 1), Labels: map[string]string{"app": "b"}}
	for _, p := range []lab.PodSpec{a, b} {
		l.Know(p)
	}
	policy := func(extra bool) *networkingv1.NetworkPolicy {
		peers := []networkingv1.NetworkPolicyPeer{{PodSelector: lab.MatchLabels("app", "a")}}
		if extra {
			peers = append(peers, networkingv1.NetworkPolicyPeer{PodSelector: lab.MatchLabels("app", "none")})
		}
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "to-b"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *lab.MatchLabels("app", "b"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers}}}}
	}
	l.SetPolicy(policy(false))
	if err := l.Publish(ctx); err != nil {
		return nil, err
	}
	agent := l.Agent(lab.DefaultNodes[0])
	old := agent.Program

	start := time.Now()
	if err := fillConntrack(agent.NetnsFD(), a.IP, b.IP, cfg.Entries); err != nil {
		return nil, err
	}
	cfg.Logf("revoke: %d conntrack entries written in %v", cfg.Entries, time.Since(start).Round(time.Millisecond))
	l.SetPolicy(policy(true))
	if err := l.Publish(ctx); err != nil {
		return nil, err
	}
	cur := agent.Program

	table, err := conntrack.Dial(agent.NetnsFD())
	if err != nil {
		return nil, err
	}
	defer table.Close()
	r, err := conntrack.NewRevoker(conntrack.Config{Decide: agent.Evaluator().DecideSides, DecideBefore: agent.Evaluator().DecideSidesBefore, Table: table})
	if err != nil {
		return nil, err
	}
	runtime.GC()
	debug.FreeOSMemory()
	// Peak RSS from here on: writing 5 to clear_refs resets VmHWM to the
	// current RSS.
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return nil, fmt.Errorf("resetting the peak RSS: %w", err)
	}
	before, err := procStatus(os.Getpid())
	if err != nil {
		return nil, err
	}
	pass, err := r.Revoke([]*compile.Program{old}, cur)
	if err != nil {
		return nil, err
	}
	after, err := procStatus(os.Getpid())
	if err != nil {
		return nil, err
	}
	if pass.Dumped < cfg.Entries || pass.Deleted != 0 {
		return nil, fmt.Errorf("the pass read %d entries and deleted %d; want at least %d and none", pass.Dumped, pass.Deleted, cfg.Entries)
	}
	extra := (after["VmHWM"] - before["VmRSS"]) / 1024
	cfg.Logf("revoke: one pass over %d entries in %v: RSS %.1f MiB before, peak %.1f MiB", pass.Dumped, pass.Duration.Round(time.Millisecond),
		before["VmRSS"]/1024, after["VmHWM"]/1024)
	res := &Result{}
	sz := fmt.Sprintf("%dk", cfg.Entries/1000)
	res.Set("revocation_extra_rss_mb_"+sz+"_conntrack", round(extra, 1))
	res.Set("revocation_pass_ms_"+sz+"_conntrack", millis(pass.Duration))
	return res, nil
}

// fillConntrack writes n UDP entries src:port -> dst:port into the
// conntrack table of the network namespace netns.
func fillConntrack(netns int, src, dst netip.Addr, n int) error {
	c, err := ct.Dial(&netlink.Config{NetNS: netns})
	if err != nil {
		return err
	}
	defer c.Close()
	for i := range n {
		sport, dport := uint16(1024+i%60000), uint16(1024+i/60000)
		f := ct.NewFlow(17, 0, src, dst, sport, dport, 600, 0)
		if err := c.Create(f); err != nil {
			return fmt.Errorf("creating conntrack entry %d: %w", i, err)
		}
	}
	return nil
}
