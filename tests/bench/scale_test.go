package bench

import (
	"math"
	"net/netip"
	"slices"
	"testing"
)

// TestFirstSyncValues: the values are read from the last "First sync
// committed" line of an agent log (each start appends one), durations in
// milliseconds and counts as they are; a line without one of the keys
// gives none.
func TestFirstSyncValues(t *testing.T) {
	log := `I1201 15:54:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="128.1ms" build="1.5s" apply="20ms" kernelRead="0s" elementsUnchanged=0 cpu="3s" nftCPU="1s" pageFaults=7 gcCycles=1
I1201 15:54:36.000000       1 controller.go:572] "Synced" logger="agent.sync" kind="full"
I1201 15:55:35.376468       1 controller.go:572] "First sync committed" logger="agent.sync" policies=2 pods=3 operations=56 duration="1.2s" build="244.5ms" apply="900µs" kernelRead="448ms" elementsUnchanged=12 cpu="1.1s" nftCPU="95ms" pageFaults=36912 gcCycles=3
I1201 15:55:36.000000       1 controller.go:572] "Synced pod changes" logger="agent.sync"`
	for _, c := range []struct {
		keys []string
		want []float64
	}{
		{[]string{"build", "apply", "kernelRead"}, []float64{244.5, 0.9, 448}},
		{[]string{"cpu", "nftCPU", "pageFaults", "gcCycles"}, []float64{1100, 95, 36912, 3}},
	} {
		got, ok := firstSyncValues(log, c.keys...)
		if !ok || !slices.Equal(got, c.want) {
			t.Errorf("firstSyncValues(%v) = %v, %v; want %v", c.keys, got, ok, c.want)
		}
	}
	if _, ok := firstSyncValues(`I1201 15:54:35.376468 1 controller.go:572] "First sync committed" policies=2 duration="1s"`, "build"); ok {
		t.Error("a line without the key gave a value")
	}
	if _, ok := firstSyncValues(`I1201 15:54:35.376468 1 controller.go:572] "Synced" build="1s"`, "build"); ok {
		t.Error("a line other than the first sync's gave a value")
	}
}

// TestDeriveScale: the marginal resident memory per pod is taken from 10k
// pods to the largest size measured, in KiB; without 10k, or with nothing
// above it, there is none.
func TestDeriveScale(t *testing.T) {
	pods := []int{1000, 10000, 50000, 100000, 150000}
	r := ParseLines("rss_mb_1k=50\nrss_mb_10k=65\nrss_mb_100k=200\nrss_mb_150k=205\nincr_sync_ms_10k=0.2\nincr_sync_ms_100k=0.3\n")
	deriveScale(r, pods)
	// (205 - 65) MiB over 140,000 pods.
	if got := r.Float("rss_marginal_kib_per_pod"); got != 1.024 {
		t.Errorf("rss_marginal_kib_per_pod = %v, want 1.024", got)
	}
	if got := r.Float("incr_sync_flatness_100k_vs_10k"); got != 1.5 {
		t.Errorf("incr_sync_flatness_100k_vs_10k = %v, want 1.5", got)
	}
	for _, c := range []struct {
		lines string
		pods  []int
	}{
		{"rss_mb_1k=50\nrss_mb_10k=65\n", []int{1000, 10000}},
		{"rss_mb_1k=50\nrss_mb_50k=150\n", []int{1000, 50000}},
		{"rss_mb_10k=65\n", []int{10000, 150000}}, // the largest size failed
	} {
		r := ParseLines(c.lines)
		deriveScale(r, c.pods)
		if s, ok := r.Get("rss_marginal_kib_per_pod"); ok {
			t.Errorf("sizes %v, %q: rss_marginal_kib_per_pod = %s, want none", c.pods, c.lines, s)
		}
	}
}

// TestParsePolicyScale: NETWORKPOLICIES:CLUSTERNETWORKPOLICIES, "" off;
// anything else is an error.
func TestParsePolicyScale(t *testing.T) {
	for in, want := range map[string]PolicyScale{"": {}, "10000:100": {10000, 100}, "200:0": {200, 0}} {
		if got, err := ParsePolicyScale(in); err != nil || got != want {
			t.Errorf("ParsePolicyScale(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"10000", "0:100", "-1:5", "10:-1", "a:b", "10:", ":10", "150000:10000:100"} {
		if got, err := ParsePolicyScale(in); err == nil {
			t.Errorf("ParsePolicyScale(%q) = %+v, no error", in, got)
		}
	}
	if got := (PolicyScale{Policies: 10000, ClusterPolicies: 100}).name(150000); got != "150k_10k_policies" {
		t.Errorf("name = %q", got)
	}
}

// TestScaleNamesAt150k: at 150k pods (1500 namespaces) every pod has its
// own IP, outside the lab's 10.244.0.0/16, and every namespace its own
// name.
func TestScaleNamesAt150k(t *testing.T) {
	const pods = 150000
	lab := netip.MustParsePrefix("10.244.0.0/16")
	ips := make(map[netip.Addr]bool, pods)
	names := map[string]bool{}
	for k := range pods {
		i, j := k/podsPerNS, k%podsPerNS
		ip := scalePodIP(i, j)
		if ips[ip] || lab.Contains(ip) || !ip.Is4() {
			t.Fatalf("pod %d of namespace %d: IP %v repeated or in the lab's %v", j, i, ip, lab)
		}
		ips[ip] = true
		names[scaleNSName(i)] = true
	}
	if len(names) != pods/podsPerNS {
		t.Errorf("%d namespace names for %d namespaces", len(names), pods/podsPerNS)
	}
}

// TestHistogramQuantile: the quantile of what a histogram observed between
// two scrapes (only the difference counts), interpolated within its
// bucket; the +Inf bucket gives its lower bound; nothing observed gives
// none.
func TestHistogramQuantile(t *testing.T) {
	b := func(le string) string { return `h_bucket{le="` + le + `"}` }
	before := map[string]float64{b("0.001"): 5, b("0.002"): 5, b("0.004"): 5, b("+Inf"): 5}
	// 100 observations since: 50 up to 1 ms, 40 in (1, 2] ms, 9 in (2, 4]
	// ms, 1 above.
	after := map[string]float64{b("0.001"): 55, b("0.002"): 95, b("0.004"): 104, b("+Inf"): 105, "other": 7}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.001}, {0.7, 0.0015}, {0.99, 0.004}, {1, 0.004}, {0.25, 0.0005}} {
		got, ok := histogramQuantile(before, after, "h_bucket", c.q)
		if !ok || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile %v = %v, %v; want %v", c.q, got, ok, c.want)
		}
	}
	if _, ok := histogramQuantile(after, after, "h_bucket", 0.99); ok {
		t.Errorf("a quantile of nothing observed")
	}
}
