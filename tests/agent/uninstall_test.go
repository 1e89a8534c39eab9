package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/status"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestUninstallRemovesTable: an agent whose DaemonSet is deleted removes
// its table (and with it the queue rules) at SIGTERM; one whose DaemonSet
// still exists (an update, a restart) keeps it, and so does one that cannot
// reach the API at SIGTERM (fail closed); `nftpolicy cleanup` removes the
// table an agent left, refuses while an agent listens on its queues, and is
// idempotent.
//
// The harness's agent pods get a DaemonSet as their controller, as the
// DaemonSet controller would make them. The uninstall is enacted in the
// order of `kubectl delete -f install.yaml` (the order of its documents):
// the ServiceAccount and the RBAC go before the DaemonSet, so that at
// SIGTERM the agent's token is refused and only the watch it opened at
// start can have told it of the deletion. Queue mode: the table holds the
// queue rules (xt-compat on this kernel) and the agents listen.
func TestUninstallRemovesTable(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{NoAgents: true, Mode: compile.ModeQueue})
	ctx := testContext(t, 3*time.Minute)
	ds := ownAgentPods(t, ctx, c)
	cni := map[string][]string{}
	for _, a := range c.Agents() {
		cni[a.Node] = installBootPlugin(t, ctx, a)
		a.ExtraArgs = append([]string{"--pod-name", cluster.AgentPodName(a.Node), "--pod-namespace", status.DefaultAgents.Namespace}, cni[a.Node]...)
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range c.Agents() {
		if err := a.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		waitLog(t, a, "Watching the agent's DaemonSet")
	}
	n1, n2 := c.Agents()[0], c.Agents()[1]
	checkBuildInfo(t, ctx, n2)

	// A running agent: cleanup refuses.
	if out, errOut, err := n1.Exec(ctx, nil, "cleanup"); exitCode(err) != 1 || !strings.Contains(string(errOut), "an nftpolicy agent runs on this node") {
		t.Errorf("cleanup under a running agent: exit %d, want 1 and a refusal\n%s%s", exitCode(err), out, errOut)
	}
	if has, err := c.HasTable(n1.Node); err != nil || !has {
		t.Fatalf("%s lost its table to a refused cleanup (%v, %v)", n1.Node, has, err)
	}

	// An update or a restart: the DaemonSet is there, the table stays.
	if err := n1.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if has, err := c.HasTable(n1.Node); err != nil || !has {
		t.Fatalf("%s has no table after a SIGTERM with its DaemonSet in place (%v, %v):\n%s", n1.Node, has, err, n1.LogTail(20))
	}
	logLines(t, n1, "Keeping the nftables table")
	assertBootPlugin(t, n1, cni[n1.Node], true)

	// The node whose agent is gone: cleanup removes what it left.
	out, errOut, err := n1.Exec(ctx, nil, append([]string{"cleanup", "--state-dir", n1.StateDir()}, cni[n1.Node]...)...)
	if err != nil || !strings.Contains(string(out), "removed table inet nftpolicy") {
		t.Errorf("cleanup: %v\n%s%s", err, out, errOut)
	}
	assertNothingInstalled(t, c, n1)
	assertBootPlugin(t, n1, cni[n1.Node], false)
	if out, errOut, err := n1.Exec(ctx, nil, append([]string{"cni-install"}, cni[n1.Node]...)...); err != nil {
		t.Fatalf("cni-install: %v\n%s%s", err, out, errOut)
	}
	if out, errOut, err := n1.Exec(ctx, nil, "cleanup"); err != nil || !strings.Contains(string(out), "nothing to remove") {
		t.Errorf("cleanup again: %v, want success and nothing to remove\n%s%s", err, out, errOut)
	}

	// node-1's agent again, cut off from the API before the uninstall: it
	// cannot tell an uninstall from an update and must keep its table.
	if err := n1.Start(); err != nil {
		t.Fatal(err)
	}
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitLogCount(t, n1, "Watching the agent's DaemonSet", 2)
	n1.HoldAPI()

	// The network plugin rewrites its configuration list (flannel's and
	// Calico's installers do at every start): node-2's agent chains the
	// boot plugin again.
	if err := os.WriteFile(filepath.Join(cni[n2.Node][3], "10-lab.conflist"), []byte(primaryConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	waitRechained(t, n2, cni[n2.Node][3])

	// kubectl delete -f install.yaml: ServiceAccount and RBAC first, the
	// DaemonSet last.
	for _, kind := range []string{"serviceaccount/nftpolicy", "clusterrolebinding/nftpolicy", "clusterrole/nftpolicy"} {
		if out, err := c.Env.Kubectl(t, "delete", "-n", status.DefaultAgents.Namespace, kind); err != nil {
			t.Fatalf("kubectl delete %s: %v\n%s", kind, err, out)
		}
	}
	if err := c.Client.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The garbage collector deletes the pods (SIGTERM) once the DaemonSet
	// is gone; this API server has none: the test sends it.
	time.Sleep(500 * time.Millisecond)
	if err := n2.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	assertNothingInstalled(t, c, n2)
	logLines(t, n2, "Cannot read the agent's DaemonSet", "removed the nftables table")
	assertBootPlugin(t, n2, cni[n2.Node], false)

	// Fail closed: the agent that could not see the deletion keeps its
	// table (protection is never removed on a guess).
	if err := n1.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if has, err := c.HasTable(n1.Node); err != nil || !has {
		t.Errorf("%s removed its table without hearing from the API (%v, %v):\n%s", n1.Node, has, err, n1.LogTail(20))
	}
	logLines(t, n1, "Keeping the nftables table")
	assertBootPlugin(t, n1, cni[n1.Node], true)
}

// primaryConflist is a node's CNI configuration before the boot plugin.
const primaryConflist = `{"cniVersion":"1.0.0","name":"lab","plugins":[{"type":"ptp","ipam":{"type":"host-local"}}]}`

// installBootPlugin gives the agent's node CNI directories of its own with
// a primary plugin's configuration, runs `nftpolicy cni-install` into them
// (install.yaml's init container), and returns the agent's flags that name
// them.
func installBootPlugin(t *testing.T, ctx context.Context, a *cluster.Agent) []string {
	t.Helper()
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	for _, d := range []string{bin, conf} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "10-lab.conflist"), []byte(primaryConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--cni-bin-dir", bin, "--cni-conf-dir", conf}
	if out, errOut, err := a.Exec(ctx, nil, append([]string{"cni-install"}, flags...)...); err != nil {
		t.Fatalf("cni-install: %v\n%s%s", err, out, errOut)
	}
	assertBootPlugin(t, a, flags, true)
	return flags
}

// waitRechained waits up to 15 s (the agent checks every 10 s) for the
// boot plugin to be back in the configuration list of conf.
func waitRechained(t *testing.T, a *cluster.Agent, conf string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(conf, "10-lab.conflist"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), bootcni.PluginName) {
			logLines(t, a, "chained it again")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the boot plugin was not chained again after the list was rewritten:\n%s\n%s", a.Node, b, a.LogTail(10))
		}
	}
}

