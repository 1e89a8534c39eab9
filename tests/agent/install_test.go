package agent_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestInstallManifest checks install.yaml against a real API server: every
// object passes server-side validation and admission (dry run), and the
// ClusterRole grants the agent exactly what it uses (read-only
// ClusterNetworkPolicies, asked with their CRD installed). No root needed.
func TestInstallManifest(t *testing.T) {
	env := cluster.StartControlPlane(t)
	manifest, err := cluster.InstallManifest()
	if err != nil {
		t.Fatal(err)
	}

	out, err := env.Kubectl(t, "apply", "--dry-run=server", "-f", manifest)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f install.yaml: %v\n%s", err, out)
	}
	t.Logf("kubectl apply --dry-run=server:\n%s", out)
	for _, obj := range []string{"serviceaccount/nftpolicy", "clusterrole.rbac.authorization.k8s.io/nftpolicy",
		"clusterrolebinding.rbac.authorization.k8s.io/nftpolicy", "daemonset.apps/nftpolicy"} {
		if !strings.Contains(out, obj+" created (server dry run)") {
			t.Errorf("kubectl output lacks %q", obj+" created (server dry run)")
		}
	}

	// The RBAC the agent runs with: apply it for real and ask the
	// authorizer what the ServiceAccount may do.
	docs, err := cluster.InstallDocuments("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition")
	if err != nil {
		t.Fatal(err)
	}
	rbac := filepath.Join(t.TempDir(), "rbac.yaml")
	if err := os.WriteFile(rbac, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "-f", rbac); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	// kubectl resolves resource names through discovery: without the CRD it
	// cannot even ask about clusternetworkpolicies.
	crd, err := cluster.CRDPath(t.Context(), "standard")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(t, "apply", "--server-side", "-f", crd); err != nil {
		t.Fatalf("kubectl apply -f %s: %v\n%s", crd, err, out)
	}
	for _, crd := range []string{cluster.ClusterPolicyCRD, nodeEnforcements} {
		if out, err := env.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+crd); err != nil {
			t.Fatalf("waiting for the CRD %s: %v\n%s", crd, err, out)
		}
	}
	const sa = "system:serviceaccount:kube-system:nftpolicy"
	const cnps = "clusternetworkpolicies.policy.networking.k8s.io"
	checks := []struct {
		verb, resource string
		want           bool
		subresource    string
	}{
		{"list", "pods", true, ""},
		{"watch", "pods", true, ""},
		{"list", "namespaces", true, ""},
		{"watch", "namespaces", true, ""},
		{"list", "networkpolicies.networking.k8s.io", true, ""},
		{"watch", "networkpolicies.networking.k8s.io", true, ""},
		{"list", "nodes", true, ""},
		{"watch", "nodes", true, ""},
		{"list", cnps, true, ""},
		{"watch", cnps, true, ""},
		{"create", "events", true, ""},
		{"patch", "events", true, ""},
		{"create", "tokenreviews.authentication.k8s.io", true, ""},
		{"create", "subjectaccessreviews.authorization.k8s.io", true, ""},
		{"create", nodeEnforcements, true, ""},
		{"patch", nodeEnforcements, true, ""},
		// Nothing it does not need.
		{"update", "pods", false, ""},
		{"delete", "networkpolicies.networking.k8s.io", false, ""},
		{"get", "nodes", false, ""},
		{"update", "nodes", false, ""},
		{"create", cnps, false, ""},
		{"update", cnps, false, ""},
		{"patch", cnps, false, ""},
		{"delete", cnps, false, ""},
		{"update", cnps, false, "status"},
		{"patch", cnps, false, "status"},
		{"update", "events", false, ""},
		{"delete", "events", false, ""},
		{"create", "events.events.k8s.io", false, ""},
		{"update", nodeEnforcements, false, ""},
		{"delete", nodeEnforcements, false, ""},
		{"list", nodeEnforcements, false, ""},
		{"get", "secrets", false, ""},
		{"list", "configmaps", false, ""},
	}
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"auth", "can-i", c.verb, c.resource, "--all-namespaces", "--as=" + sa}
			what := c.resource
			if c.subresource != "" {
				args = append(args, "--subresource="+c.subresource)
				what += "/" + c.subresource
			}
			out, err := env.Kubectl(t, args...)
			got := strings.TrimSpace(out) == "yes"
			if got != c.want || (err != nil && strings.TrimSpace(out) != "no") {
				t.Errorf("can %s %s %s: %q (err %v), want %v", sa, c.verb, what, out, err, c.want)
			}
		}()
	}
	wg.Wait()
}

