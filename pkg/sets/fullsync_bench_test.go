package sets_test

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/queuerule"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

var fullSyncPods = flag.Int("full-sync-pods", 10000, "BenchmarkFullSync: cluster size")

// BenchmarkFullSync is the agent's full sync as nftbench's scale section
// times it (nftpolicy_sync_duration_seconds, kind=full), in process and in
// a private network namespace (root only): the tracker's rebuild from
// stored pods (compile.PodInfo, as the informer keeps them), then
// Syncer.Sync configured as the agent configures it (netlink writer, one
// command per set, the xt-compat queue rule installed over netlink), in
// hybrid mode with the unknown-pod sets. "first" syncs into a namespace
// without the table (a node's first agent, the scale section's single-size
// run); "resync" syncs over a table the same ruleset fills (an agent's
// restart, the periodic full sync): the kernel's sets are read and
// compared, nothing but the chains is written; "grow" syncs over the table
// of a fifth of the pods (nftbench scale's 50k size over its 10k table):
// the elements of the other pods are added. Reported per sync:
// build-ms, tx-ms (the whole Syncer.Sync), read-ms (its part reading and
// comparing the kernel's sets), total-ms, tx-cpu-ms (CPU of the nft
// processes), self-cpu-ms (this process during the sync, with its netlink
// work), set-elements (the desired ruleset's) and elements-written (added
// and deleted by the sync). -full-sync-pods sets the cluster size (1000
// policies, 50 nodes).
func BenchmarkFullSync(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: a private network namespace")
	}
	in := syncBenchInput(*fullSyncPods, syncBenchPolicies)
	for _, p := range in.Pods {
		in.PodInfos = append(in.PodInfos, compile.NewPodInfo(p))
	}
	in.Pods = nil
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, QueueVariant: compile.QueueXTCompat}
	cfg.Defaults()
	node := func(b *testing.B) *sets.Syncer {
		r, err := newNSRunner()
		if err != nil {
			b.Skip(err)
		}
		b.Cleanup(r.stop)
		nft, err := newNSNFT(r)
		if err != nil {
			b.Fatal(err)
		}
		fd := int(nsFile(b, r).Fd())
		s, err := sets.New(sets.Config{NFT: nft, Netlink: nsElementWriter(b, r), OneCommandPerSet: true,
			External: func(ctx context.Context, chain string) error {
				conn, err := nftables.New(nftables.WithNetNSFd(fd))
				if err != nil {
					return err
				}
				return queuerule.InstallCompatQueueRule(conn, compile.TableName, chain, queuerule.CompatRuleConfig(cfg, chain))
			}})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	var elements, written int
	var read time.Duration
	step := func(b *testing.B, s *sets.Syncer, t *syncTimes) {
		t0 := time.Now()
		_, rs := trackerRebuild(b, cfg, in)
		t.build += time.Since(t0)
		res := t.sync(b, s, rs)
		if !res.Full {
			b.Fatalf("sync %+v is not a full one", res)
		}
		t.n++
		elements = res.ElementsAdded + res.ElementsUnchanged
		written += res.ElementsAdded + res.ElementsDeleted
		read += res.ReadDuration
	}
	report := func(b *testing.B, t *syncTimes) {
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(t.n) }
		b.ReportMetric(ms(t.build), "build-ms")
		b.ReportMetric(ms(t.tx), "tx-ms")
		b.ReportMetric(ms(t.build+t.tx), "total-ms")
		b.ReportMetric(ms(t.txCPU), "tx-cpu-ms")
		b.ReportMetric(ms(t.txSelfCPU), "self-cpu-ms")
		b.ReportMetric(float64(elements), "set-elements")
		b.ReportMetric(float64(written)/float64(t.n), "elements-written")
		b.ReportMetric(ms(read), "read-ms")
	}
	b.Run("first", func(b *testing.B) {
		var t syncTimes
		written, read = 0, 0
		for b.Loop() {
			b.StopTimer()
			s := node(b)
			b.StartTimer()
			step(b, s, &t)
		}
		report(b, &t)
	})
	b.Run("grow", func(b *testing.B) {
		small := in
		small.PodInfos = in.PodInfos[:len(in.PodInfos)/5]
		var t, warm syncTimes
		written, read = 0, 0
		for b.Loop() {
			b.StopTimer()
			s := node(b)
			_, rs := trackerRebuild(b, cfg, small)
			warm.sync(b, s, rs)
			s.ForceFull()
			b.StartTimer()
			step(b, s, &t)
		}
		report(b, &t)
	})
	b.Run("resync", func(b *testing.B) {
		s := node(b)
		var warm syncTimes
		step(b, s, &warm)
		var t syncTimes
		written, read = 0, 0
		for b.Loop() {
			s.ForceFull()
			step(b, s, &t)
		}
		report(b, &t)
	})
}
