// Package explain_test runs `nftpolicy explain` against a real
// kube-apiserver (tests/internal/kubeenv), directly and as the kubectl
// plugin `kubectl nftpolicy explain`.
package explain_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}

// createObjects makes namespaces x (default deny ingress, web open to
// team=frontend namespaces on TCP 80) and y, three pods with IPs in their
// status, and a node with an address.
func createObjects(ctx context.Context, t *testing.T, env *kubeenv.Env) {
	t.Helper()
	c := env.Client
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	env.CreateNamespace(t, "x")
	y := env.CreateNamespace(t, "y")
	y.Labels["team"] = "backend"
	must(c.CoreV1().Namespaces().Update(ctx, y, metav1.UpdateOptions{}))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	must(node, err)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.1"}}
	must(c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}))
	for _, p := range []struct{ ns, name, app, ip string }{
		{"x", "web", "web", "10.244.1.10"}, {"x", "db", "db", "10.244.1.11"}, {"y", "client", "client", "10.244.1.20"},
	} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/none",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		}
		pod, err := c.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
		must(pod, err)
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP, pod.Status.PodIPs = p.ip, []corev1.PodIP{{IP: p.ip}}
		must(c.CoreV1().Pods(p.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}))
	}
	port := intstr.FromInt32(80)
	tcp := corev1.ProtocolTCP
	for _, np := range []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "default-deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "allow-web"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "frontend"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			}},
	} {
		must(c.NetworkingV1().NetworkPolicies("x").Create(ctx, np, metav1.CreateOptions{}))
	}
}

type result struct {
	Allowed, Ingress, Egress bool
	Reason                   string
	NearestMiss              []struct {
		Direction, Rule, Condition, Detail string
		Change                             struct {
			Namespace string
			SetLabels map[string]string
		}
	}
}

func TestExplainLive(t *testing.T) {
	env := kubeenv.Start(t)
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createObjects(ctx, t, env)

	explain := func(t *testing.T, name string, args ...string) result {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		out, err := cmd.Output()
		stderr, code := "", 0
		if ee, ok := err.(*exec.ExitError); ok {
			stderr, code = string(ee.Stderr), ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		var r result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%s %v: exit %d: %s%s: %v", name, args, code, out, stderr, err)
		}
		// Exit 1 when denied (as kubectl auth can-i), 0 when allowed.
		if want := map[bool]int{true: 0, false: 1}[r.Allowed]; code != want {
			t.Fatalf("%s %v: allowed %v, exit %d, want %d; stderr: %s", name, args, r.Allowed, code, want, stderr)
		}
		return r
	}

	// y is not team=frontend: denied by x's policies; the nearest miss is
	// the namespace label, and applying it to the cluster allows.
	r := explain(t, bin, "explain", "--kubeconfig", env.AdminKubeconfig, "y/client", "x/web", "--port", "80", "-o", "json")
	if r.Allowed || r.Ingress || !strings.Contains(r.Reason, "x/allow-web, x/default-deny isolate x/web for ingress") {
		t.Fatalf("y/client -> x/web: %+v", r)
	}
	if len(r.NearestMiss) != 1 || r.NearestMiss[0].Condition != "namespaceLabel" || r.NearestMiss[0].Change.Namespace != "y" ||
		r.NearestMiss[0].Change.SetLabels["team"] != "frontend" {
		t.Fatalf("nearest misses %+v; want namespace y with team=frontend", r.NearestMiss)
	}
	ns, err := env.Client.CoreV1().Namespaces().Get(ctx, "y", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "frontend"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// As a kubectl plugin: kubectl finds kubectl-nftpolicy on PATH (make
	// build writes it next to the agent's binary), which runs explain with
	// nftpolicy from PATH.
	plugin, err := cluster.PluginBinary()
	if err != nil {
		t.Fatal(err)
	}
	pluginDir := t.TempDir()
	for name, target := range map[string]string{"kubectl-nftpolicy": plugin, "nftpolicy": bin} {
		if err := os.Symlink(target, filepath.Join(pluginDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("KUBECONFIG", env.AdminKubeconfig)
	text, err := exec.CommandContext(ctx, env.KubectlPath, "nftpolicy", "explain", "x/db", "x/web", "--port", "80").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(text), "DENIED") || !strings.Contains(string(text), "namespaceLabel") {
		t.Fatalf("kubectl nftpolicy explain (text): %v\n%s", err, text)
	}
	t.Logf("$ kubectl nftpolicy explain x/db x/web --port 80\n%s", text)
	r = explain(t, env.KubectlPath, "nftpolicy", "explain", "y/client", "x/web", "--port", "80", "-o", "json")
	if !r.Allowed || !strings.Contains(r.Reason, "allowed by x/allow-web ingress[0]") || len(r.NearestMiss) != 0 {
		t.Fatalf("after labelling y: %+v", r)
	}
	// A port miss, and the node as a source (its traffic to its pods is
	// never filtered).
	r = explain(t, env.KubectlPath, "nftpolicy", "explain", "y/client", "x/web", "--port", "81", "-o", "json")
	if r.Allowed || len(r.NearestMiss) != 1 || r.NearestMiss[0].Condition != "port" {
		t.Fatalf("port 81: %+v", r)
	}
	r = explain(t, env.KubectlPath, "nftpolicy", "explain", "node:node-1", "x/db", "--port", "5432", "-o", "json")
	if !r.Allowed {
		t.Fatalf("node -> x/db: %+v", r)
	}
}
