package bootcni

import (
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/internal/scratchns"
)

// scratchConn creates the test's network namespace (scratchns.New) and
// returns its name and a netlink connection into it.
func scratchConn(t *testing.T) (string, *nftables.Conn) {
	t.Helper()
	name, f := scratchns.New(t, "bootcni")
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseLasting() })
	return name, conn
}

func nft(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, func(x, y netip.Addr) int { return x.Compare(y) })
	return a
}

// TestHoldKernel: the hold created in an empty namespace (the table, both
// families' sets, the forward and input chains with their drop rules),
// extended by a second pod without duplicating its rules, released by
// address (twice: a DEL repeated is no error), and left alone once the
// agent's forward chain is in the table.
func TestHoldKernel(t *testing.T) {
	ns, conn := scratchConn(t)
	a, b := netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr("fd00::10")
	c := netip.MustParseAddr("10.244.1.11")
	if st, err := Hold(conn, []netip.Addr{a, b}); err != nil || st != HoldCreated {
		t.Fatalf("Hold on an empty namespace: %v, %v; want %v", st, err, HoldCreated)
	}
	if st, err := Hold(conn, []netip.Addr{c}); err != nil || st != HoldExtended {
		t.Fatalf("Hold of a second pod: %v, %v; want %v", st, err, HoldExtended)
	}
	table := nft(t, ns, "list", "table", "inet", "nftpolicy")
	for _, want := range []string{
		"chain " + ChainHoldFwd, "hook forward priority filter - 5; policy accept;",
		"ip saddr @" + SetHoldV4 + " counter packets 0 bytes 0 drop", "ip daddr @" + SetHoldV4,
		"ip6 saddr @" + SetHoldV6, "ip6 daddr @" + SetHoldV6,
		"chain " + ChainHoldIn, "hook input priority filter - 5; policy accept;", "ct state new ip saddr @" + SetHoldV4,
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the hold lacks %q:\n%s", want, table)
		}
	}
	if n := strings.Count(table, "drop"); n != 6 {
		t.Errorf("%d drop rules, want 6 (forward: source and destination per family; input: source per family):\n%s", n, table)
	}
	held, err := Held(conn)
	if want := sortedAddrs([]netip.Addr{a, b, c}); err != nil || !slices.Equal(sortedAddrs(held), want) {
		t.Errorf("held %v, %v; want %v", held, err, want)
	}
	for i := 0; i < 2; i++ {
		if err := Release(conn, []netip.Addr{a, b}); err != nil {
			t.Fatalf("Release #%d: %v", i+1, err)
		}
	}
	if held, err := Held(conn); err != nil || !slices.Equal(held, []netip.Addr{c}) {
		t.Errorf("held after Release %v, %v; want [%v]", held, err, c)
	}

	// The agent's first full sync: its forward chain in, the hold out.
	agent := "add chain inet nftpolicy forward { type filter hook forward priority filter - 5; policy accept; }\n" +
		"delete chain inet nftpolicy " + ChainHoldFwd + "\ndelete chain inet nftpolicy " + ChainHoldIn + "\n" +
		"delete set inet nftpolicy " + SetHoldV4 + "\ndelete set inet nftpolicy " + SetHoldV6 + "\n"
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(agent)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the agent's sync: %v: %s", err, out)
	}
	before := nft(t, ns, "list", "table", "inet", "nftpolicy")
	if st, err := Hold(conn, []netip.Addr{a}); err != nil || st != AgentEnforces {
		t.Fatalf("Hold with the agent's table: %v, %v; want %v", st, err, AgentEnforces)
	}
	if after := nft(t, ns, "list", "table", "inet", "nftpolicy"); after != before {
		t.Errorf("Hold changed the agent's table:\n%s\nwas:\n%s", after, before)
	}
	if err := Release(conn, []netip.Addr{c}); err != nil {
		t.Errorf("Release without a hold: %v", err)
	}
}
