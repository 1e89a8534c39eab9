package publish

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// event is one watch event of a slice or a Lease, in etcd's order (the
// resourceVersions of one API server's objects are one sequence).
type event struct {
	rv     uint64
	typ    watch.EventType
	name   string
	pods   []string // a slice's pod names
	holder string   // a Lease's holder
}

// recordEvents watches every slice and the Leases of kube-system from now
// until the test ends; events returns what was seen so far.
func recordEvents(t *testing.T, env *kubeenv.Env) (events func() []event) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sc := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR)
	list, err := sc.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := sc.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := env.Client.CoordinationV1().Leases("kube-system").Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan event, 1000)
	go func() {
		for ev := range sw.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			rv, _ := strconv.ParseUint(u.GetResourceVersion(), 10, 64)
			e := event{rv: rv, typ: ev.Type, name: "slice/" + u.GetName()}
			items, _, _ := unstructured.NestedSlice(u.Object, "pods")
			for _, it := range items {
				if m, ok := it.(map[string]any); ok {
					n, _ := m["name"].(string)
					e.pods = append(e.pods, n)
				}
			}
			ch <- e
		}
	}()
	go func() {
		for ev := range lw.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			rv, _ := strconv.ParseUint(l.ResourceVersion, 10, 64)
			e := event{rv: rv, typ: ev.Type, name: "lease/" + l.Name}
			if l.Spec.HolderIdentity != nil {
				e.holder = *l.Spec.HolderIdentity
			}
			ch <- e
		}
	}()
	var seen []event
	return func() []event {
		for {
			select {
			case e := <-ch:
				seen = append(seen, e)
			case <-time.After(500 * time.Millisecond):
				sorted := append([]event(nil), seen...)
				for i := 1; i < len(sorted); i++ {
					for j := i; j > 0 && sorted[j].rv < sorted[j-1].rv; j-- {
						sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
					}
				}
				return sorted
			}
		}
	}
}

// TestPublisherSyncedLeaseAfterCatchUp: a new leader renews the Lease the
// agents read (their default --pod-slices-lease-name) only after it wrote
// what changed while no leader ran. client-go's election renews its own
// Lease as soon as the new leader holds it, before it has read a pod:
// agents reading that one would trust stale slices meanwhile.
func TestPublisherSyncedLeaseAfterCatchUp(t *testing.T) {
	env := startWithCRD(t)
	env.CreateNamespace(t, "a")
	web := map[string]string{"app": "web"}
	makePod(t, env, "a", "web-1", "10.1.0.1", web, false)
	first := startPublisher(t, env, testConfig("pub-a"))
	waitPublished(t, env, "at start")
	agentsLease := "lease/" + config.Default().PodSlices.LeaseName

	events := recordEvents(t, env)
	first.stop()
	makePod(t, env, "a", "web-2", "10.1.0.2", web, false)
	startPublisher(t, env, testConfig("pub-b"))
	waitPublished(t, env, "by the new leader")
	// Renewals every RetryPeriod: see a few.
	time.Sleep(4 * testConfig("").RetryPeriod)

	var written, renewed uint64
	for _, e := range events() {
		if written == 0 && e.name != agentsLease && slices.Contains(e.pods, "web-2") {
			written = e.rv
		}
		if renewed == 0 && e.name == agentsLease && e.holder == "pub-b" {
			renewed = e.rv
		}
	}
	if written == 0 || renewed == 0 {
		t.Fatalf("the new leader's write of web-2 at resourceVersion %d, its renewal of %s at %d: want both",
			written, agentsLease, renewed)
	}
	if renewed < written {
		t.Errorf("the new leader renewed %s (resourceVersion %d) before it wrote the pod made while no leader ran (%d): agents trust stale slices meanwhile",
			agentsLease, renewed, written)
	}
}

// TestPublisherMoveWritesReceiverFirst: a pod whose labels move it from
// one slice to another is written into its new slice before it leaves its
// old one, in both directions (the order of two slices' names is not the
// order of their writes): a reader that keeps a pod while any slice holds
// it never lacks it.
func TestPublisherMoveWritesReceiverFirst(t *testing.T) {
	env := startWithCRD(t)
	ctx := context.Background()
	env.CreateNamespace(t, "a")
	makePod(t, env, "a", "keep-1", "10.1.0.9", map[string]string{"app": "web"}, false)
	p := makePod(t, env, "a", "mover", "10.1.0.1", map[string]string{"app": "web"}, false)
	startPublisher(t, env, testConfig("pub"))
	waitPublished(t, env, "at start")
	// What a reader holds: every slice's pods, from the state at start.
	held := map[string][]string{}
	start, _, err := publishedSlices(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range start {
		for _, e := range s.Pods {
			held["slice/"+s.Name] = append(held["slice/"+s.Name], e.Name)
		}
	}
	events := recordEvents(t, env)
	for _, app := range []string{"db", "web", "db"} {
		cur, err := env.Client.CoreV1().Pods("a").Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Labels = map[string]string{"app": app}
		if _, err := env.Client.CoreV1().Pods("a").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPublished(t, env, "mover to app="+app)
	}
	writes := 0
	for _, e := range events() {
		if !strings.HasPrefix(e.name, "slice/") {
			continue
		}
		writes++
		if e.typ == watch.Deleted {
			delete(held, e.name)
		} else {
			held[e.name] = e.pods
		}
		present := false
		for _, pods := range held {
			present = present || slices.Contains(pods, "mover")
		}
		if !present {
			t.Errorf("after %s %s (resourceVersion %d) no slice holds the moving pod: %v", e.typ, e.name, e.rv, held)
		}
	}
	if writes < 6 {
		t.Errorf("%d slice writes seen for three moves, want at least 6", writes)
	}
}