// agentAccess is every API call the agent makes, as (API group, resource,
// verb), and where it makes it. install.yaml's ClusterRole must grant
// exactly these.
var agentAccess = []struct {
	group, resource string
	verbs           []string
	where           string
	// names are the only objects the agent reads, when it reads by name.
	names []string
}{
	{"", "pods", []string{"list", "watch"}, "pkg/podstore: the pod watch (and its list fallback); cmd/nftpolicy/agent_uninstall.go: the agent's own pod, by name", nil},
	{"", "namespaces", []string{"list", "watch"}, "pkg/controller: the namespace informer (namespaceSelector)", nil},
	{"", "nodes", []string{"list", "watch"}, "pkg/controller: the node informer (nodes peers, the agent's addresses)", nil},
	{"networking.k8s.io", "networkpolicies", []string{"list", "watch"}, "pkg/controller: the NetworkPolicy informer", nil},
	{"policy.networking.k8s.io", "clusternetworkpolicies", []string{"list", "watch"}, "pkg/controller/clusterpolicies.go: the ClusterNetworkPolicy informer", nil},
	{"discovery.k8s.io", "endpointslices", []string{"list", "watch"}, "cmd/nftpolicy/agent_fqdn.go: the --dns-service EndpointSlices", nil},
	// client-go's tools/record broadcaster (cmd/nftpolicy/agent.go, through
	// controller.EventSink): Create, and Patch when an Event recurs.
	{"", "events", []string{"create", "patch"}, "cmd/nftpolicy/agent.go: the event broadcaster (core/v1)", nil},
	{"authentication.k8s.io", "tokenreviews", []string{"create"}, "cmd/nftpolicy/agent_metricsauth.go: --metrics-auth=delegated", nil},
	{"authorization.k8s.io", "subjectaccessreviews", []string{"create"}, "cmd/nftpolicy/agent_metricsauth.go: --metrics-auth=delegated", nil},
	// status.Reporter's write: a merge patch, and a create when missing.
	{"nftpolicy.io", "nodeenforcements", []string{"create", "patch"}, "cmd/nftpolicy/agent_status.go: the node's NodeEnforcement (pkg/status)", nil},
	// PodAddressSlices, read instead of every Pod by the agent's slice
	// source (docs/scale-out.md, issue 48).
	{"nftpolicy.io", "podaddressslices", []string{"list", "watch"}, "the agent's PodAddressSlice source (pkg/podstore, docs/scale-out.md)", nil},
	// A list and watch with a field selector on metadata.name, which RBAC
	// authorizes against resourceNames.
	{"apps", "daemonsets", []string{"list", "watch"}, "cmd/nftpolicy/agent_uninstall.go: the agent's own DaemonSet (removal at uninstall)", []string{"nftpolicy"}},
}

// nodeEnforcements is the NodeEnforcement resource, as kubectl names it.
const nodeEnforcements = "nodeenforcements.nftpolicy.io"

// TestInstallClusterRoleIsLeastPrivilege parses install.yaml's ClusterRole
// and compares what it grants, rule by rule, with agentAccess: nothing
// missing, nothing more, no wildcard or non-resource URL, and resource
// names exactly where the agent reads by name. No API server needed.
func TestInstallClusterRoleIsLeastPrivilege(t *testing.T) {
	docs, err := cluster.InstallDocuments("ClusterRole")
	if err != nil {
		t.Fatal(err)
	}
	// The agent's ClusterRole; the other is the NodeEnforcement readers'.
	var role rbacv1.ClusterRole
	var names []string
	for _, doc := range docs {
		var r rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
			t.Fatal(err)
		}
		names = append(names, r.Name)
		if r.Name == "nftpolicy" {
			role = r
		}
	}
	if !slices.Equal(names, []string{"nftpolicy", "nftpolicy-status-reader"}) {
		t.Fatalf("install.yaml's ClusterRoles are %v, want nftpolicy (the agent's) and nftpolicy-status-reader", names)
	}
	key := func(group, resource, verb string) string {
		if group == "" {
			group = "core"
		}
		return group + "/" + resource + ":" + verb
	}
	granted := map[string]bool{}
	byName := map[string][]string{}
	for _, a := range agentAccess {
		byName[key(a.group, a.resource, "")] = a.names
	}
	for i, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %d: nonResourceURLs %v: the agent uses none", i, r.NonResourceURLs)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if want := byName[key(g, res, "")]; !slices.Equal(r.ResourceNames, want) {
					t.Errorf("rule %d: %s resourceNames %v, want %v", i, key(g, res, ""), r.ResourceNames, want)
				}
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" || strings.Contains(res, "/") {
						t.Errorf("rule %d grants %s: no wildcards or subresources", i, key(g, res, v))
					}
					granted[key(g, res, v)] = true
				}
			}
		}
	}
	needed := map[string]string{}
	for _, a := range agentAccess {
		for _, v := range a.verbs {
			needed[key(a.group, a.resource, v)] = a.where
		}
	}
	for k, where := range needed {
		if !granted[k] {
			t.Errorf("install.yaml's ClusterRole lacks %s, which the agent needs (%s)", k, where)
		}
	}
	var extra []string
	for k := range granted {
		if _, ok := needed[k]; !ok {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	for _, k := range extra {
		t.Errorf("install.yaml's ClusterRole grants %s, which the agent never uses", k)
	}
}
