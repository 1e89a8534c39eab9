package publish

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/publish"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// writes is how many slice writes a publisher tried.
func writes(m *publish.Metrics) float64 {
	var n float64
	for _, op := range []string{"create", "update", "delete"} {
		for _, result := range []string{"ok", "conflict", "error"} {
			n += testutil.ToFloat64(m.Writes.WithLabelValues(op, result))
		}
	}
	return n
}

func leaseRenewed(t *testing.T, env *kubeenv.Env) (holder string, renewed time.Time) {
	t.Helper()
	l, err := env.Client.CoordinationV1().Leases("kube-system").Get(context.Background(), "nftpolicy-publisher", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		renewed = l.Spec.RenewTime.Time
	}
	return holder, renewed
}

// TestPublisherFailover: of two publishers only the leader writes; it
// keeps renewing the Lease with no pod changing (the agents read that it
// is alive from it); when it stops, the other takes over within the
// Lease's duration and publishes the changes since.
func TestPublisherFailover(t *testing.T) {
	env := startWithCRD(t)
	env.CreateNamespace(t, "a")
	makePod(t, env, "a", "web-1", "10.1.0.1", map[string]string{"app": "web"}, false)
	cfgA, cfgB := testConfig("pub-a"), testConfig("pub-b")
	runners := map[string]*runner{"pub-a": startPublisher(t, env, cfgA), "pub-b": startPublisher(t, env, cfgB)}
	waitPublished(t, env, "at start")

	holder, renewed := leaseRenewed(t, env)
	leader, standby := runners[holder], runners["pub-a"]
	if holder == "pub-a" {
		standby = runners["pub-b"]
	}
	if leader == nil {
		t.Fatalf("the Lease is held by %q, not a publisher", holder)
	}
	if testutil.ToFloat64(leader.metrics.Leader) != 1 || testutil.ToFloat64(standby.metrics.Leader) != 0 {
		t.Errorf("leader gauges: leader %v, standby %v; want 1 and 0",
			testutil.ToFloat64(leader.metrics.Leader), testutil.ToFloat64(standby.metrics.Leader))
	}
	if writes(leader.metrics) == 0 || writes(standby.metrics) != 0 {
		t.Errorf("writes: leader %v, standby %v; want some and none", writes(leader.metrics), writes(standby.metrics))
	}

	time.Sleep(4 * cfgA.RetryPeriod)
	if h, again := leaseRenewed(t, env); h != holder || !again.After(renewed) {
		t.Errorf("with no pod change the Lease was not renewed: held by %q at %v, then by %q at %v", holder, renewed, h, again)
	}

	leader.stop()
	stopped := time.Now()
	makePod(t, env, "a", "web-2", "10.1.0.2", map[string]string{"app": "web"}, false)
	waitPublished(t, env, "after the leader stopped")
	took := time.Since(stopped)
	t.Logf("the standby published a change %v after the leader stopped", took)
	if took > cfgA.LeaseDuration {
		t.Errorf("the standby took %v to take over, more than the Lease duration %v", took, cfgA.LeaseDuration)
	}
	if testutil.ToFloat64(standby.metrics.Leader) != 1 {
		t.Errorf("the standby does not say it leads")
	}
}

// TestPublisherStaleWriteConflicts: a deposed leader's late write, made
// with the resourceVersion it read before another leader wrote the slice,
// fails with a conflict and changes nothing; so does its delete.
func TestPublisherStaleWriteConflicts(t *testing.T) {
	env := startWithCRD(t)
	ctx := context.Background()
	env.CreateNamespace(t, "a")
	web := map[string]string{"app": "web"}
	makePod(t, env, "a", "web-1", "10.1.0.1", web, false)
	startPublisher(t, env, testConfig("p1"))
	waitPublished(t, env, "at start")

	old, err := publish.NewWriter(env.RESTConfig(), publish.NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := publishedSlices(ctx, env)
	if err != nil || len(got) != 1 {
		t.Fatalf("want one slice: %d, %v", len(got), err)
	}
	stale := got[0] // what the deposed leader read
	makePod(t, env, "a", "web-2", "10.1.0.2", web, false)
	waitPublished(t, env, "a pod added")

	ghost := *stale
	ghost.Pods = append(ghost.Pods, podslice.PodEntry{Name: "ghost", IPs: []string{"10.1.0.66"}, Created: metav1.Now()})
	if _, err := old.Put(ctx, &ghost, stale.ResourceVersion); !apierrors.IsConflict(err) {
		t.Errorf("a write at the stale resourceVersion %s: %v, want a conflict", stale.ResourceVersion, err)
	}
	if err := old.Delete(ctx, stale.Namespace, stale.Name, stale.ResourceVersion); !apierrors.IsConflict(err) {
		t.Errorf("a delete at the stale resourceVersion %s: %v, want a conflict", stale.ResourceVersion, err)
	}
	waitPublished(t, env, "after the stale writes")
}
