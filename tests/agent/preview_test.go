package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/conntrack"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// previewAnswer is the part of `nftpolicy preview -o json` the test reads.
type previewAnswer struct {
	Node  string `json:"node"`
	Cut   int    `json:"cut"`
	Allow int    `json:"allow"`
	Flows []struct {
		Change, Protocol, Source, Destination, Policy, Reason string
	} `json:"flows"`
}

// TestAgentPreviewListsWhatRevocationCuts: long-lived TCP and UDP flows
// and pings of both families from y/a (node-1) and y/b (node-2) to x/web
// (node-1), as in TestAgentRevokesDeniedFlows. `nftpolicy preview
// --local`, run in each node's namespace as kubectl runs it in the agent's
// pod, previews a policy that admits only y/b: node-1 lists y/a's six
// flows as cut by x/web, node-2 nothing, and nothing is applied (the flows
// go on). The
// plugin, through the real API server's pods/exec, reports the same, and
// refuses a user without pods/exec on every node. Then the policy is
// created through the API: the conntrack entries the agents' revocation
// deleted are exactly the ones the preview listed, and each node's
// revoked-flows counter grew by its preview's count.
func TestAgentPreviewListsWhatRevocationCuts(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t, 3*time.Minute)
	w := startWebFlows(t, ctx)
	c := w.c
	webIPs, aIPs := c.PodIPs("x/web"), c.PodIPs("y/a")
	if err := c.ServeExec(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	np := webKeepOnly()
	manifest, err := yaml.Marshal(np)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "x-web.yaml")
	if err := os.WriteFile(file, manifest, 0o600); err != nil {
		t.Fatal(err)
	}

	previewed := map[string][]string{}
	revokedBefore := map[string]float64{}
	for _, n := range cluster.DefaultNodes {
		a := c.Agent(n)
		out, errOut, err := a.Exec(ctx, manifest, "preview", "--local", "--socket", a.PreviewSocket, "-o", "json")
		if err != nil {
			t.Fatalf("%s: preview: %v: %s", n, err, errOut)
		}
		var answers []previewAnswer
		if err := json.Unmarshal(out, &answers); err != nil || len(answers) != 1 || answers[0].Node != n {
			t.Fatalf("%s: preview answered %s (%v)", n, out, err)
		}
		ans := answers[0]
		for _, f := range ans.Flows {
			// A ping is listed by its addresses alone.
			src, err := netip.ParseAddr(f.Source)
			if ap, perr := netip.ParseAddrPort(f.Source); perr == nil {
				src, err = ap.Addr(), nil
			}
			if f.Change != "cut" || f.Policy != "x/web" || err != nil || !slices.Contains(aIPs, src) {
				t.Errorf("%s: %+v: want y/a's flow cut by x/web", n, f)
			}
			previewed[n] = append(previewed[n], f.Protocol+" "+f.Source+" -> "+f.Destination)
		}
		if ans.Cut != len(ans.Flows) || ans.Allow != 0 {
			t.Errorf("%s: %d cut, %d allowed, %d listed", n, ans.Cut, ans.Allow, len(ans.Flows))
		}
		if revokedBefore[n], err = revokedFlows(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(previewed["node-1"]); n != 3*len(aIPs) {
		t.Errorf("node-1 previews %d cuts %v, want y/a's TCP and UDP flows and pings of both families", n, previewed["node-1"])
	}
	if len(previewed["node-2"]) != 0 {
		t.Errorf("node-2 previews %v, want nothing", previewed["node-2"])
	}
	for _, n := range cluster.DefaultNodes {
		a := c.Agent(n)
		out, errOut, err := a.Exec(ctx, manifest, "preview", "--local", "--socket", a.PreviewSocket)
		if err != nil {
			t.Fatalf("%s: preview: %v: %s", n, err, errOut)
		}
		t.Logf("nftpolicy preview --local -f x-web.yaml, on %s:\n%s", n, out)
	}

	// The plugin, through the API server's exec into each agent pod,
	// reports the same per node.
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "preview", "-f", file, "--kubeconfig", c.Env.AdminKubeconfig, "-o", "json").Output()
	if err != nil {
		t.Fatalf("kubectl nftpolicy preview: %v: %s%s", err, out, stderrOf(err))
	}
	var answers []previewAnswer
	if err := json.Unmarshal(out, &answers); err != nil || len(answers) != len(cluster.DefaultNodes) {
		t.Fatalf("kubectl nftpolicy preview answered %s (%v)", out, err)
	}
	for _, ans := range answers {
		var got []string
		for _, f := range ans.Flows {
			got = append(got, f.Protocol+" "+f.Source+" -> "+f.Destination)
		}
		if !slices.Equal(got, previewed[ans.Node]) {
			t.Errorf("%s: the plugin lists %v, preview --local %v", ans.Node, got, previewed[ans.Node])
		}
	}
	if out, err = exec.CommandContext(ctx, bin, "preview", "-f", file, "--kubeconfig", c.Env.AdminKubeconfig).Output(); err != nil {
		t.Fatalf("kubectl nftpolicy preview: %v: %s", err, stderrOf(err))
	}
	t.Logf("kubectl nftpolicy preview -f x-web.yaml:\n%s", out)
	// The cluster's authorization decides: a user who may list the agents'
	// pods but not exec into them is refused on every node.
	reader := readerKubeconfig(t, ctx, c)
	out, err = exec.CommandContext(ctx, bin, "preview", "-f", file, "--kubeconfig", reader).Output()
	if err == nil || strings.Count(string(out), "forbidden") != len(cluster.DefaultNodes) {
		t.Errorf("preview without pods/exec: %v, output:\n%s", err, out)
	} else {
		t.Logf("without pods/exec:\n%s", out)
	}

	// Nothing was applied: y/a still flows, and its entries are there.
	before := map[string][]string{}
	for _, n := range cluster.DefaultNodes {
		if before[n], err = webEntries(c, n, webIPs); err != nil {
			t.Fatal(err)
		}
		for _, k := range previewed[n] {
			if !slices.Contains(before[n], k) {
				t.Errorf("%s: previewed %s is not in conntrack %v", n, k, before[n])
			}
		}
	}
	for _, aIP := range aIPs {
		if last, _, _ := w.log("tcp", aIP).Snapshot(); time.Since(last) > time.Second {
			t.Errorf("y/a's TCP flow from %s stopped %v ago: the preview applied something", aIP, time.Since(last))
		}
		if _, last := w.pings[aIP].After(time.Time{}); time.Since(last) > time.Second {
			t.Errorf("y/a's ping from %s stopped %v ago: the preview applied something", aIP, time.Since(last))
		}
	}

	if _, err := c.ApplyPolicy(ctx, np); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for _, n := range cluster.DefaultNodes {
		after, err := webEntries(c, n, webIPs)
		if err != nil {
			t.Fatal(err)
		}
		var gone []string
		for _, k := range before[n] {
			if !slices.Contains(after, k) {
				gone = append(gone, k)
			}
		}
		sort.Strings(previewed[n])
		if !slices.Equal(gone, previewed[n]) {
			t.Errorf("%s: revocation removed %v, the preview listed %v (entries before %v, after %v)", n, gone, previewed[n], before[n], after)
		}
		revoked, err := revokedFlows(ctx, c.Agent(n))
		if err != nil {
			t.Fatal(err)
		}
		if got := revoked - revokedBefore[n]; got != float64(len(previewed[n])) {
			t.Errorf("%s: the agent revoked %v flows, the preview listed %d", n, got, len(previewed[n]))
		}
	}
}

