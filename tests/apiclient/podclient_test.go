// Package apiclient tests the agent's API clients against a real
// kube-apiserver.
package apiclient

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// listOnly is a ListerWatcher without watch-list semantics: the reflector
// lists first, then watches (the path of an API server without streaming
// lists).
type listOnly struct{ *cache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

// TestPodClientMatchesTransform runs, against a real API server, the pod
// informer the agent runs (slim.PodListWatch: pods decoded from the wire
// straight into their stored form) beside client-go's pod informer with
// slim.Transform, through the initial events (watch-list, and list then
// watch), label and status changes, a deletion in progress and a deletion:
// their stores must hold the same pods at every step.
func TestPodClientMatchesTransform(t *testing.T) {
	env := kubeenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns = "podclient"
	env.CreateNamespace(t, ns)
	rc := env.RESTConfig()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	podClient, err := slim.NewPodClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	always := corev1.ContainerRestartPolicyAlways
	for i := range 24 {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i), Namespace: ns,
				Labels:      map[string]string{"app": fmt.Sprintf("a%d", i%3), "tier": "web"},
				Annotations: map[string]string{"note": "dropped"}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%2), HostNetwork: i%8 == 7,
				Containers: []corev1.Container{{Name: "main", Image: "pause", Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080}, {ContainerPort: 9090, Protocol: corev1.ProtocolUDP}}}},
				InitContainers: []corev1.Container{{Name: "side", Image: "pause", RestartPolicy: &always,
					Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 15000}}}}},
		}
		if i%6 == 5 {
			p.Finalizers = []string{"example.com/hold"}
		}
		created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if i%5 == 4 {
			continue // no address yet
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.9.0.%d", i+1),
			PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.9.0.%d", i+1)}}}
		if i%3 == 0 {
			created.Status.PodIPs = append(created.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00::%x", i+1)})
		}
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	for _, path := range []string{"watch-list", "list then watch"} {
		t.Run(path, func(t *testing.T) {
			ctx, stop := context.WithCancel(ctx)
			defer stop()
			f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(slim.Transform))
			std := f.Core().V1().Pods().Informer()
			var lw cache.ListerWatcher = slim.PodListWatch(podClient)
			if path != "watch-list" {
				lw = listOnly{slim.PodListWatch(podClient)}
			}
			wire := cache.NewSharedIndexInformer(lw, &compile.PodInfo{}, 0, cache.Indexers{})
			wire.SetTransform(slim.Transform)
			f.Start(ctx.Done())
			go wire.RunWithContext(ctx)
			if !cache.WaitForCacheSync(ctx.Done(), std.HasSynced, wire.HasSynced) {
				t.Fatal("informers did not sync")
			}
			same := func(step string, want int) {
				t.Helper()
				var diff string
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					a, b := podInfos(t, std.GetStore()), podInfos(t, wire.GetStore())
					if diff = cmp.Diff(a, b, cmpopts.EquateComparable(netip.Addr{})); diff == "" && len(a) == want {
						return
					}
					if diff == "" {
						diff = fmt.Sprintf("%d pods, want %d", len(a), want)
					}
				}
				t.Fatalf("%s: stores differ (-client-go+Transform +PodListWatch):\n%s", step, diff)
			}
			same("initial events", 24)
			// Changes go through the watch.
			patch := []byte(`{"metadata":{"labels":{"tier":"api","extra":"x"}}}`)
			if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "p01", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "p04", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "fd00::4"}, {IP: "10.9.0.5"}}}
			if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			same("label and status changes", 24)
			// p05 has a finalizer: deleted, it stays with a deletionTimestamp.
			// (No kubelet here: a grace period would keep p06 too.)
			now := int64(0)
			for _, name := range []string{"p05", "p06"} {
				if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil {
					t.Fatal(err)
				}
			}
			same("deletions", 23)
			// Restore what this subtest changed for the next one.
			if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "p05", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			same("finalizer removed", 22)
			recreate := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p05", Namespace: ns, Labels: map[string]string{"app": "a2"}},
				Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Image: "pause"}}}}
			for _, name := range []string{"p05", "p06"} {
				recreate.Name, recreate.Finalizers = name, nil
				if name == "p05" {
					recreate.Finalizers = []string{"example.com/hold"}
				}
				if _, err := cs.CoreV1().Pods(ns).Create(ctx, recreate, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			same("recreated", 24)
		})
	}
}

// podInfos is a store's pods by key; the informer holds PodInfos in both
// cases.
func podInfos(t *testing.T, s cache.Store) map[string]*compile.PodInfo {
	t.Helper()
	out := map[string]*compile.PodInfo{}
	for _, obj := range s.List() {
		pi, ok := obj.(*compile.PodInfo)
		if !ok {
			t.Fatalf("store holds %T", obj)
		}
		out[pi.Key] = pi
	}
	return out
}
