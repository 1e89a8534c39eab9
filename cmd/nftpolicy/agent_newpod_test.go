package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
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

// TestRangesHook: each program's pod ranges are in nftpolicy_pod_ranges,
// and the agent warns when a program has none while unknown pods are held
// (once per change to none), never in kernel mode.
func TestRangesHook(t *testing.T) {
	for _, mode := range []compile.Mode{compile.ModeHybrid, compile.ModeKernel} {
		var buf bytes.Buffer
		log := funcr.New(func(prefix, args string) { buf.WriteString(args + "\n") }, funcr.Options{})
		o := &newPodOptions{metrics: &newPodMetrics{ranges: prometheus.NewGauge(prometheus.GaugeOpts{Name: "r"})}}
		hook := o.rangesHook(log, compile.RenderConfig{Mode: mode})
		none, some := &compile.Program{}, &compile.Program{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
		hook(nil, none)
		if got := testutil.ToFloat64(o.metrics.ranges); got != 0 {
			t.Errorf("%s: no ranges: gauge %v", mode, got)
		}
		hook(none, none)
		hook(none, some)
		if got := testutil.ToFloat64(o.metrics.ranges); got != 1 {
			t.Errorf("%s: one range: gauge %v", mode, got)
		}
		hook(some, none)
		want := 2
		if mode == compile.ModeKernel {
			want = 0
		}
		if n := strings.Count(buf.String(), "no pod address ranges known"); n != want {
			t.Errorf("%s: %d warnings, want %d:\n%s", mode, n, want, buf.String())
		}
	}
}
