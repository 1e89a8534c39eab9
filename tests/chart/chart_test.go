// Package chart checks the Helm chart charts/nftpolicy with the real helm
// binary (hack/helm.sh builds it): with default values it renders exactly
// the objects of install.yaml, each value lands where the agent reads it,
// values the agent would refuse fail the rendering, and `helm lint` is
// clean. The equality test is the guard that keeps the chart in step with
// install.yaml when either changes.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

const chartDir = "../../charts/nftpolicy"

// helmBin returns the helm that hack/helm.sh built (NFTPOLICY_HELM
// overrides), or stops the test as testenv decides.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NFTPOLICY_HELM"); p != "" {
		return p
	}
	out, err := exec.Command("bash", "../../hack/helm.sh", "--built").Output()
	if err != nil {
		err = errors.New("needs helm: bash hack/helm.sh (make helm) builds it")
	}
	testenv.Require(t, "chart tests", testenv.Err(err))
	return strings.TrimSpace(string(out))
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func render(t *testing.T, sets ...string) map[string]map[string]any {
	t.Helper()
	args := []string{"template", "nftpolicy", chartDir, "--namespace", "kube-system"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objects(t, out)
}

// objects parses a multi-document manifest into its objects, keyed by
// apiVersion, kind, namespace and name (helm orders them by kind, not as
// the file does).
func objects(t *testing.T, manifest string) map[string]map[string]any {
	t.Helper()
	res := map[string]map[string]any{}
	dec := yaml.NewDecoder(strings.NewReader(manifest))
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if err == io.EOF {
			return res
		}
		if err != nil {
			t.Fatalf("parsing the manifest: %v", err)
		}
		if obj == nil {
			continue
		}
		md, _ := obj["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v %v/%v", obj["apiVersion"], obj["kind"], md["namespace"], md["name"])
		if _, dup := res[key]; dup {
			t.Fatalf("%s appears twice", key)
		}
		res[key] = obj
	}
}

