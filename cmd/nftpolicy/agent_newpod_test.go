package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDefaultRouteIfaces: the uplinks are the interfaces of the IPv4 and
// IPv6 default routes, each once, not lo's unreachable IPv6 default nor
// other routes' interfaces; missing files give none.
func TestDefaultRouteIfaces(t *testing.T) {
	dir := t.TempDir()
	r4 := filepath.Join(dir, "route")
	r6 := filepath.Join(dir, "ipv6_route")
	const route4 = `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth0	00000000	0100A8C0	0003	0	0	100	00000000	0	0	0
eth0	0000A8C0	00000000	0001	0	0	100	00FFFFFF	0	0	0
cali1234	0A01F40A	00000000	0005	0	0	0	FFFFFFFF	0	0	0
`
	const route6 = `00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 bond0
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 veth1
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo
`
	if err := os.WriteFile(r4, []byte(route4), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r6, []byte(route6), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := defaultRouteIfaces(r4, r6); !slices.Equal(got, []string{"bond0", "eth0"}) {
		t.Errorf("uplinks %q, want [bond0 eth0]", got)
	}
	if got := defaultRouteIfaces(filepath.Join(dir, "none"), filepath.Join(dir, "none6")); len(got) != 0 {
		t.Errorf("no files: %q", got)
	}
}
