package publish

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
)

func sliceObject(ns, name string, labels map[string]string, podLabels map[string]any, pods ...map[string]any) *unstructured.Unstructured {
	items := make([]any, len(pods))
	for i, p := range pods {
		items[i] = p
	}
	meta := map[string]any{"name": name, "namespace": ns}
	if labels != nil {
		l := map[string]any{}
		for k, v := range labels {
			l[k] = v
		}
		meta["labels"] = l
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": podslice.Group + "/" + podslice.Version, "kind": podslice.Kind,
		"metadata": meta, "podLabels": podLabels, "pods": items}}
}

func entry(name, ip string) map[string]any {
	return map[string]any{"name": name, "ips": []any{ip}, "created": "2026-01-01T00:00:00Z"}
}

// TestPublisherPublishesPods: the slices publish exactly what
// podslice.Entry makes of every eligible pod with an address, through
// creations, addresses given, relabels, deletions and a label set of more
// than podslice.MaxPods pods; slices left from before (of a deleted pod,
// written by hand) go when the publisher starts.
func TestPublisherPublishesPods(t *testing.T) {
	env := startWithCRD(t)
	ctx := context.Background()
	for _, ns := range []string{"a", "b"} {
		env.CreateNamespace(t, ns)
	}
	slices := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR)
	managed := map[string]string{podslice.ManagedByLabel: podslice.Publisher}
	// Before the publisher: a slice of a pod that is gone, and one that
	// claims an address for labels no pod has.
	for _, s := range []*unstructured.Unstructured{
		sliceObject("a", "old", managed, map[string]any{"app": "web"}, entry("gone", "10.1.9.9")),
		sliceObject("b", "byhand", nil, map[string]any{"role": "admin"}, entry("x", "10.1.9.8")),
	} {
		if _, err := slices.Namespace(s.GetNamespace()).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	web := map[string]string{"app": "web", "pod-template-hash": "1"}
	makePod(t, env, "a", "web-1", "10.1.0.1", web, false)
	makePod(t, env, "a", "web-2", "10.1.0.2", web, false)
	makePod(t, env, "b", "web-1", "10.1.1.1", web, false)
	makePod(t, env, "a", "db-0", "10.1.0.3", map[string]string{"app": "db", "statefulset.kubernetes.io/pod-name": "db-0"}, false)
	makePod(t, env, "a", "host", "192.168.1.1", web, true)
	pending := makePod(t, env, "a", "pending", "", web, false)

	r := startPublisher(t, env, testConfig("p1"))
	waitPublished(t, env, "at start")

	setIP(t, env, pending, "10.1.0.4")
	waitPublished(t, env, "an address given")

	p, err := env.Client.CoreV1().Pods("a").Get(ctx, "web-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels = map[string]string{"app": "web", "pod-template-hash": "2"}
	if _, err := env.Client.CoreV1().Pods("a").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, env, "a relabel")

	if err := env.Client.CoreV1().Pods("a").Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, env, "a deletion")

	big := map[string]string{"app": "big"}
	for i := range 130 {
		makePod(t, env, "b", fmt.Sprintf("big-%03d", i), fmt.Sprintf("10.2.%d.%d", i/200, i%200+1), big, false)
	}
	waitPublished(t, env, "130 pods of one label set")
	list, err := slices.Namespace("b").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// web-1, and big's 130 pods in two.
	if len(list.Items) != 3 {
		t.Errorf("namespace b has %d slices, want 3", len(list.Items))
	}
	if n := testutil.ToFloat64(r.metrics.Pods); n != 134 {
		t.Errorf("nftpolicy_publisher_pods = %v, want 134 (a: web-2, db-0, pending; b: web-1 and 130)", n)
	}
}

// TestPublisherCorrectsOthersWrites: a slice written by someone else
// while the publisher leads (an admin: the admission policy stops anyone
// else) is deleted, and an edit of one of the publisher's slices undone.
func TestPublisherCorrectsOthersWrites(t *testing.T) {
	env := startWithCRD(t)
	ctx := context.Background()
	env.CreateNamespace(t, "a")
	makePod(t, env, "a", "web-1", "10.1.0.1", map[string]string{"app": "web"}, false)
	startPublisher(t, env, testConfig("p1"))
	waitPublished(t, env, "at start")

	slices := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR).Namespace("a")
	evil := sliceObject("a", "evil", map[string]string{podslice.ManagedByLabel: podslice.Publisher},
		map[string]any{"app": "web"}, entry("ghost", "10.1.0.66"))
	if _, err := slices.Create(ctx, evil, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, env, "a slice written by hand")

	list, err := slices.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("listing slices: %d, %v", len(list.Items), err)
	}
	own := list.Items[0]
	pods, _, _ := unstructured.NestedSlice(own.Object, "pods")
	pods = append(pods, entry("ghost", "10.1.0.66"))
	if err := unstructured.SetNestedSlice(own.Object, pods, "pods"); err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Update(ctx, &own, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, env, "an edit of the publisher's slice")
}
