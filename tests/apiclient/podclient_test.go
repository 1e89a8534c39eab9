// Package apiclient tests the agent's API clients against a real
// kube-apiserver.
package apiclient

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podstore"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// TestPodClientMatchesTransform runs, against a real API server, the pod
// store the agent runs (pkg/podstore over slim.NewPodClient: pods decoded
// from the wire straight into their stored form) beside client-go's pod
// informer with slim.Transform, through the initial events (watch-list,
// and list then watch), label and status changes, a deletion in progress
// and a deletion: they must hold the same pods at every step, and the
// store must say which pods changed.
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

	for run, path := range []string{"watch-list", "list then watch"} {
		t.Run(path, func(t *testing.T) {
			ctx, stop := context.WithCancel(ctx)
			defer stop()
			f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTransform(slim.Transform))
			std := f.Core().V1().Pods().Informer()
			src := podstore.RESTSource(podClient)
			src.InitialEvents = path == "watch-list"
			var changedMu sync.Mutex
			changed := map[string]bool{}
			wire := podstore.New(src, func(key string) { changedMu.Lock(); changed[key] = true; changedMu.Unlock() }, logr.Discard())
			f.Start(ctx.Done())
			go wire.Run(ctx)
			if !cache.WaitForCacheSync(ctx.Done(), std.HasSynced, wire.HasSynced) {
				t.Fatal("informers did not sync")
			}
			// same waits for both to hold want pods, the same, and for the
			// store to have noted (since the previous step) those named.
			same := func(step string, want int, noted ...string) {
				t.Helper()
				for i := range noted {
					noted[i] = ns + "/" + noted[i]
				}
				var diff string
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					a, b := podInfos(t, std.GetStore()), byKey(wire.List())
					changedMu.Lock()
					got := slices.Sorted(maps.Keys(changed))
					changedMu.Unlock()
					if diff = cmp.Diff(a, b, cmpopts.EquateComparable(netip.Addr{})); diff == "" && len(a) == want && slices.Equal(got, noted) {
						clear(changed)
						return
					}
					if diff == "" {
						diff = fmt.Sprintf("%d pods, want %d; changes noted %v, want %v", len(a), want, got, noted)
					}
				}
				t.Fatalf("%s: stores differ (-client-go+Transform +podstore):\n%s", step, diff)
			}
			same("initial events", 24)
			// Changes go through the watch (each run's its own: the same
			// write again would change nothing).
			patch := fmt.Appendf(nil, `{"metadata":{"labels":{"tier":"api","extra":"x%d"}}}`, run)
			if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "p01", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "p04", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "fd00::4"}, {IP: fmt.Sprintf("10.9.1.%d", run)}}}
			if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			same("label and status changes", 24, "p01", "p04")
			// p05 has a finalizer: deleted, it stays with a deletionTimestamp.
			// (No kubelet here: a grace period would keep p06 too.)
			now := int64(0)
			for _, name := range []string{"p05", "p06"} {
				if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil {
					t.Fatal(err)
				}
			}
			same("deletions", 23, "p05", "p06")
			// Restore what this subtest changed for the next one.
			if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "p05", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			same("finalizer removed", 22, "p05")
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
			same("recreated", 24, "p05", "p06")
		})
	}
}

// byKey is pods by key.
func byKey(pods []*compile.PodInfo) map[string]*compile.PodInfo {
	out := map[string]*compile.PodInfo{}
	for _, p := range pods {
		out[p.Key] = p
	}
	return out
}

// podInfos is an informer's pods by key.
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
