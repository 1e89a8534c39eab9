package sets_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/nftnl"
	"github.com/nftpolicy/nftpolicy/pkg/sets"
)

// The sync benchmark's cluster: namespaces of 100 pods spread over
// syncBenchNodes nodes (the synced node, node-0, holds 1/50 of them; the peer
// sets hold pods of every node), 1000 policies (the mix of pkg/compile's and
// pkg/queue's benchmarks: default-deny-ingress in every fourth namespace, a
// default-deny-egress with DNS and same-namespace rules in every tenth,
// otherwise an app selector with 1-3 ingress rules mixing podSelector,
// namespaceSelector alone and ANDed with a podSelector, ipBlock with except,
// numbered, named and ranged ports).
var (
	syncBenchPods     = flag.String("sync-bench-pods", "1000,10000,100000", "BenchmarkSync: comma-separated cluster sizes")
	syncBenchBackends = flag.String("sync-bench-backends", "fake,kernel", "BenchmarkSync: comma-separated backends (fake, kernel, kernel-exec)")
)

const (
	syncBenchNodes    = 50
	syncBenchPolicies = 1000
	syncBenchNode     = "node-0"
)

func syncBenchInput(nPods, nPolicies int) compile.Input {
	in := compiletest.Cluster(nPods, nPolicies, syncBenchNodes)
	in.NodeName = syncBenchNode
	return in
}

func relabel(in compile.Input, i int) compile.Input {
	out := in
	out.Pods = append([]*corev1.Pod(nil), in.Pods...)
	p := in.Pods[i].DeepCopy()
	if p.Labels["tier"] == "web" {
		p.Labels["tier"] = "api"
	} else {
		p.Labels["tier"] = "web"
	}
	out.Pods[i] = p
	return out
}

// pickPod returns the index of a pod with tier=web, on the synced node
// (local) or on another node, whose relabeling changes a peer set of the
// rendered ruleset ("pods with tier=web in namespace x", which exists when a
// policy of x selecting a local pod has such a peer): every timed
// incremental sync then has elements to change.
func pickPod(b *testing.B, in compile.Input, cfg compile.RenderConfig, local bool) int {
	prog := compile.Build(in)
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		b.Fatal(err)
	}
	index := map[string]int{}
	for i, p := range in.Pods {
		index[p.Namespace+"/"+p.Name] = i
	}
	for si := range prog.Selectors {
		sel := &prog.Selectors[si]
		if !strings.HasPrefix(sel.Key, "ns=") || !strings.HasSuffix(sel.Key, "|pods=tier=web") {
			continue
		}
		if _, ok := rs.Sets[compile.PeerSetName(sel, true)]; !ok {
			continue
		}
		for _, id := range sel.Members {
			p := &prog.Pods[id]
			if p.Local == local {
				return index[p.Key]
			}
		}
	}
	b.Fatalf("no pod (local %v) whose tier changes a rendered peer set", local)
	return 0
}

// nsRunner runs functions on one OS thread that lives in a private network
// namespace created for it: the nft processes knftables execs from that
// thread inherit the namespace. The thread is never unlocked; it ends with
// stop, and the namespace with it.
type nsRunner struct {
	fns  chan func()
	done chan struct{}
}

