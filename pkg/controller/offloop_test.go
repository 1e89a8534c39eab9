package controller

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestRefreshBuildsOffTheLoop holds the program refresh after a policy
// change in its build, off the sync loop, and checks that another
// namespace's policy change and a pod change made meanwhile are committed
// to the kernel without waiting for it; that the held build, overtaken by
// them, is discarded and built again rather than published; and that the
// program published then is the full build of every object, without a
// full build on the loop.
func TestRefreshBuildsOffTheLoop(t *testing.T) {
	var (
		mu        sync.Mutex
		published []*compile.Program
	)
	h := newHarness(t, func(cfg *Config) {
		cfg.ProgramRefreshDelay = 10 * time.Millisecond
		cfg.Hooks = &Hooks{}
		cfg.Hooks.OnProgram(func(_, cur *compile.Program) {
			mu.Lock()
			published = append(published, cur)
			mu.Unlock()
		})
	},
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}),
		testPod("y", "b", "n1", "10.0.2.1", map[string]string{"app": "db"}))
	h.ctrl.checkDelay = time.Hour
	var builds atomic.Int32
	started := make(chan int32, 16)
	release := make(chan struct{})
	h.ctrl.offloopBuilding = func() {
		n := builds.Add(1)
		started <- n
		if n == 1 {
			<-release
		}
	}
	h.run(t)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	loopBuilds := func() uint64 {
		return histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "full") + histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "incremental")
	}
	before := loopBuilds()
	ctx := context.Background()
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(ctx, denyAll("x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the program refresh after the policy change did not start building off the loop")
	}
	// The build is held: the loop goes on.
	yPol := denyAll("y")
	yPol.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	if _, err := h.client.NetworkingV1().NetworkPolicies("y").Create(ctx, yPol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.CoreV1().Pods("y").Create(ctx, testPod("y", "c", "n1", "10.0.2.9", map[string]string{"app": "db"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var lastDump string
	defer func() {
		if t.Failed() {
			t.Log(lastDump)
		}
	}()
	eventually(t, "the other namespace's policy and pod committed while the refresh builds", func() bool {
		d := h.nft.dump()
		lastDump = d
		return strings.Contains(d, "default deny ingress: y/deny-all") && strings.Contains(d, "10.0.2.9")
	})
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d refresh builds started while the first was held", n)
	}
	close(release)
	eventually(t, "the program of every policy published", func() bool {
		p := h.eval.Program()
		return p != nil && len(p.Policies) == 2 && slices.ContainsFunc(p.Pods, func(p compile.Pod) bool { return p.Key == "y/c" })
	})
	mu.Lock()
	for i, p := range published[1:] {
		if len(p.Policies) != 2 {
			t.Errorf("program %d published after the first has %d policies: the held build, overtaken by changes, was published", i+1, len(p.Policies))
		}
	}
	mu.Unlock()
	if got := counterValue(t, h.ctrl.cfg.Metrics.RefreshDiscards); got != 1 {
		t.Fatalf("%v refresh builds discarded, want 1 (the held one)", got)
	}
	if n := builds.Load(); n != 2 {
		t.Fatalf("%d refresh builds, want 2 (the held one, discarded, and its redo)", n)
	}
	if after := loopBuilds(); after != before {
		t.Fatalf("%d full builds on the loop during the refresh", after-before)
	}
	in, err := h.ctrl.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	want := compile.Build(in)
	got := h.eval.Program()
	if !slices.EqualFunc(want.Policies, got.Policies, func(a, b compile.Policy) bool { return a.Key == b.Key }) ||
		!slices.EqualFunc(want.Pods, got.Pods, func(a, b compile.Pod) bool { return a.Key == b.Key && slices.Equal(a.MemberOf, b.MemberOf) }) {
		t.Fatalf("the published program is not the full build: policies %v, pods %v", got.Policies, got.Pods)
	}
}

// TestRefreshFallsBackAfterDiscards overtakes three off-loop refresh
// builds in a row with pod changes and checks that the refresh is then a
// full build on the loop (the program's lag stays bounded under steady
// churn), and that the refresh after the next policy change is built off
// the loop again.
func TestRefreshFallsBackAfterDiscards(t *testing.T) {
	h := newHarness(t, func(cfg *Config) { cfg.ProgramRefreshDelay = 10 * time.Millisecond },
		testPod("x", "a", "n1", "10.0.1.1", map[string]string{"app": "web"}))
	h.ctrl.checkDelay = time.Hour
	var builds atomic.Int32
	started := make(chan int32, 16)
	release := make(chan struct{})
	h.ctrl.offloopBuilding = func() {
		n := builds.Add(1)
		started <- n
		if n <= maxOffloopDiscards {
			<-release
		}
	}
	h.run(t)
	eventually(t, "first sync", func() bool { return h.eval.Program() != nil })
	loopBuilds := func() uint64 {
		return histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "full") + histogramCount(t, h.ctrl.cfg.Metrics.SyncDuration, "incremental")
	}
	before := loopBuilds()
	ctx := context.Background()
	wait := func(want int32) {
		t.Helper()
		select {
		case n := <-started:
			if n != want {
				t.Fatalf("refresh build %d started, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("refresh build %d did not start off the loop", want)
		}
	}
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(ctx, denyAll("x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range int32(maxOffloopDiscards) {
		wait(i + 1)
		ip := "10.0.1." + string(rune('5'+i))
		if _, err := h.client.CoreV1().Pods("x").Create(ctx, testPod("x", "p"+ip, "n1", ip, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the pod committed while the refresh builds", func() bool { return strings.Contains(h.nft.dump(), ip+" ") })
		release <- struct{}{}
	}
	eventually(t, "the full build on the loop after three discards", func() bool {
		p := h.eval.Program()
		return loopBuilds() > before && p != nil && len(p.Policies) == 1 && len(p.Pods) == 4
	})
	y := denyAll("x")
	y.Name = "second"
	if _, err := h.client.NetworkingV1().NetworkPolicies("x").Create(ctx, y, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(maxOffloopDiscards + 1)
	eventually(t, "the refresh built off the loop published", func() bool {
		p := h.eval.Program()
		return p != nil && len(p.Policies) == 2
	})
}
