package publish

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/publish"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// BenchmarkPublisherRollout replaces a Deployment's 50 pods one by one as
// a rollout does (a new pod created, given its address, made ready; an
// old pod terminating, then gone: five pod changes a pod) against a real
// API server, and prints name=value figures:
//   - publisher_writes_per_pod_change: slice writes over pod changes,
//     each change waited for (sequential) and all made at once (burst);
//   - publisher_slice_delay_p50_ms, _p99_ms: from a pod write's return to
//     a watcher of slices seeing its effect (what the publisher adds to a
//     remote pod's programming delay), over the 150 changes an entry
//     shows (address, terminating, gone);
//   - publisher_write_delay_mean_ms: the publisher's own histogram (from
//     the pod event it received to the end of the slice's write).
//
// Run: go test -run '^$' -bench PublisherRollout -benchtime 1x ./tests/publish
func BenchmarkPublisherRollout(b *testing.B) {
	for _, w := range []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond} {
		b.Run(fmt.Sprintf("window=%v", w), func(b *testing.B) {
			for range b.N {
				rollout(b, w)
			}
		})
	}
}

const rolloutPods = 50

func rollout(b *testing.B, window time.Duration) {
	env := startWithCRD(b)
	ctx := context.Background()
	env.CreateNamespace(b, "r")
	old := map[string]string{"app": "web", "pod-template-hash": "a"}
	for i := range rolloutPods {
		makePod(b, env, "r", fmt.Sprintf("web-a-%02d", i), fmt.Sprintf("10.3.0.%d", i+1), old, false)
	}
	cfg := testConfig("bench")
	cfg.Window = window
	r := startPublisher(b, env, cfg)
	waitPublished(b, env, "before the rollout")
	sw := watchSlices(b, env)
	defer sw.Stop()

	before := writesOK(r.metrics)
	var delays []time.Duration
	wait := func(start time.Time, cond func(map[string]podslice.PodEntry) bool) {
		if err := sw.until(cond, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		delays = append(delays, time.Since(start))
	}
	replace := func(i int, from, to string, sequential bool) {
		newName, oldName := fmt.Sprintf("web-%s-%02d", to, i), fmt.Sprintf("web-%s-%02d", from, i)
		p := makePod(b, env, "r", newName, "", map[string]string{"app": "web", "pod-template-hash": to}, false)
		ip := fmt.Sprintf("10.3.%d.%d", map[string]int{"b": 1, "c": 2}[to], i+1)
		p = setIP(b, env, p, ip)
		if sequential {
			wait(time.Now(), func(m map[string]podslice.PodEntry) bool { _, ok := m[newName]; return ok })
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if _, err := env.Client.CoreV1().Pods("r").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		grace := int64(30)
		if err := env.Client.CoreV1().Pods("r").Delete(ctx, oldName, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			b.Fatal(err)
		}
		if sequential {
			wait(time.Now(), func(m map[string]podslice.PodEntry) bool { return m[oldName].Deleting })
		}
		if err := env.Client.CoreV1().Pods("r").Delete(ctx, oldName, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			b.Fatal(err)
		}
		if sequential {
			wait(time.Now(), func(m map[string]podslice.PodEntry) bool { _, ok := m[oldName]; return !ok })
		}
	}
	for i := range rolloutPods {
		replace(i, "a", "b", true)
	}
	seqWrites := writesOK(r.metrics) - before
	before = writesOK(r.metrics)
	for i := range rolloutPods {
		replace(i, "b", "c", false)
	}
	waitPublished(b, env, "after the burst")
	burstWrites := writesOK(r.metrics) - before
	changes := float64(5 * rolloutPods)

	slices.Sort(delays)
	q := func(f float64) float64 {
		return float64(delays[int(f*float64(len(delays)-1))].Microseconds()) / 1000
	}
	prefix := fmt.Sprintf("publisher_window_%s_", window)
	fmt.Printf("%swrites_per_pod_change_sequential=%.3f\n", prefix, seqWrites/changes)
	fmt.Printf("%swrites_per_pod_change_burst=%.3f\n", prefix, burstWrites/changes)
	fmt.Printf("%sslice_delay_p50_ms=%.2f\n", prefix, q(0.5))
	fmt.Printf("%sslice_delay_p99_ms=%.2f\n", prefix, q(0.99))
	var h dto.Metric
	if err := r.metrics.WriteDelay.(prometheus.Metric).Write(&h); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("%swrite_delay_mean_ms=%.2f\n", prefix, 1000*h.GetHistogram().GetSampleSum()/float64(h.GetHistogram().GetSampleCount()))
	b.ReportMetric(seqWrites/changes, "writes/change")
	b.ReportMetric(burstWrites/changes, "burst-writes/change")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

func writesOK(m *publish.Metrics) float64 {
	var n float64
	for _, op := range []string{"create", "update", "delete"} {
		n += testutilValue(m, op)
	}
	return n
}

// sliceWatch follows every slice of the cluster, as an agent would.
type sliceWatch struct {
	w    watch.Interface
	pods map[string]map[string]podslice.PodEntry // slice key -> pod name -> entry
}

func watchSlices(t testing.TB, env *kubeenv.Env) *sliceWatch {
	t.Helper()
	c := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR)
	list, err := c.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sw := &sliceWatch{pods: map[string]map[string]podslice.PodEntry{}}
	for i := range list.Items {
		sw.apply(watch.Added, &list.Items[i])
	}
	if sw.w, err = c.Watch(context.Background(), metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}); err != nil {
		t.Fatal(err)
	}
	return sw
}

func (sw *sliceWatch) Stop() { sw.w.Stop() }

func (sw *sliceWatch) apply(typ watch.EventType, u *unstructured.Unstructured) {
	key := u.GetNamespace() + "/" + u.GetName()
	if typ == watch.Deleted {
		delete(sw.pods, key)
		return
	}
	b, _ := u.MarshalJSON()
	s := &podslice.PodAddressSlice{}
	if jsonUnmarshalSlice(b, s) != nil {
		return
	}
	m := map[string]podslice.PodEntry{}
	for _, e := range s.Pods {
		m[e.Name] = e
	}
	sw.pods[key] = m
}

// until reads events until cond holds of every pod published.
func (sw *sliceWatch) until(cond func(map[string]podslice.PodEntry) bool, timeout time.Duration) error {
	all := func() map[string]podslice.PodEntry {
		out := map[string]podslice.PodEntry{}
		for _, m := range sw.pods {
			for n, e := range m {
				out[n] = e
			}
		}
		return out
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for !cond(all()) {
		select {
		case ev, ok := <-sw.w.ResultChan():
			if !ok {
				return fmt.Errorf("the slice watch ended")
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				sw.apply(ev.Type, u)
			}
		case <-timer.C:
			return fmt.Errorf("no slice showed the change in %v", timeout)
		}
	}
	return nil
}
