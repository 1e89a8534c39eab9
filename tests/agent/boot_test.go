package agent_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// TestBootWindowHoldsPodsUntilFirstSync is a node after a reboot: no
// table, the pods restarted and talking, no agent yet. The pods started
// through the boot plugin (its ADD run as the runtime runs it) must have no
// denied connection admitted before the agent's first sync; a pair started
// without it shows the window the plugin closes (its denied connections
// are admitted: the scenario does run before enforcement). After the
// first sync the hold is gone (nothing held, the allowed connection
// allowed), the policy enforced, and a pod started later through the
// plugin is not held. The plugin's CHECK succeeds for a held pod, and DEL
// (twice) releases a pod gone before the agent came.
func TestBootWindowHoldsPodsUntilFirstSync(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{Mode: compile.ModeHybrid, Nodes: []string{"node-1"}, NoAgents: true,
		Prefix: netlab.RandomPrefix("npboot")})
	ctx := testContext(t, 3*time.Minute)
	res, err := c.RunBootWindow(ctx, cluster.BootWindow{Node: "node-1", Namespace: "boot", Rounds: 20, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds before the agent: held pods %d denied admitted, unheld pods %d; first sync %v",
		res.Rounds, res.HeldAdmittedDenied, res.UnheldAdmittedDenied, res.FirstSync.Round(time.Millisecond))
	want := append(c.PodIPs("boot/held-client"), c.PodIPs("boot/held-server")...)
	if !slices.Equal(sortAddrs(res.HeldBefore), sortAddrs(want)) || slices.Contains(res.HeldBefore, res.Gone[0]) {
		t.Errorf("held before the agent: %v; want the held pair's %v (not the deleted pod's %v)", res.HeldBefore, want, res.Gone)
	}
	if res.UnheldAdmittedDenied == 0 {
		t.Errorf("pods without the boot plugin: no denied connection admitted before the agent: the scenario did not run in the boot window")
	}
	if res.HeldAdmittedDenied != 0 {
		t.Errorf("pods started through the boot plugin: %d of %d denied connections admitted before the agent's first sync, want 0",
			res.HeldAdmittedDenied, res.Rounds)
	}
	if len(res.HeldAfter) != 0 {
		t.Errorf("still held after the agent's first sync: %v\ntable:\n%s", res.HeldAfter, c.ListTable("node-1"))
	}
	if !res.DeniedAfter || !res.AllowedAfter {
		t.Errorf("after the first sync: denied connection denied %v, allowed connection allowed %v; want both\ntable:\n%s",
			res.DeniedAfter, res.AllowedAfter, c.ListTable("node-1"))
	}
	if !res.LateAllowed {
		t.Errorf("a pod started through the plugin after the first sync cannot connect (held with an agent running?)\ntable:\n%s", c.ListTable("node-1"))
	}
}

func sortAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, func(x, y netip.Addr) int { return x.Compare(y) })
	return a
}