// assertBootPlugin checks whether the boot plugin is installed in the CNI
// directories flags name: configured and its executable there, or neither.
func assertBootPlugin(t *testing.T, a *cluster.Agent, flags []string, want bool) {
	t.Helper()
	bin, conf := flags[1], flags[3]
	b, err := os.ReadFile(filepath.Join(conf, "10-lab.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat(filepath.Join(bin, bootcni.PluginName))
	configured, present := strings.Contains(string(b), bootcni.PluginName), statErr == nil
	if configured != want || present != want {
		t.Errorf("%s: boot plugin configured %v, executable present %v; want %v\n%s\n%s", a.Node, configured, present, want, b, a.LogTail(10))
	}
}

// waitLogCount waits up to 30 s for the agent's log to contain s n times.
func waitLogCount(t *testing.T, a *cluster.Agent, s string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(a.LogPath)
		if err == nil && strings.Count(string(b), s) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s did not log %q %d times:\n%s", a.Node, s, n, a.LogTail(30))
		}
	}
}

// logLines logs the agent's log lines that contain one of subs; the first
// sub must be there.
func logLines(t *testing.T, a *cluster.Agent, subs ...string) {
	t.Helper()
	b, err := os.ReadFile(a.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		for i, s := range subs {
			if strings.Contains(line, s) {
				t.Logf("%s: %s", a.Node, line)
				found = found || i == len(subs)-1
			}
		}
	}
	if !found {
		t.Errorf("the agent of %s never logged %q", a.Node, subs[len(subs)-1])
	}
}

// TestUninstallForegroundDeletion: `kubectl delete ds --cascade=foreground`
// deletes the pods while the DaemonSet still exists, marked for deletion
// (this API server has no garbage collector: it stays marked): its agent
// removes the table at SIGTERM, on the API's word at that moment.
func TestUninstallForegroundDeletion(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{NoAgents: true, Nodes: []string{"node-1"}})
	ctx := testContext(t, 2*time.Minute)
	ds := ownAgentPods(t, ctx, c)
	a := c.Agent("node-1")
	a.ExtraArgs = []string{"--pod-name", cluster.AgentPodName(a.Node), "--pod-namespace", status.DefaultAgents.Namespace}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitLog(t, a, "Watching the agent's DaemonSet")
	fg := metav1.DeletePropagationForeground
	if err := c.Client.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Client.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("the DaemonSet after a foreground deletion: %v, %v; want it there, marked for deletion", got, err)
	}
	if err := a.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	assertNothingInstalled(t, c, a)
	logLines(t, a, "is being deleted")
}

