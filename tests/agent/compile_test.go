package agent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

// TestCompileMatchesAgentTable: `nftpolicy compile` of the cluster's
// objects, loaded with nft into a scratch network namespace, lists as the
// table a real agent with default flags installed on node-1 (the lab's
// flags that do not shape the ruleset aside; --uplink-interfaces as the
// lab gives it, the queue variant the agent probed). The agent installs
// xt-compat's queue rule over netlink, outside the nft script: those rules
// are left out of its listing, and counters are zeroed in both.
func TestCompileMatchesAgentTable(t *testing.T) {
	requireRoot(t)
	c := cluster.Start(t, cluster.Config{Nodes: []string{"node-1", "node-2"}, Prefix: "cmpcmd"})
	ctx := testContext(t, 3*time.Minute)
	createWebDBClients(t, ctx, c)
	if _, err := c.ApplyPolicy(ctx, makePolicy("x", "web", func(np *networkingv1.NetworkPolicy) {
		np.Spec.PodSelector = *selector("app", "web")
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selector("app", "client"), NamespaceSelector: selector("ns", "y")}},
			Ports: []networkingv1.NetworkPolicyPort{tcpPort(80)},
		}}
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	agentTable := c.ListTable("node-1")

	sc := clusterScenario(t, c)
	data, err := yaml.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := cluster.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	// The variant the agent probed, from its log.
	variant := string(compile.QueueNative)
	if log, err := os.ReadFile(c.Agent("node-1").LogPath); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(log), `"Queue rule variant chosen" logger="agent" variant="xt-compat"`) {
		variant = string(compile.QueueXTCompat)
	}
	args := []string{"compile", "--scenario", path, "--node", "node-1", "--queue-variant", variant, "--uplink-interfaces", "eth0,ext*"}
	for _, a := range c.NodeIPs("node-1") {
		args = append(args, "--node-ip", a.String())
	}
	script, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		t.Fatalf("nftpolicy %v: %v", args, err)
	}
	compiled := listScript(t, script)
	if diff := cmp.Diff(normalizeListing(agentTable), normalizeListing(compiled)); diff != "" {
		t.Errorf("compile's ruleset differs from the agent's table (-agent +compile):\n%s\nscenario:\n%s", diff, data)
	}
}

// clusterScenario is the scenario of the cluster's namespaces, nodes,
// pods and NetworkPolicies as the API server holds them.
func clusterScenario(t *testing.T, c *cluster.Cluster) *scenario.Scenario {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	sc := &scenario.Scenario{}
	nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Items {
		sc.Namespaces = append(sc.Namespaces, scenario.Namespace{Name: ns.Name, Labels: ns.Labels, Annotations: ns.Annotations})
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		sn := scenario.Node{Name: n.Name, Labels: n.Labels, PodCIDRs: n.Spec.PodCIDRs}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				sn.IPs = append(sn.IPs, a.Address)
			}
		}
		sc.Nodes = append(sc.Nodes, sn)
	}
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		sp := scenario.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Node: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}
		for _, ip := range p.Status.PodIPs {
			sp.IPs = append(sp.IPs, ip.IP)
		}
		for _, ctr := range p.Spec.Containers {
			for _, port := range ctr.Ports {
				sp.Ports = append(sp.Ports, scenario.Port{Name: port.Name, Port: port.ContainerPort, Protocol: string(port.Protocol)})
			}
		}
		sc.Pods = append(sc.Pods, sp)
	}
	nps, err := c.Client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range nps.Items {
		np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		np.ObjectMeta = metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name, Labels: np.Labels, Annotations: np.Annotations}
		sc.Policies = append(sc.Policies, np)
	}
	return sc
}

// listScript loads an nft script into a network namespace of its own and
// returns `nft list table inet nftpolicy` there.
func listScript(t *testing.T, script []byte) string {
	t.Helper()
	ns := "cmpcmd-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-")
	if len(ns) > 30 {
		ns = ns[:30]
	}
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	load := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	load.Stdin = strings.NewReader(string(script))
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("nft -f of compile's output: %v: %s", err, out)
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", compile.TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return string(out)
}

var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// normalizeListing makes two listings of one table comparable: nft lists
// chains, sets and maps in the order they were created and a hash set's
// elements in the kernel's order, which differ between the agent's
// transactions and one script; the agent writes the xt-compat queue rules
// over netlink, outside the script compile prints (nft lists them badly and
// warns about them).
// So: counters zeroed, those lines dropped, each set's elements sorted,
// the table's objects sorted.
func normalizeListing(s string) string {
	var blocks []string
	var cur []string
	for _, line := range strings.Split(counterRE.ReplaceAllString(s, "counter packets 0 bytes 0"), "\n") {
		switch {
		case strings.Contains(line, "xt target"), strings.HasPrefix(line, "# Warning"),
			// nft cannot print xt-compat's queue rule: libxtables' complaint
			// and the rest of the rule, on the next line.
			strings.Contains(line, "libxtables:"), strings.HasPrefix(strings.TrimSpace(line), "queue num "):
			continue
		case strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t") && strings.HasSuffix(line, "{"):
			cur = []string{line}
		case line == "\t}" && cur != nil:
			blocks = append(blocks, sortElements(strings.Join(append(cur, line), "\n")))
			cur = nil
		case cur != nil:
			cur = append(cur, line)
		default:
			blocks = append(blocks, line)
		}
	}
	slices.Sort(blocks)
	return strings.Join(blocks, "\n")
}

// sortElements sorts the elements of a set's or map's listing, one per
// line.
func sortElements(block string) string {
	i := strings.Index(block, "elements = { ")
	if i < 0 {
		return block
	}
	j := strings.Index(block[i:], " }\n")
	if j < 0 {
		return block
	}
	var els []string
	inQuote, start := false, i+len("elements = { ")
	body := block[start : i+j]
	from := 0
	for k, r := range body {
		switch {
		case r == '"':
			inQuote = !inQuote
		case r == ',' && !inQuote:
			els = append(els, strings.TrimSpace(body[from:k]))
			from = k + 1
		}
	}
	els = append(els, strings.TrimSpace(body[from:]))
	slices.Sort(els)
	return block[:i] + "elements = {\n" + strings.Join(els, "\n") + "\n}" + block[i+j+2:]
}
