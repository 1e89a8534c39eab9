package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/kubeenv"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

// DefaultNodes are the nodes of a cluster unless Config.Nodes says otherwise.
var DefaultNodes = []string{"node-1", "node-2"}

// BinEnv names the agent binary to run; when unset, Start builds one.
const BinEnv = "NFTPOLICY_BIN"

// Config configures Start.
type Config struct {
	// Enforcer run as every node's agent; empty means EnforcerNftpolicy.
	// EnforcerKNP ignores Mode and Verbosity.
	Enforcer Enforcer
	// Mode of every agent; empty means hybrid.
	Mode compile.Mode
	// Nodes to create; empty means DefaultNodes.
	Nodes []string
	// NodeIPs gives nodes underlay addresses of their own (at most one per
	// family, see netlab.NodeWithIPs); a node or family without one gets
	// the lab's default. The Node objects carry the same addresses.
	NodeIPs map[string][]netip.Addr
	// AgentArgs are extra `nftpolicy agent` flags (a flag given twice
	// takes its last value).
	AgentArgs []string
	// NoAgents leaves the agents stopped; start them with Agent(n).Start.
	NoAgents bool
	// Verbosity is the agents' --v (default 2: one line per sync).
	Verbosity int
	// Prefix of the lab's namespaces; empty means a random "npc-xxxxxx".
	Prefix string
	// Logf, when set, receives the harness' progress lines (default t.Logf).
	Logf func(format string, args ...any)
	// APIServerArgs are extra kube-apiserver flags (a flag given twice
	// takes its last value).
	APIServerArgs []string
}

// Cluster is a running control plane, lab and agents. Its methods are safe
// for concurrent use. tests/internal/lab.Lab is the API-less counterpart for
// generated scenarios (see there why there are two).
type Cluster struct {
	// Env is the control plane; Client an admin client of it.
	Env    *kubeenv.Env
	Client kubernetes.Interface
	// Lab holds the node and pod namespaces.
	Lab *netlab.Lab

	cfg     Config
	t       testing.TB
	bin     string
	nodes   []string
	nodeIPs map[string][]netip.Addr
	agents  map[string]*Agent
	logDir  string

	mu     sync.Mutex
	pods   map[string]*labPod // by namespace/name
	nextIP map[string]int     // per node
	nextID int

	policyClient npaclient.Interface // guarded by mu; see PolicyClient
}

// labPod is the netlab side of an API pod.
type labPod struct {
	key, labName, node string
	ips                []netip.Addr
	tcp, udp           []uint16
}