func newNSRunner() (*nsRunner, error) {
	r := &nsRunner{fns: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		defer close(r.done)
		runtime.LockOSThread() // never unlocked on purpose
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		errc <- nil
		for fn := range r.fns {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return r, nil
}

func (r *nsRunner) do(fn func() error) error {
	var err error
	done := make(chan struct{})
	r.fns <- func() { err = fn(); close(done) }
	<-done
	return err
}

func (r *nsRunner) stop() { close(r.fns); <-r.done }

// nsFile opens the runner's network namespace, until the end of the test.
func nsFile(tb testing.TB, r *nsRunner) *os.File {
	var f *os.File
	if err := r.do(func() (err error) { f, err = os.Open("/proc/thread-self/ns/net"); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return f
}

// nsElementWriter is a netlink element writer for the runner's namespace.
func nsElementWriter(tb testing.TB, r *nsRunner) *nftnl.Conn {
	w := nftnl.NewConn(compile.TableName, int(nsFile(tb, r).Fd()))
	tb.Cleanup(func() { w.Close() })
	return w
}

// nsNFT is a knftables.Interface inside an nsRunner's namespace.
type nsNFT struct {
	r   *nsRunner
	nft knftables.Interface
}

func newNSNFT(r *nsRunner) (*nsNFT, error) {
	n := &nsNFT{r: r}
	err := r.do(func() (err error) {
		n.nft, err = knftables.New(knftables.InetFamily, compile.TableName)
		return err
	})
	return n, err
}

func (n *nsNFT) NewTransaction() *knftables.Transaction { return n.nft.NewTransaction() }
func (n *nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.r.do(func() error { return n.nft.Run(ctx, tx) })
}
func (n *nsNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.r.do(func() error { return n.nft.Check(ctx, tx) })
}
func (n *nsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.r.do(func() error { out, err = n.nft.ListAll(ctx); return err })
	return out, err
}
func (n *nsNFT) List(ctx context.Context, t string) (out []string, err error) {
	err = n.r.do(func() error { out, err = n.nft.List(ctx, t); return err })
	return out, err
}
func (n *nsNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.r.do(func() error { out, err = n.nft.ListRules(ctx, chain); return err })
	return out, err
}
func (n *nsNFT) ListElements(ctx context.Context, t, name string) (out []*knftables.Element, err error) {
	err = n.r.do(func() error { out, err = n.nft.ListElements(ctx, t, name); return err })
	return out, err
}
func (n *nsNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.r.do(func() error { out, err = n.nft.ListCounters(ctx); return err })
	return out, err
}

// serializingFake is a knftables.Fake whose Run writes the transaction's
// text, as knftables does for the nft binary, and stops there: applying a
// transaction to the Fake's model costs O(elements²) (each added element is
// looked for, with reflect.DeepEqual, in a slice: 5 s for a 10k-pod full
// sync, hours at 100k) and says nothing about the product. The syncer keeps
// what it applied itself and never reads it back from the Fake, so its work
// is unchanged.
type serializingFake struct {
	*knftables.Fake
	bytes int
}

func (f *serializingFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.bytes = len(tx.String())
	return nil
}

// syncTimes accumulates the three steps of a sync.
type syncTimes struct {
	build, render, tx time.Duration
	txCPU             time.Duration // nft's CPU time (kernel backend)
	txSelfCPU         time.Duration // this process's CPU time in Sync
	ops, elems        int
	n                 int
}

func (t *syncTimes) report(b *testing.B) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(t.n) }
	b.ReportMetric(ms(t.build), "build-ms")
	b.ReportMetric(ms(t.render), "render-ms")
	b.ReportMetric(ms(t.tx), "tx-ms")
	b.ReportMetric(ms(t.build+t.render+t.tx), "total-ms")
	if t.txCPU > 0 {
		b.ReportMetric(ms(t.txCPU), "tx-cpu-ms")
	}
	b.ReportMetric(ms(t.txSelfCPU), "tx-self-cpu-ms")
	b.ReportMetric(float64(t.ops)/float64(t.n), "tx-ops")
	b.ReportMetric(float64(t.elems), "set-elements")
}

// childrenCPU is the CPU time of the process's waited-for children: the nft
// processes knftables ran. On a shared machine it is steadier than their
// wall time.
func childrenCPU() time.Duration { return rusageCPU(unix.RUSAGE_CHILDREN) }

// selfCPU is the CPU time of this process (user and system: the netlink
// path's kernel work runs in its system calls). Sync runs alone, so the
// difference over a Sync is Sync's, give or take the garbage collector.
func selfCPU() time.Duration { return rusageCPU(unix.RUSAGE_SELF) }

func rusageCPU(who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// trackerRebuild builds and renders as the agent does: a new tracker's
// Rebuild.
func trackerRebuild(b *testing.B, cfg compile.RenderConfig, in compile.Input) (*compile.Tracker, *compile.Ruleset) {
	tr, err := compile.NewTracker(cfg)
	if err != nil {
		b.Fatal(err)
	}
	_, rs, err := tr.Rebuild(in)
	if err != nil {
		b.Fatal(err)
	}
	return tr, rs
}

// sync runs Sync once, timing it (wall time, the nft processes' CPU and
// this process's), and counts its operations.
func (t *syncTimes) sync(b *testing.B, s *sets.Syncer, rs *compile.Ruleset) sets.Result {
	cpu0, self0 := childrenCPU(), selfCPU()
	t0 := time.Now()
	res, err := s.Sync(context.Background(), rs)
	if err != nil {
		b.Fatal(err)
	}
	t.tx += time.Since(t0)
	t.txSelfCPU += selfCPU() - self0
	t.txCPU += childrenCPU() - cpu0
	t.ops += res.Operations
	return res
}

// step runs Build (with the agent's cache of parsed objects), Render and
// Sync once, timing each.
func (t *syncTimes) step(b *testing.B, s *sets.Syncer, cache *compile.Cache, in compile.Input, cfg compile.RenderConfig) {
	t0 := time.Now()
	prog := compile.BuildCached(in, cache)
	t1 := time.Now()
	rs, err := compile.Render(prog, cfg)
	if err != nil {
		b.Fatal(err)
	}
	t.render += time.Since(t1)
	t.build += t1.Sub(t0)
	t.sync(b, s, rs)
	t.elems = 0
	for _, set := range rs.Sets {
		t.elems += len(set.Elements)
	}
	t.n++
}

// BenchmarkSync times what the agent does on every change: Build (with the
// controller's compile.Cache), Render and the Syncer's transaction,
// reported separately (build-ms, render-ms, tx-ms per sync, and tx-cpu-ms,
// the CPU time of the nft processes; ns/op adds the benchmark's overhead),
// for a full sync (the first one, and the periodic one) and for an
// incremental sync after one pod's labels changed (a pod on another node,
// "remote", which changes peer sets only, or on the synced node, "local");
// "pods-remote" and "pods-local" are the same change through the
// incremental compiler and ApplyDelta (the agent's path), and
// "pods-new-chain" a local pod that is the first (then the last) of its
// policy, whose chains and sets it creates (deletes).
// The target: incremental under 10 ms and flat in cluster size; full sync
// of 100k pods under 3 s.
//
// "fake" stops at the transaction's text (serializingFake: no nft, no
// kernel), so tx-ms is the syncer's own diff and serialization; "kernel" is
// the agent's syncer against the kernel, in a private network namespace
// created for the benchmark (root only; skipped otherwise): element-only
// syncs over netlink, full syncs through nft with one command per set;
// "kernel-exec" (not run unless named in -sync-bench-backends) is the
// syncer without those two: every sync through nft, one command per
// element. -sync-bench-pods chooses the cluster sizes.
func BenchmarkSync(b *testing.B) {
	cfg := compile.RenderConfig{Mode: compile.ModeHybrid, SkipUnknownPods: true} // no NFQUEUE rule: the queue statement varies by kernel
	cfg.Defaults()
	var sizes []int
	for _, f := range strings.Split(*syncBenchPods, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("-sync-bench-pods: %q is not a pod count", f)
		}
		sizes = append(sizes, n)
	}
	for _, backend := range strings.Split(*syncBenchBackends, ",") {
		if backend != "fake" && backend != "kernel" && backend != "kernel-exec" {
			b.Fatalf("-sync-bench-backends: unknown backend %q", backend)
		}
		b.Run(backend, func(b *testing.B) {
			for _, n := range sizes {
				b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
					in := syncBenchInput(n, syncBenchPolicies)
					newSyncer := func(b *testing.B) *sets.Syncer {
						var nft knftables.Interface
						var scfg sets.Config
						if backend == "fake" {
							nft = &serializingFake{Fake: knftables.NewFake(knftables.InetFamily, compile.TableName)}
						} else {
							if os.Geteuid() != 0 {
								b.Skip("the kernel backend needs root (a private network namespace)")
							}
							r, err := newNSRunner()
							if err != nil {
								b.Skip(err)
							}
							b.Cleanup(r.stop)
							if nft, err = newNSNFT(r); err != nil {
								b.Fatal(err)
							}
							if backend == "kernel" {
								scfg.Netlink, scfg.OneCommandPerSet = nsElementWriter(b, r), true
							}
						}
						scfg.NFT = nft
						s, err := sets.New(scfg)
						if err != nil {
							b.Fatal(err)
						}
						return s
					}
					b.Run("full", func(b *testing.B) {
						s := newSyncer(b)
						var t syncTimes
						for b.Loop() {
							// The first sync of an agent: nothing cached.
							s.ForceFull()
							t.step(b, s, compile.NewCache(), in, cfg)
						}
						t.report(b)
					})
					for _, where := range []string{"remote", "local"} {
						b.Run("incremental-"+where, func(b *testing.B) {
							s := newSyncer(b)
							// A running agent: its cache holds every unchanged pod.
							cache := compile.NewCache()
							var warm syncTimes
							warm.step(b, s, cache, in, cfg)
							i := pickPod(b, in, cfg, where == "local")
							cur := in
							var t syncTimes
							for b.Loop() {
								cur = relabel(cur, i)
								t.step(b, s, cache, cur, cfg)
							}
							t.report(b)
						})
						b.Run("pods-"+where, func(b *testing.B) {
							// The agent's path for pod changes: the tracker's
							// element changes, applied without a diff.
							s := newSyncer(b)
							tr, rs := trackerRebuild(b, cfg, in)
							if _, err := s.Sync(context.Background(), rs); err != nil {
								b.Fatal(err)
							}
							i := pickPod(b, in, cfg, where == "local")
							cur := in
							var t syncTimes
							for b.Loop() {
								cur = relabel(cur, i)
								p := cur.Pods[i]
								if t.applyPod(b, s, tr, p.Namespace+"/"+p.Name, p) {
									b.Fatal("the relabel changed the ruleset's shape")
								}
							}
							t.report(b)
						})
					}
					b.Run("pods-new-chain", func(b *testing.B) {
						// A local pod that is the first (then, deleted, the
						// last) of its combination of policies: the tracker
						// creates (deletes) its isolation chain and its
						// policy's chain with that chain's sets, and the
						// syncer writes the new ruleset's difference.
						s := newSyncer(b)
						cur, pod := withLonePolicy(in)
						tr, rs := trackerRebuild(b, cfg, cur)
						if _, err := s.Sync(context.Background(), rs); err != nil {
							b.Fatal(err)
						}
						key := pod.Namespace + "/" + pod.Name
						var t syncTimes
						for b.Loop() {
							p := pod
							if t.n%2 == 1 {
								p = nil
							}
							if !t.applyPod(b, s, tr, key, p) {
								b.Fatal("the pod left the ruleset's shape")
							}
						}
						t.report(b)
					})
				})
			}
		})
	}
}