// TestReleaseChart: in a release directory (NFTPOLICY_RELEASE_DIR, which
// hack/release-check.sh sets), the chart archive with its default values
// and its CRDs renders exactly the objects of the release's install.yaml:
// the same image digest, the same ClusterNetworkPolicy CRD.
func TestReleaseChart(t *testing.T) {
	dir := os.Getenv("NFTPOLICY_RELEASE_DIR")
	if dir == "" {
		t.Skip("NFTPOLICY_RELEASE_DIR is not set: hack/release-check.sh runs this test on a release")
	}
	charts, err := filepath.Glob(filepath.Join(dir, "nftpolicy-*.tgz"))
	if err != nil || len(charts) != 1 {
		t.Fatalf("%s: want one chart archive, have %v (%v)", dir, charts, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "template", "nftpolicy", charts[0], "--include-crds", "--namespace", "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(objects(t, string(b)), objects(t, out)); d != "" {
		t.Errorf("%s differs from install.yaml (-install.yaml +chart):\n%s", charts[0], d)
	}
}

// TestChartDefaultsRenderInstallYAML: with default values, the chart
// renders install.yaml's objects, whose agent configuration the agent
// accepts.
func TestChartDefaultsRenderInstallYAML(t *testing.T) {
	b, err := os.ReadFile("../../install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := objects(t, string(b))
	got := render(t)
	if len(want) < 10 {
		t.Fatalf("install.yaml has %d objects; is it the manifest?", len(want))
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("helm template with default values differs from install.yaml (-install.yaml +chart):\n%s", d)
	}
	agentConfig(t, want)
}

// daemonSet returns the rendered agent container and pod spec.
func daemonSet(t *testing.T, objs map[string]map[string]any) (container, pod map[string]any) {
	t.Helper()
	ds := objs["apps/v1 DaemonSet kube-system/nftpolicy"]
	if ds == nil {
		t.Fatal("no DaemonSet kube-system/nftpolicy rendered")
	}
	pod = ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return pod["containers"].([]any)[0].(map[string]any), pod
}

// agentConfig returns the rendered ConfigMap's AgentConfiguration, decoded
// as the agent decodes it (strict) and validated.
func agentConfig(t *testing.T, objs map[string]map[string]any) *config.AgentConfiguration {
	t.Helper()
	cm := objs["v1 ConfigMap kube-system/nftpolicy-config"]
	if cm == nil {
		t.Fatal("no ConfigMap kube-system/nftpolicy-config rendered")
	}
	data, _ := cm["data"].(map[string]any)["config.yaml"].(string)
	c, err := config.Decode([]byte(data))
	if err != nil {
		t.Fatalf("the agent would refuse the rendered configuration: %v\n%s", err, data)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the agent would refuse the rendered configuration: %v\n%s", err, data)
	}
	return c
}

func TestChartValues(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	objs := render(t,
		"mode=queue", "failOpen=true", "image.repository=registry.example/np", "image.tag=v9.9.9",
		"image.digest="+digest, "image.pullPolicy=Always", "metrics.auth=none",
		"metrics.bindAddress=127.0.0.1:9402", "logVerbosity=4", "config.unknownPods.wait=3s", "extraArgs[0]=--unknown-pod-wait=2s",
		"resources.limits.memory=1Gi", "nodeSelector.pool=edge", "tolerations=null")
	c, pod := daemonSet(t, objs)
	want := []any{"agent", "--config=/etc/nftpolicy/config.yaml", "--unknown-pod-wait=2s",
		"--cni-bin-dir=/host/opt/cni/bin", "--cni-conf-dir=/host/etc/cni/net.d"}
	if d := cmp.Diff(want, c["args"]); d != "" {
		t.Errorf("args (-want +got):\n%s", d)
	}
	wantCfg := config.Default()
	wantCfg.Mode, wantCfg.FailOpen = "queue", true
	wantCfg.Metrics.BindAddress, wantCfg.Metrics.Auth = "127.0.0.1:9402", "none"
	wantCfg.HealthBindAddress, wantCfg.StateDir = ":9403", "/run/nftpolicy"
	wantCfg.PreviewSocket = "/run/nftpolicy-preview/preview.sock"
	wantCfg.Logging.Verbosity = 4
	wantCfg.UnknownPods.Wait.Duration = 3 * time.Second
	if d := cmp.Diff(wantCfg, agentConfig(t, objs)); d != "" {
		t.Errorf("the agent's configuration (-want +got):\n%s", d)
	}
	if got, want := c["image"], "registry.example/np:v9.9.9@"+digest; got != want {
		t.Errorf("image %v, want %s", got, want)
	}
	// The boot plugin's init container installs the agent's binary: the
	// same image.
	if inits, _ := pod["initContainers"].([]any); len(inits) != 1 ||
		inits[0].(map[string]any)["image"] != c["image"] || inits[0].(map[string]any)["imagePullPolicy"] != "Always" {
		t.Errorf("init containers %v: want cni-install in the agent's image %v, pulled Always", pod["initContainers"], c["image"])
	}
	if c["imagePullPolicy"] != "Always" {
		t.Errorf("imagePullPolicy %v, want Always", c["imagePullPolicy"])
	}
	limits := c["resources"].(map[string]any)["limits"].(map[string]any)
	if limits["memory"] != "1Gi" {
		t.Errorf("memory limit %v, want 1Gi", limits["memory"])
	}
	if d := cmp.Diff(map[string]any{"kubernetes.io/os": "linux", "pool": "edge"}, pod["nodeSelector"]); d != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", d)
	}
	if _, ok := pod["tolerations"]; ok {
		t.Errorf("tolerations %v rendered, want none", pod["tolerations"])
	}
}

// TestChartBootPluginValues: the boot plugin's host directories come from
// the values; disabled, nothing of it is rendered (no init container, no
// CNI flags, mounts or volumes), and the agent leaves the node's CNI
// configuration alone.
func TestChartBootPluginValues(t *testing.T) {
	_, pod := daemonSet(t, render(t, "bootPlugin.cniBinDir=/home/kubernetes/bin", "bootPlugin.cniConfDir=/etc/cni/custom"))
	paths := map[string]any{}
	for _, v := range pod["volumes"].([]any) {
		v := v.(map[string]any)
		if hp, ok := v["hostPath"].(map[string]any); ok {
			paths[v["name"].(string)] = hp["path"]
		}
	}
	if paths["cni-bin"] != "/home/kubernetes/bin" || paths["cni-conf"] != "/etc/cni/custom" {
		t.Errorf("hostPath volumes %v: want cni-bin /home/kubernetes/bin, cni-conf /etc/cni/custom", paths)
	}

	c, pod := daemonSet(t, render(t, "bootPlugin.enabled=false"))
	if _, ok := pod["initContainers"]; ok {
		t.Errorf("bootPlugin.enabled=false rendered init containers %v", pod["initContainers"])
	}
	for _, a := range c["args"].([]any) {
		if strings.HasPrefix(a.(string), "--cni-") {
			t.Errorf("bootPlugin.enabled=false rendered the agent flag %s", a)
		}
	}
	for _, m := range c["volumeMounts"].([]any) {
		if n := m.(map[string]any)["name"]; n == "cni-bin" || n == "cni-conf" {
			t.Errorf("bootPlugin.enabled=false rendered the mount %v", n)
		}
	}
	for _, v := range pod["volumes"].([]any) {
		if n := v.(map[string]any)["name"]; n == "cni-bin" || n == "cni-conf" {
			t.Errorf("bootPlugin.enabled=false rendered the volume %v", n)
		}
	}
}

// TestChartRefusesBadValues: values the agent refuses at start (it would
// crash-loop on every node) fail the rendering with the value's name.
func TestChartRefusesBadValues(t *testing.T) {
	for _, set := range []string{"mode=enforce", "metrics.auth=token", "image.digest=sha256:short", "image.digest=latest"} {
		_, err := helm(t, "template", "nftpolicy", chartDir, "--set", set)
		name, _, _ := strings.Cut(set, "=")
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("--set %s: error %v, want one naming %s", set, err, name)
		}
	}
}

func TestChartLint(t *testing.T) {
	out, err := helm(t, "lint", "--strict", chartDir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Fatalf("helm lint:\n%s", out)
	}
	abs, _ := filepath.Abs(chartDir)
	t.Logf("helm lint --strict %s:\n%s", abs, out)
}

// TestChartPublisher: publisher.enabled adds deploy/publisher.yaml's
// objects, with the chart's image, to install.yaml's; by default there
// are none of them (TestChartDefaultsRenderInstallYAML).
func TestChartPublisher(t *testing.T) {
	install, err := os.ReadFile("../../install.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile("../../deploy/publisher.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := objects(t, string(install)+"\n---\n"+string(pub))
	got := render(t, "publisher.enabled=true", "image.tag=v0.1.0")
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("helm template with publisher.enabled differs from install.yaml and deploy/publisher.yaml (-files +chart):\n%s", d)
	}
	got = render(t, "publisher.enabled=true", "image.tag=v9.9.9")
	dep := got["apps/v1 Deployment kube-system/nftpolicy-publisher"]
	if dep == nil {
		t.Fatal("no Deployment kube-system/nftpolicy-publisher rendered")
	}
	c := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if c["image"] != "ghcr.io/nftpolicy/nftpolicy:v9.9.9" {
		t.Errorf("publisher image %v, want the chart's", c["image"])
	}
}
