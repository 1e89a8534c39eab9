package apiclient

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
	"github.com/nftpolicy/nftpolicy/tests/internal/slicetest"
)

// slicesNS and the nodes of TestPodSlices: the agent runs on localNode.
const (
	slicesNS   = "podslices"
	localNode  = "node-a"
	remoteNode = "node-b"
)

// TestPodSlices runs the agent's slice source (podstore.Sliced) against a
// real API server, with the test writing the slices and renewing the
// Lease as the publisher would: the slices become the pods the Pod
// source would give (the node's own pods from its Pods, without any
// slice), a pod moving between slices is never absent, and a stale or
// deleted Lease makes the store read every Pod until it is fresh again.
func TestPodSlices(t *testing.T) {
	env := kubeenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	slicetest.InstallCRD(t, env)
	env.CreateNamespace(t, slicesNS)
	cs, podClient := clients(t, env)

	pods := map[string]*corev1.Pod{}
	for i := range 12 {
		node := remoteNode
		if i%4 == 0 {
			node = localNode
		}
		p := makePod(ctx, t, cs, fmt.Sprintf("p%02d", i), node, map[string]string{"app": fmt.Sprintf("a%d", i%3)}, fmt.Sprintf("10.20.0.%d", i+1), i == 8)
		pods[p.Name] = p
	}
	// The publisher's slices: every eligible pod with an address, by label
	// set, the local node's too (the agent leaves them out).
	groups := map[string][]*corev1.Pod{}
	for _, p := range pods {
		groups[p.Labels["app"]] = append(groups[p.Labels["app"]], p)
	}
	for app, ps := range groups {
		if err := slicetest.Write(ctx, cs, slicetest.Slice("s-"+app, ps...)); err != nil {
			t.Fatal(err)
		}
	}
	// A slice's entry for a local pod with other labels: the node's Pod
	// watch decides.
	wrong := pods["p04"].DeepCopy()
	wrong.Labels = map[string]string{"app": "forged"}
	if err := slicetest.Write(ctx, cs, slicetest.Slice("s-forged", wrong)); err != nil {
		t.Fatal(err)
	}
	lease := slicetest.StartLease(ctx, t, cs, 300*time.Millisecond)

	every := podstore.New(podstore.RESTSource(podClient), func(string) {}, logr.Discard())
	go every.Run(ctx)
	var watchedKey atomic.Pointer[string]
	var absent atomic.Int32
	var s *podstore.Sliced
	s, err := podstore.NewSliced(podstore.SlicedConfig{
		Node: localNode, Local: podstore.OnNode(podstore.RESTSource(podClient), localNode), Pods: podstore.RESTSource(podClient),
		Slices: podstore.RESTSliceSource(cs.CoreV1().RESTClient()), Lease: podstore.InformLease(cs, slicetest.LeaseNamespace, slicetest.LeaseName),
		StaleAfter: 2 * time.Second, Limits: podstore.DefaultSliceLimits,
	}, func(key string) {
		// Every change: the pod being moved must be there.
		if k := watchedKey.Load(); k != nil && s.Get(*k) == nil {
			absent.Add(1)
		}
	}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(ctx)

	// same waits for the sliced store to use source and hold what the
	// Pod source holds (remote pods: only those the publisher publishes).
	same := func(step, source string) {
		t.Helper()
		var diff string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			want := published(every.List(), source)
			if got := s.Source(); got != source {
				diff = fmt.Sprintf("source %q, want %q", got, source)
				continue
			}
			if diff = cmp.Diff(want, byKey(s.List()), podCmp...); diff == "" && every.HasSynced() {
				return
			}
		}
		t.Fatalf("%s: the sliced store differs from the Pods (-Pods +sliced):\n%s", step, diff)
	}
	same("slices read", podstore.SourceSlices)

	// A new local pod, which no slice names, is known from the node's
	// Pods.
	makePod(ctx, t, cs, "local-new", localNode, map[string]string{"app": "new"}, "10.20.1.1", false)
	same("a local pod without a slice", podstore.SourceSlices)

	// p01 (app a1) moves to a slice of its own (app moved): the new slice
	// is written first, then the old one without it.
	key := slicesNS + "/p01"
	watchedKey.Store(&key)
	moved := pods["p01"]
	moved.Labels = map[string]string{"app": "moved"}
	if _, err := cs.CoreV1().Pods(slicesNS).Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := slicetest.Write(ctx, cs, slicetest.Slice("s-moved", moved)); err != nil {
		t.Fatal(err)
	}
	var rest []*corev1.Pod
	for _, p := range groups["a1"] {
		if p.Name != "p01" {
			rest = append(rest, p)
		}
	}
	if err := slicetest.Write(ctx, cs, slicetest.Slice("s-a1", rest...)); err != nil {
		t.Fatal(err)
	}
	same("a pod moved between slices", podstore.SourceSlices)
	if n := absent.Load(); n != 0 {
		t.Fatalf("the moved pod was absent at %d changes", n)
	}
	watchedKey.Store(nil)

	// The publisher goes away: its Lease is not renewed. A remote pod is
	// deleted meanwhile (its slice keeps it): the store reads every Pod
	// and no longer has it. A pod both sources hold is there throughout
	// the switches.
	kept := slicesNS + "/p05"
	watchedKey.Store(&kept)
	lease.Pause()
	if err := cs.CoreV1().Pods(slicesNS).Delete(ctx, "p02", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	same("the Lease stale", podstore.SourcePods)
	if s.Get(slicesNS+"/p02") != nil {
		t.Fatal("a deleted pod held from a stale slice")
	}
	// Back: the publisher brings the slice up to date, then renews.
	var a2 []*corev1.Pod
	for _, p := range groups["a2"] {
		if p.Name != "p02" {
			a2 = append(a2, p)
		}
	}
	if err := slicetest.Write(ctx, cs, slicetest.Slice("s-a2", a2...)); err != nil {
		t.Fatal(err)
	}
	if err := lease.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	same("the Lease fresh again", podstore.SourceSlices)
	if n := absent.Load(); n != 0 {
		t.Fatalf("a pod both sources hold was absent at %d changes of the switches", n)
	}
	watchedKey.Store(nil)
	// The Lease deleted: every Pod again.
	if err := lease.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	same("the Lease deleted", podstore.SourcePods)
}

// published is what the sliced store should hold for the pods of the
// Pod source: with source slices, the local node's pods and the remote
// pods the publisher publishes (eligible, with an address); with source
// pods, every pod.
func published(all []*compile.PodInfo, source string) map[string]*compile.PodInfo {
	out := map[string]*compile.PodInfo{}
	for _, p := range all {
		if source == podstore.SourcePods || p.Node == localNode || p.Eligible && len(p.IPs) > 0 {
			out[p.Key] = p
		}
	}
	return out
}

// podCmp compares pods as policies see them: a slice carries that a pod
// is being deleted, not when, and its own resource version.
var podCmp = []cmp.Option{cmpopts.EquateComparable(netip.Addr{}), cmpopts.EquateEmpty(),
	cmpopts.IgnoreFields(compile.PodInfo{}, "ResourceVersion", "DeletionTimestamp", "Annotations")}

func clients(t *testing.T, env *kubeenv.Env) (kubernetes.Interface, rest.Interface) {
	t.Helper()
	rc := env.RESTConfig()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	podClient, err := slim.NewPodClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, podClient
}

// makePod creates a running pod on node with the address (host-network
// if hostNet).
func makePod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name, node string, labels map[string]string, ip string, hostNet bool) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: slicesNS, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: hostNet, Containers: []corev1.Container{{Name: "main", Image: "pause",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
	created, err := cs.CoreV1().Pods(slicesNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	updated, err := cs.CoreV1().Pods(slicesNS).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return updated
}