// applyPod times the agent's path for one pod change: the tracker's
// ApplyPod (build-ms) and Syncer.ApplyDelta (tx-ms). It reports whether
// the tracker made a new ruleset (chains created or deleted).
func (t *syncTimes) applyPod(b *testing.B, s *sets.Syncer, tr *compile.Tracker, key string, p *corev1.Pod) bool {
	prev := tr.Ruleset()
	t0 := time.Now()
	delta, f := tr.ApplyPod(key, p)
	if f != compile.NoFallback {
		b.Fatal("the pod change needs a rebuild")
	}
	t1 := time.Now()
	self0 := selfCPU()
	res, err := s.ApplyDelta(context.Background(), tr.Ruleset(), delta)
	if err != nil || res.Full {
		b.Fatalf("ApplyDelta: full %v, %v", res.Full, err)
	}
	t.txSelfCPU += selfCPU() - self0
	t.build += t1.Sub(t0)
	t.tx += time.Since(t1)
	t.ops += res.Operations
	t.n++
	return tr.Ruleset() != prev
}

// withLonePolicy adds to the benchmark's cluster a policy that selects no
// pod (app=lone in the first namespace, ingress from that namespace's web
// pods on the named port http) and returns the cluster with it and a local
// pod it selects, not yet in the cluster.
func withLonePolicy(in compile.Input) (compile.Input, *corev1.Pod) {
	ns := in.Namespaces[0].Name
	http := intstr.FromString("http")
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lone"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "lone"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &http}},
			}},
		}}
	out := in
	out.Policies = append(append([]*networkingv1.NetworkPolicy(nil), in.Policies...), np)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lone", Labels: map[string]string{"app": "lone"}},
		Spec: corev1.PodSpec{NodeName: syncBenchNode, Containers: []corev1.Container{{Name: "main",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.250.0.1", PodIPs: []corev1.PodIP{{IP: "10.250.0.1"}}}}
	return out, pod
}

// BenchmarkOnePodBatch isolates the cost of writing one pod's element change
// (alternately added to and deleted from a set of 1000 addresses, with its
// comment) to the kernel, in a private network namespace (root only):
// "netlink" and "nft-exec" are a Syncer with and without the netlink
// element writer on a table of that one set, so the diff costs next to
// nothing; "google-nftables" writes the same change with
// github.com/google/nftables (a lasting connection, SetAddElements or
// SetDeleteElements, Flush), the library the writer could have used.
func BenchmarkOnePodBatch(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: a private network namespace")
	}
	base := &compile.Ruleset{Table: knftables.Table{Comment: ptrString("bench")}, Chains: map[string]*compile.Chain{},
		Sets: map[string]*compile.Set{"peers-v4": {Key: []compile.KeyKind{compile.KeyIPv4}, Set: &knftables.Set{Name: "peers-v4", Type: "ipv4_addr"}}}}
	for i := 0; i < 1000; i++ {
		base.Sets["peers-v4"].Elements = append(base.Sets["peers-v4"].Elements,
			compile.AddrElement(netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(i%250 + 1)}), ptrString(fmt.Sprintf("ns/pod-%d", i))))
	}
	with := *base
	set := *base.Sets["peers-v4"]
	set.Elements = append(append([]compile.Element(nil), set.Elements...), compile.AddrElement(netip.MustParseAddr("10.2.0.1"), ptrString("ns/new-pod")))
	with.Sets = map[string]*compile.Set{"peers-v4": &set}
	setup := func(b *testing.B, netlink bool) (*sets.Syncer, *os.File) {
		k := newKernelNode(b, netlink)
		s, f := k.syncer, nsFile(b, k.r)
		if _, err := s.Sync(context.Background(), base); err != nil {
			b.Fatal(err)
		}
		return s, f
	}
	for _, variant := range []string{"netlink", "nft-exec"} {
		b.Run(variant, func(b *testing.B) {
			s, _ := setup(b, variant == "netlink")
			i := 0
			for b.Loop() {
				rs := base
				if i%2 == 0 {
					rs = &with
				}
				i++
				res, err := s.Sync(context.Background(), rs)
				if err != nil {
					b.Fatal(err)
				}
				if res.Full || res.Netlink != (variant == "netlink") || res.Operations != 1 {
					b.Fatalf("unexpected sync: %+v", res)
				}
			}
		})
	}
	b.Run("google-nftables", func(b *testing.B) {
		_, f := setup(b, false)
		conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.CloseLasting()
		s := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: compile.TableName}, Name: "peers-v4", KeyType: nftables.TypeIPAddr}
		el := []nftables.SetElement{{Key: []byte{10, 2, 0, 1}, Comment: "ns/new-pod"}}
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				err = conn.SetAddElements(s, el)
			} else {
				err = conn.SetDeleteElements(s, el)
			}
			i++
			if err == nil {
				err = conn.Flush()
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

func ptrString(s string) *string { return &s }
