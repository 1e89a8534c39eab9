package kubeenv_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

func TestEnv(t *testing.T) {
	began := time.Now()
	env := kubeenv.Start(t)
	t.Logf("Start took %v", time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "kubeenv-test"
	env.CreateNamespace(t, ns)

	t.Run("NetworkPolicy", func(t *testing.T) {
		tcp := corev1.ProtocolTCP
		port := intstr.FromInt32(80)
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "allow-web"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		}
		got, err := env.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create NetworkPolicy: %v", err)
		}
		// Server-side defaulting: policyTypes defaults to [Ingress].
		if len(got.Spec.PolicyTypes) != 1 || got.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
			t.Errorf("policyTypes = %v, want [Ingress] (defaulted by the server)", got.Spec.PolicyTypes)
		}

		bad := np.DeepCopy()
		bad.Name = "bad-except"
		bad.Spec.Ingress[0].From[0].IPBlock = &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"192.168.0.0/24"}}
		_, err = env.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, bad, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Fatalf("creating a NetworkPolicy with except outside cidr: err = %v, want a validation (Invalid) error", err)
		}
		if !strings.Contains(err.Error(), "except") {
			t.Errorf("validation error does not mention except: %v", err)
		}
		t.Logf("rejected as expected: %v", err)
	})

	t.Run("WatchPods", func(t *testing.T) {
		w, err := env.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("watch pods: %v", err)
		}
		defer w.Stop()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.2"}}},
		}
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod: %v", err)
		}
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatal("watch closed")
				}
				if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added && p.Name == "web-0" {
					if p.Labels["app"] != "web" {
						t.Errorf("watched pod labels = %v", p.Labels)
					}
					return
				}
			case <-timeout:
				t.Fatal("no ADDED event for pod web-0")
			}
		}
	})

	t.Run("ServiceAccountWithoutRBAC", func(t *testing.T) {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ServiceAccount: %v", err)
		}

		// Through client-go: authenticated, but not authorized.
		cs, err := kubernetes.NewForConfig(env.ServiceAccountConfig(t, ns, "nobody"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("listing pods as a ServiceAccount with no RBAC: err = %v, want Forbidden", err)
		}

		// Through kubectl with the token kubeconfig.
		kc := env.ServiceAccountKubeconfig(t, ns, "nobody")
		who, err := env.Kubectl(t, "--kubeconfig="+kc, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if err != nil {
			t.Fatalf("kubectl auth whoami: %v", err)
		}
		if want := "system:serviceaccount:" + ns + ":nobody"; who != want {
			t.Errorf("whoami = %q, want %q", who, want)
		}
		out, err := env.Kubectl(t, "--kubeconfig="+kc, "get", "pods", "-n", ns)
		if err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Fatalf("kubectl get pods as nobody: out=%q err=%v, want Forbidden", out, err)
		}
		t.Logf("forbidden as expected: %v", err)
	})

	t.Run("Kubectl", func(t *testing.T) {
		out, err := env.Kubectl(t, "get", "networkpolicies", "-n", ns, "-o", "name")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != "networkpolicy.networking.k8s.io/allow-web" {
			t.Errorf("kubectl get networkpolicies = %q", out)
		}
		out, err = env.Kubectl(t, "version", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Client struct{ GitVersion string } `json:"clientVersion"`
			Server struct{ GitVersion string } `json:"serverVersion"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("kubectl version: %v\n%s", err, out)
		}
		if v.Server.GitVersion != "v1.37.2" || v.Client.GitVersion != "v1.37.2" {
			t.Errorf("kubectl version: client %q server %q, want v1.37.2", v.Client.GitVersion, v.Server.GitVersion)
		}
	})
}

func TestBinaryMissing(t *testing.T) {
	t.Setenv("NFTPOLICY_TOOLS", t.TempDir())
	if _, err := kubeenv.Binary("kube-apiserver"); err == nil || !strings.Contains(err.Error(), "hack/tools.sh") {
		t.Fatalf("Binary with an empty tools dir: err = %v, want one naming hack/tools.sh", err)
	}
}

// TestRestarts: the API server stopped refuses requests and serves the
// same data on its old address once started again; etcd restarted keeps
// its data; after CompactEtcd a read at an older resourceVersion is
// answered 410 Gone.
func TestRestarts(t *testing.T) {
	env := kubeenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "kubeenv-restarts"
	env.CreateNamespace(t, ns)
	cms := env.Client.CoreV1().ConfigMaps(ns)
	first, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	env.StopAPIServer()
	if _, err := cms.Get(ctx, "a", metav1.GetOptions{}); err == nil {
		t.Fatal("a read with the API server stopped succeeded")
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the API server's restart: %v", err)
	}

	if err := env.RestartEtcd(); err != nil {
		t.Fatal(err)
	}
	// The API server reconnects to etcd on its own; a few requests may fail first.
	var got *corev1.ConfigMap
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if got, err = cms.Get(ctx, "a", metav1.GetOptions{}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || got.ResourceVersion != first.ResourceVersion {
		t.Fatalf("after etcd's restart: %v (resourceVersion %v, want %s)", err, got, first.ResourceVersion)
	}

	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rev, err := env.CompactEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cms.List(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("a list at resourceVersion %s after compacting at %d: err = %v, want 410 Gone", first.ResourceVersion, rev, err)
	}
	t.Logf("compacted at revision %d; the old list: %v", rev, err)
}
