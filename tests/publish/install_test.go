package publish

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/nftpolicy/nftpolicy/pkg/podslice"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
)

// TestInstallCRDIsPodsliceCRD: install.yaml (and so the chart) carries
// exactly pkg/podslice's CustomResourceDefinition, which the publisher
// and the agents are built against.
func TestInstallCRDIsPodsliceCRD(t *testing.T) {
	docs, err := cluster.InstallDocuments("CustomResourceDefinition")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(podslice.CRD)
	found := 0
	for _, d := range docs {
		var body []string
		for _, line := range strings.Split(d, "\n") {
			if len(body) == 0 && strings.HasPrefix(line, "#") {
				continue // the comment before the document
			}
			body = append(body, line)
		}
		doc := strings.TrimSpace(strings.Join(body, "\n"))
		if !strings.Contains(doc, "name: podaddressslices.nftpolicy.io") {
			continue
		}
		found++
		if doc != want {
			t.Errorf("install.yaml's PodAddressSlice CRD is not pkg/podslice/crd.yaml:\n%s", doc)
		}
	}
	if found != 1 {
		t.Errorf("install.yaml has %d PodAddressSlice CRDs, want 1", found)
	}
}

// applyManifests applies install.yaml's documents of the kinds and every
// object of deploy/publisher.yaml but its Deployment and budget, which
// are only validated (a server-side dry run).
func applyManifests(t *testing.T, env *kubeenv.Env, kinds ...string) {
	t.Helper()
	docs, err := cluster.InstallDocuments(kinds...)
	if err != nil {
		t.Fatal(err)
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(filepath.Join(root, "deploy", "publisher.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range strings.Split(string(pub), "\n---\n") {
		if !strings.Contains(d, "\nkind: Deployment\n") && !strings.Contains(d, "\nkind: PodDisruptionBudget\n") {
			docs = append(docs, d+"\n")
		}
	}
	path := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/podaddressslices.nftpolicy.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The Deployment and its budget, as the API server validates them
	// (there are no nodes to run them).
	if out, err := env.Kubectl(t, "apply", "--dry-run=server", "-f", filepath.Join(root, "deploy", "publisher.yaml")); err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f deploy/publisher.yaml: %v\n%s", err, out)
	}
}

// TestInstallOnlyThePublisherWritesSlices: with install.yaml's admission
// policy and deploy/publisher.yaml's RBAC, the publisher (as its
// ServiceAccount) publishes; a namespace user whom RBAC lets write slices
// is refused (a slice of its own would claim any address for any labels),
// and so is a cluster admin; the agents' ServiceAccount reads slices and
// the publisher's Lease, and writes no slice.
func TestInstallOnlyThePublisherWritesSlices(t *testing.T) {
	env := kubeenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	applyManifests(t, env, "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
	env.CreateNamespace(t, "a")
	makePod(t, env, "a", "web-1", "10.1.0.1", map[string]string{"app": "web"}, false)

	// A namespace user whose Role lets it write slices in its namespace.
	if _, err := env.Client.RbacV1().Roles("a").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "slice-writer"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{podslice.Group}, Resources: []string{podslice.Resource},
			Verbs: []string{"get", "list", "create", "update", "delete"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings("a").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "slice-writer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "slice-writer"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default", Namespace: "a"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := dynamic.NewForConfigOrDie(env.ServiceAccountConfig(t, "a", "default")).Resource(podslice.GVR).Namespace("a")
	admin := dynamic.NewForConfigOrDie(env.RESTConfig()).Resource(podslice.GVR).Namespace("a")
	claim := sliceObject("a", "claim", map[string]string{podslice.ManagedByLabel: podslice.Publisher},
		map[string]any{"role": "db-admin"}, entry("fake", "10.1.0.1"))
	// The policy takes effect once the API server's admission has seen
	// it: retry while the user's write goes through.
	var err error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if _, err = user.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			break
		}
		_ = admin.Delete(ctx, "claim", metav1.DeleteOptions{})
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the nftpolicy publisher") {
		t.Fatalf("a namespace user creating a slice: %v, want Forbidden by the admission policy", err)
	}
	t.Logf("denied: %v", err)
	if _, err := admin.Create(ctx, claim, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a cluster admin creating a slice: %v, want Forbidden", err)
	}

	pubCfg := env.ServiceAccountConfig(t, "kube-system", "nftpolicy-publisher")
	startPublisherAs(t, pubCfg, testConfig("publisher-0"))
	waitPublished(t, env, "the publisher as its ServiceAccount")
	list, err := admin.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("listing slices: %v (%d)", err, len(list.Items))
	}
	own := list.Items[0]
	if _, err := user.Update(ctx, &own, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a namespace user updating the publisher's slice: %v, want Forbidden", err)
	}
	if err := user.Delete(ctx, own.GetName(), metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a namespace user deleting the publisher's slice: %v, want Forbidden", err)
	}

	agentCfg := env.ServiceAccountConfig(t, "kube-system", "nftpolicy")
	agent := dynamic.NewForConfigOrDie(agentCfg).Resource(podslice.GVR)
	if _, err := agent.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent listing slices: %v", err)
	}
	if _, err := agent.Namespace("a").Create(ctx, claim, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent creating a slice: %v, want Forbidden", err)
	}
	agentClient := kubernetes.NewForConfigOrDie(agentCfg)
	// The publisher (its Role) writes the synced Lease once its slices are
	// written; the agents' Role reads it.
	var lerr error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, lerr = agentClient.CoordinationV1().Leases("kube-system").Get(ctx, "nftpolicy-publisher-synced", metav1.GetOptions{}); lerr == nil {
			break
		}
	}
	if lerr != nil {
		t.Errorf("the agent reading the publisher's synced Lease: %v", lerr)
	}
	if _, err := agentClient.CoordinationV1().Leases("kube-system").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=nftpolicy-publisher-synced"}); err != nil {
		t.Errorf("the agent watching the publisher's synced Lease: %v", err)
	}
}