// Start brings up the control plane, applies install.yaml's ServiceAccount
// and RBAC, creates the nodes (namespaces and Node objects) and starts one
// agent per node (unless cfg.NoAgents). Everything is torn down by
// t.Cleanup: agents (SIGTERM, then SIGKILL), relays, lab, control plane. On
// failure the tail of every agent log is printed.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	testenv.Require(t, "cluster", testenv.Root("create network namespaces and run agents that program nftables and NFQUEUE"),
		testenv.Binaries("ip", "nft"), kubeenv.Tools())
	if cfg.Mode == "" {
		cfg.Mode = compile.ModeHybrid
	}
	agentBinary := AgentBinary
	switch cfg.Enforcer {
	case "":
		cfg.Enforcer = EnforcerNftpolicy
	case EnforcerNftpolicy:
	case EnforcerKNP:
		RequireKNP(t)
		agentBinary = KNPBinary
	default:
		t.Fatalf("cluster: unknown enforcer %q (known: %s, %s)", cfg.Enforcer, EnforcerNftpolicy, EnforcerKNP)
	}
	if len(cfg.Nodes) == 0 {
		cfg.Nodes = DefaultNodes
	}
	if cfg.Verbosity == 0 {
		cfg.Verbosity = 2
	}
	if cfg.Prefix == "" {
		cfg.Prefix = netlab.RandomPrefix("npc")
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	began := time.Now()
	env := StartControlPlane(t, kubeenv.WithAPIServerArgs(cfg.APIServerArgs...)) // skips first when the tools are missing
	bin, err := agentBinary()
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	c := &Cluster{
		Env: env, Client: env.Client, cfg: cfg, t: t, bin: bin,
		nodes: append([]string(nil), cfg.Nodes...), nodeIPs: map[string][]netip.Addr{},
		agents: map[string]*Agent{}, logDir: t.TempDir(),
		pods: map[string]*labPod{}, nextIP: map[string]int{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.applyInstallRBAC(); err != nil {
		t.Fatalf("cluster: %v", err)
	}

	var specs []netlab.NodeSpec
	for _, n := range c.nodes {
		specs = append(specs, netlab.NodeWithIPs(n, cfg.NodeIPs[n]))
	}
	c.Lab, err = netlab.New(netlab.Config{Prefix: cfg.Prefix, Nodes: specs})
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Lab.Close(); err != nil {
			t.Errorf("cluster: closing the lab: %v", err)
		}
	})
	for _, n := range c.nodes {
		ips, err := c.Lab.IPs(netlab.Node(n))
		if err != nil {
			t.Fatalf("cluster: %v", err)
		}
		c.nodeIPs[n] = ips
		if err := c.createNode(ctx, n, ips); err != nil {
			t.Fatalf("cluster: %v", err)
		}
	}

	token := env.ServiceAccountToken(t, "kube-system", "nftpolicy")
	// Registered after the lab's cleanup, so it runs first: agents stop
	// while their namespaces and the API server still exist.
	t.Cleanup(func() {
		c.stopAgents()
		if t.Failed() {
			c.logTails(t, 60)
		}
	})
	for _, n := range c.nodes {
		a, err := c.newAgent(n, token)
		if err != nil {
			t.Fatalf("cluster: %v", err)
		}
		c.agents[n] = a
	}
	// The agent pods stand for nftpolicy's DaemonSet (status, readiness);
	// the peer has none.
	if cfg.Enforcer == EnforcerNftpolicy {
		for _, n := range c.nodes {
			if err := c.createAgentPod(ctx, n); err != nil {
				t.Fatalf("cluster: %v", err)
			}
		}
		probeCtx, stopProbes := context.WithCancel(context.Background())
		probesDone := make(chan struct{})
		go func() { defer close(probesDone); c.probeAgentPods(probeCtx) }()
		t.Cleanup(func() { stopProbes(); <-probesDone })
	}
	if !cfg.NoAgents {
		for _, n := range c.nodes {
			if err := c.agents[n].Start(); err != nil {
				t.Fatalf("cluster: %v", err)
			}
		}
		for _, n := range c.nodes {
			if err := c.agents[n].WaitReady(ctx); err != nil {
				t.Fatalf("cluster: %v", err)
			}
		}
	}
	agents := fmt.Sprintf("%s agents ready", cfg.Mode)
	if cfg.Enforcer != EnforcerNftpolicy {
		agents = fmt.Sprintf("%s agents ready", cfg.Enforcer)
	}
	if cfg.NoAgents {
		agents = "agents not started"
	}
	cfg.Logf("cluster: %d nodes up (%s) in %v; lab prefix %s, agent logs in %s",
		len(c.nodes), agents, time.Since(began).Round(time.Millisecond), cfg.Prefix, c.logDir)
	return c
}

// StartControlPlane is kubeenv.Start with the flags the harness needs:
// kube-apiserver v1.37 refuses to start with kubeenv's loopback
// --advertise-address unless its endpoint reconciler is off, and there is
// no "kubernetes" Service to reconcile in these tests anyway.
func StartControlPlane(t testing.TB, opts ...kubeenv.Option) *kubeenv.Env {
	t.Helper()
	return kubeenv.Start(t, append([]kubeenv.Option{kubeenv.WithAPIServerArgs("--endpoint-reconciler-type=none")}, opts...)...)
}

// Nodes returns the node names.
func (c *Cluster) Nodes() []string { return append([]string(nil), c.nodes...) }