// ownAgentPods creates the DaemonSet kube-system/nftpolicy and makes it the
// controller of the harness's agent pods.
func ownAgentPods(t *testing.T, ctx context.Context, c *cluster.Cluster) *appsv1.DaemonSet {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": "nftpolicy"}
	ds, err := c.Client.AppsV1().DaemonSets(status.DefaultAgents.Namespace).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "nftpolicy", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "nftpolicy", Image: "nftpolicy:harness"}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := *metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))
	for _, a := range c.Agents() {
		pods := c.Client.CoreV1().Pods(status.DefaultAgents.Namespace)
		p, err := pods.Get(ctx, cluster.AgentPodName(a.Node), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.OwnerReferences = []metav1.OwnerReference{ref}
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ds
}

// assertNothingInstalled checks that the node's kernel holds no nftpolicy
// table and no queue rule, and that its state directory holds no snapshot.
func assertNothingInstalled(t *testing.T, c *cluster.Cluster, a *cluster.Agent) {
	t.Helper()
	if has, err := c.HasTable(a.Node); err != nil || has {
		t.Errorf("%s still has table inet nftpolicy (%v, %v):\n%s", a.Node, has, err, a.LogTail(20))
	}
	out, err := c.Lab.NodeExec(a.Node, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset on %s: %v\n%s", a.Node, err, out)
	}
	for _, word := range []string{"nftpolicy", "queue", "NFQUEUE"} {
		if strings.Contains(string(out), word) {
			t.Errorf("%s's ruleset still mentions %q:\n%s", a.Node, word, out)
		}
	}
	entries, err := os.ReadDir(a.StateDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s's state directory still holds %s", a.Node, e.Name())
	}
}

// waitLog waits up to 30 s for the agent's log to contain s.
func waitLog(t *testing.T, a *cluster.Agent, s string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(a.LogPath)
		if err == nil && strings.Contains(string(b), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s never logged %q:\n%s", a.Node, s, a.LogTail(30))
		}
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestCleanupManifest: deploy/cleanup.yaml passes the real API server's
// validation and admission (dry run), and runs install.yaml's image.
func TestCleanupManifest(t *testing.T) {
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "deploy", "cleanup.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := cluster.InstallDocuments("DaemonSet")
	if err != nil || len(docs) != 1 {
		t.Fatalf("install.yaml's DaemonSet: %d documents, %v", len(docs), err)
	}
	var agent, clean appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &agent); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &clean); err != nil {
		t.Fatal(err)
	}
	init := clean.Spec.Template.Spec.InitContainers
	if len(init) != 1 || init[0].Image != agent.Spec.Template.Spec.Containers[0].Image || init[0].Args[0] != "cleanup" {
		t.Errorf("deploy/cleanup.yaml's init containers %+v: want one running `cleanup` in install.yaml's image %s", init, agent.Spec.Template.Spec.Containers[0].Image)
	}
	env := cluster.StartControlPlane(t)
	out, err := env.Kubectl(t, "apply", "--dry-run=server", "-f", path)
	if err != nil || !strings.Contains(out, "daemonset.apps/nftpolicy-cleanup created (server dry run)") {
		t.Fatalf("kubectl apply --dry-run=server -f deploy/cleanup.yaml: %v\n%s", err, out)
	}
}

// checkBuildInfo: the running agent logged its version at start and
// exports it as nftpolicy_build_info, the same as `nftpolicy version -o
// json` of its binary says.
func checkBuildInfo(t *testing.T, ctx context.Context, a *cluster.Agent) {
	t.Helper()
	out, errOut, err := a.Exec(ctx, nil, "version", "-o", "json")
	if err != nil {
		t.Fatalf("nftpolicy version -o json: %v\n%s", err, errOut)
	}
	var v struct{ Version, Commit, GoVersion string }
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" || v.Commit == "" || v.GoVersion == "" {
		t.Fatalf("nftpolicy version -o json: %+v, %v\n%s", v, err, out)
	}
	m, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("nftpolicy_build_info{commit=%q,goversion=%q,version=%q}", v.Commit, v.GoVersion, v.Version)
	if m[key] != 1 {
		t.Errorf("the agent exports no %s = 1", key)
	}
	b, err := os.ReadFile(a.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("version=%q commit=%q goVersion=%q", v.Version, v.Commit, v.GoVersion)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"Starting nftpolicy agent"`) && strings.Contains(line, want) {
			return
		}
	}
	t.Errorf("the agent's log has no \"Starting nftpolicy agent\" line with %s", want)
}
