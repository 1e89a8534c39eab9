package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestInstallAgentWritesOnlyItsNodeEnforcement: with install.yaml's
// admission policy, the agent's ServiceAccount token bound to its pod on
// node-1 may create and patch node-1's NodeEnforcement, and neither
// create nor patch node-2's; a token of the ServiceAccount bound to no pod
// writes none. No root needed.
func TestInstallAgentWritesOnlyItsNodeEnforcement(t *testing.T) {
	env := cluster.StartControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	docs, err := cluster.InstallDocuments("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+nodeEnforcements); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, n := range []string{"node-1", "node-2"} {
		if _, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := env.Client.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nftpolicy-node-1"},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "nftpolicy",
			Containers: []corev1.Container{{Name: "nftpolicy", Image: "nftpolicy:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(600)
	tr, err := env.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "nftpolicy", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := env.RESTConfig()
	cfg.TLSClientConfig = rest.TLSClientConfig{CAData: cfg.TLSClientConfig.CAData}
	cfg.BearerToken = tr.Status.Token
	agent := dynamic.NewForConfigOrDie(cfg).Resource(status.GVR)
	admin := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(status.GVR)
	ne := func(node string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": status.Group + "/" + status.Version, "kind": status.Kind,
			"metadata": map[string]any{"name": node}, "status": map[string]any{"problemsOmitted": int64(0)}}}
	}
	if _, err := admin.Create(ctx, ne("node-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"status":{"problemsOmitted":1}}`)
	// The policy takes effect once the API server's admission has seen
	// it: retry the first denial for a while.
	var createErr error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if _, createErr = agent.Create(ctx, ne("node-3"), metav1.CreateOptions{}); apierrors.IsForbidden(createErr) && strings.Contains(createErr.Error(), "own node") {
			break
		}
		_ = admin.Delete(ctx, "node-3", metav1.DeleteOptions{})
	}
	if !apierrors.IsForbidden(createErr) || !strings.Contains(createErr.Error(), "may write only its own node's NodeEnforcement") {
		t.Fatalf("node-1's agent creating node-3's NodeEnforcement: %v, want Forbidden by the admission policy", createErr)
	}
	t.Logf("denied: %v", createErr)
	if _, err := agent.Patch(ctx, "node-2", types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-1's agent patching node-2's NodeEnforcement: %v, want Forbidden", err)
	}
	if _, err := agent.Create(ctx, ne("node-1"), metav1.CreateOptions{}); err != nil {
		t.Errorf("node-1's agent creating its own NodeEnforcement: %v", err)
	}
	if _, err := agent.Patch(ctx, "node-1", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("node-1's agent patching its own NodeEnforcement: %v", err)
	}

	// A token of the same ServiceAccount bound to no pod (TokenRequest
	// without boundObjectRef) names no node: it writes no NodeEnforcement
	// (issue 43, item 8).
	unbound, err := env.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "nftpolicy", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ucfg := rest.CopyConfig(cfg)
	ucfg.BearerToken = unbound.Status.Token
	free := dynamic.NewForConfigOrDie(ucfg).Resource(status.GVR)
	if _, err := free.Create(ctx, ne("node-4"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "names no node") {
		t.Errorf("a token of the agent's ServiceAccount bound to no pod creating node-4's NodeEnforcement: %v, want Forbidden (names no node)", err)
	} else {
		t.Logf("denied: %v", err)
	}
	for _, n := range []string{"node-1", "node-2"} {
		if _, err := free.Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("a token of the agent's ServiceAccount bound to no pod patching %s's NodeEnforcement: %v, want Forbidden", n, err)
		}
	}
}