// NodeIPs returns a node's underlay addresses (its Node object's InternalIPs).
func (c *Cluster) NodeIPs(node string) []netip.Addr {
	return append([]netip.Addr(nil), c.nodeIPs[node]...)
}

// Mode is the agents' enforcement mode.
func (c *Cluster) Mode() compile.Mode { return c.cfg.Mode }

// Agent returns a node's agent.
func (c *Cluster) Agent(node string) *Agent { return c.agents[node] }

// Agents returns every agent, in node order.
func (c *Cluster) Agents() []*Agent {
	out := make([]*Agent, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, c.agents[n])
	}
	return out
}

func (c *Cluster) stopAgents() {
	var wg sync.WaitGroup
	for _, a := range c.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Stop(5 * time.Second); err != nil {
				c.t.Logf("cluster: stopping the agent of %s: %v", a.Node, err)
			}
			a.relay.close()
		}()
	}
	wg.Wait()
}

// LogTails prints the last lines of every agent log through t.Logf.
func (c *Cluster) logTails(t testing.TB, lines int) {
	for _, n := range c.nodes {
		if a := c.agents[n]; a != nil {
			t.Logf("cluster: last %d lines of the agent log of %s (%s):\n%s", lines, n, a.LogPath, a.LogTail(lines))
		}
	}
}

// ListTable returns `nft list table inet nftpolicy` (the enforcer's
// table) in a node's namespace, or the error text.
func (c *Cluster) ListTable(node string) string {
	out, err := c.Lab.NodeExec(node, "nft", "list", "table", "inet", c.tableName())
	if err != nil {
		return fmt.Sprintf("(nft list table failed: %v)\n%s", err, out)
	}
	return string(out)
}

// HasTable reports whether the node's namespace holds the nftpolicy table
// (the enforcer's table).
func (c *Cluster) HasTable(node string) (bool, error) {
	out, err := c.Lab.NodeExec(node, "nft", "list", "tables")
	if err != nil {
		return false, err
	}
	return slices.Contains(strings.Split(strings.TrimSpace(string(out)), "\n"), "table inet "+c.tableName()), nil
}

func (c *Cluster) createNode(ctx context.Context, name string, ips []netip.Addr) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	node, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", name, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}}
	for _, ip := range ips {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the status of Node %s: %w", name, err)
	}
	return nil
}

// RepoRoot is the directory of the nftpolicy module's go.mod, found from
// the working directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module github.com/nftpolicy/nftpolicy\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cluster: not inside the nftpolicy module (no go.mod found upwards)")
		}
		dir = parent
	}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// AgentBinary returns $NFTPOLICY_BIN, or builds cmd/nftpolicy once per
// process into a temporary directory (RemoveBuiltBinary deletes it).
func AgentBinary() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", BinEnv, err)
		}
		return p, nil
	}
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "nftpolicy-bin-"); err != nil {
			buildErr = err
			return
		}
		// The kubectl plugin beside it, as make build writes them.
		for _, name := range []string{"nftpolicy", "kubectl-nftpolicy"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, name), "./cmd/"+name)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build ./cmd/%s (set %s to use a built binary): %w\n%s", name, BinEnv, err, out)
				return
			}
		}
		buildBin = filepath.Join(buildDir, "nftpolicy")
	})
	return buildBin, buildErr
}

// PluginBinary returns the kubectl plugin beside AgentBinary's binary
// (make build writes both; AgentBinary builds both).
func PluginBinary() (string, error) {
	bin, err := AgentBinary()
	if err != nil {
		return "", err
	}
	plugin := filepath.Join(filepath.Dir(bin), "kubectl-nftpolicy")
	if fi, err := os.Lstat(plugin); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: want the kubectl plugin's binary beside %s (make build): %v", plugin, bin, err)
	}
	return plugin, nil
}

// RemoveBuiltBinary deletes the binary AgentBinary built, if any. Call it
// from TestMain after the tests.
func RemoveBuiltBinary() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}
