// Package publish tests the PodAddressSlice publisher (pkg/publish)
// against a real kube-apiserver: what it publishes, its leader election,
// its writes' optimistic concurrency and install.yaml's admission policy
// that keeps everyone else from writing slices.
package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/pkg/publish"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// startWithCRD starts a control plane with the PodAddressSlice CRD
// (exactly podslice.CRD, as install.yaml carries it).
func startWithCRD(t testing.TB) *kubeenv.Env {
	t.Helper()
	env := kubeenv.Start(t)
	path := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(path, []byte(podslice.CRD), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/podaddressslices.nftpolicy.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return env
}

// testConfig is a publisher's configuration with short lease times, so
// that a takeover happens within seconds.
func testConfig(identity string) publish.Config {
	return publish.Config{Identity: identity, Window: 2 * time.Millisecond,
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}
}

// runner is a running publisher.
type runner struct {
	metrics *publish.Metrics
	cancel  context.CancelFunc
	done    chan struct{}
}

func (r *runner) stop() {
	r.cancel()
	<-r.done
}

func startPublisher(t testing.TB, env *kubeenv.Env, cfg publish.Config) *runner {
	t.Helper()
	return startPublisherAs(t, env.RESTConfig(), cfg)
}

// startPublisherAs starts a publisher that talks to the API server as rc
// says.
func startPublisherAs(t testing.TB, rc *rest.Config, cfg publish.Config) *runner {
	t.Helper()
	m := publish.NewMetrics()
	p, err := publish.New(cfg, rc, m, testr.NewWithInterface(t, testr.Options{}).WithName(cfg.Identity))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{metrics: m, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := p.Run(ctx); err != nil {
			t.Errorf("publisher %s: %v", cfg.Identity, err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

// makePod creates a pod and, when ip is set, gives it that address (as a
// kubelet would).
func makePod(t testing.TB, env *kubeenv.Env, ns, name, ip string, labels map[string]string, hostNetwork bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: "node-1", HostNetwork: hostNetwork,
			Containers: []corev1.Container{{Name: "main", Image: "pause",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip == "" {
		return p
	}
	return setIP(t, env, p, ip)
}

func setIP(t testing.TB, env *kubeenv.Env, p *corev1.Pod, ip string) *corev1.Pod {
	t.Helper()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	p, err := env.Client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// addrEqual compares addresses by value (netip.Addr has unexported fields).
var addrEqual = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// wanted is what podslice.Entry makes of every pod of the cluster, read
// back as an agent reads a slice, by key.
func wanted(t testing.TB, env *kubeenv.Env) map[string]*compile.PodInfo {
	t.Helper()
	list, err := env.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*compile.PodInfo{}
	for i := range list.Items {
		p := slim.Pod(&list.Items[i])
		e, ok := podslice.Entry(p)
		if !ok {
			continue
		}
		s := &podslice.PodAddressSlice{PodLabels: p.Labels, Pods: []podslice.PodEntry{e}}
		s.Namespace = p.Namespace
		infos, err := podslice.PodInfos(s)
		if err != nil {
			t.Fatal(err)
		}
		out[p.Key] = infos[0]
	}
	return out
}

// publishedPods reads every slice of the cluster as an agent does; it
// says what is wrong with them: a pod in two slices, an entry that does
// not read, a slice not labelled as the publisher's.
func publishedPods(ctx context.Context, env *kubeenv.Env) (map[string]*compile.PodInfo, []string, error) {
	list, _, err := publishedSlices(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	out := map[string]*compile.PodInfo{}
	var problems []string
	for _, s := range list {
		if s.Labels[podslice.ManagedByLabel] != podslice.Publisher {
			problems = append(problems, fmt.Sprintf("slice %s/%s is not labelled %s=%s", s.Namespace, s.Name, podslice.ManagedByLabel, podslice.Publisher))
		}
		infos, err := podslice.PodInfos(s)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, p := range infos {
			if _, dup := out[p.Key]; dup {
				problems = append(problems, "pod "+p.Key+" is in two slices")
			}
			out[p.Key] = p
		}
	}
	return out, problems, nil
}

// waitPublished waits until the slices publish exactly every pod's entry.
func waitPublished(t testing.TB, env *kubeenv.Env, what string) {
	t.Helper()
	ctx := context.Background()
	var diff string
	var problems []string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		got, probs, err := publishedPods(ctx, env)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		problems = probs
		if diff = cmp.Diff(wanted(t, env), got, addrEqual); diff == "" && len(problems) == 0 {
			return
		}
	}
	t.Fatalf("%s: the slices do not publish the pods (-want +got):\n%s\nproblems: %v", what, diff, problems)
}

// publishedSlices lists every slice of the cluster, with the list's
// resourceVersion.
func publishedSlices(ctx context.Context, env *kubeenv.Env) ([]*podslice.PodAddressSlice, string, error) {
	list, err := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, "", err
	}
	out := make([]*podslice.PodAddressSlice, len(list.Items))
	for i := range list.Items {
		b, err := list.Items[i].MarshalJSON()
		if err != nil {
			return nil, "", err
		}
		out[i] = &podslice.PodAddressSlice{}
		if err := json.Unmarshal(b, out[i]); err != nil {
			return nil, "", err
		}
	}
	return out, list.GetResourceVersion(), nil
}

func jsonUnmarshalSlice(b []byte, s *podslice.PodAddressSlice) error { return json.Unmarshal(b, s) }

// testutilValue is the publisher's successful writes of an op.
func testutilValue(m *publish.Metrics, op string) float64 {
	return testutil.ToFloat64(m.Writes.WithLabelValues(op, "ok"))
}