// webEntries lists the node's conntrack entries to one of dsts, sorted,
// as preview names connections.
func webEntries(c *cluster.Cluster, node string, dsts []netip.Addr) ([]string, error) {
	var out []string
	err := c.Lab.InNode(node, func() error {
		t, err := conntrack.Dial(0)
		if err != nil {
			return err
		}
		defer t.Close()
		return t.Stream(0, func(f *ct.Flow) error {
			switch cn, ok := conntrack.Forwarded(f); {
			case !ok || !slices.Contains(dsts, cn.Dst):
			case !cn.HasPorts():
				out = append(out, fmt.Sprintf("%s %s -> %s", strings.ToUpper(cn.Proto.Name()), cn.Src, cn.Dst))
			default:
				out = append(out, fmt.Sprintf("%s %s -> %s", cn.Proto, netip.AddrPortFrom(cn.Src, f.TupleOrig.Proto.SourcePort), netip.AddrPortFrom(cn.Dst, cn.Port)))
			}
			return nil
		})
	})
	sort.Strings(out)
	return out, err
}

// readerKubeconfig is a kubeconfig of a ServiceAccount that may list pods
// in the agents' namespace and nothing else.
func readerKubeconfig(t *testing.T, ctx context.Context, c *cluster.Cluster) string {
	t.Helper()
	ns := "kube-system"
	rbac := c.Client.RbacV1()
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "reader", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c.Env.ServiceAccountKubeconfig(t, ns, "reader")
}

func stderrOf(err error) []byte {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.Stderr
	}
	return nil
}

// revokedFlows is the agent's nftpolicy_revoked_flows_total for x/web.
func revokedFlows(ctx context.Context, a *cluster.Agent) (float64, error) {
	m, err := a.Metrics(ctx)
	return m[`nftpolicy_revoked_flows_total{policy="x/web"}`], err
}
