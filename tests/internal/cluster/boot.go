package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/google/nftables"

	"github.com/nftpolicy/nftpolicy/pkg/bootcni"
	"github.com/nftpolicy/nftpolicy/tests/internal/netlab"
)

// BootPlugin runs the boot plugin (the agent binary under the name
// bootcni.PluginName, as cni-install puts it in /opt/cni/bin) for a pod
// StartPod started, as a runtime does after the primary plugin gave the
// pod its addresses: in the node's network namespace, CNI_COMMAND cmd
// (ADD, CHECK, DEL), the pod's namespace as CNI_NETNS, the configuration
// on stdin with a prevResult that lists the pod's addresses. It returns
// the plugin's stdout.
func (c *Cluster) BootPlugin(ctx context.Context, cmd string, sp StartedPod) ([]byte, error) {
	lp := sp.lp
	netns, err := c.Lab.NetnsPath(netlab.Pod(lp.labName))
	if err != nil {
		return nil, err
	}
	plugin := filepath.Join(c.logDir, "cni-bin", bootcni.PluginName)
	if _, err := os.Stat(plugin); err != nil {
		if err := os.MkdirAll(filepath.Dir(plugin), 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink(c.bin, plugin); err != nil && !os.IsExist(err) {
			return nil, err
		}
	}
	type ip struct {
		Address   string `json:"address"`
		Interface int    `json:"interface"`
	}
	prev := map[string]any{"cniVersion": "1.0.0",
		"interfaces": []map[string]string{{"name": "eth0", "sandbox": netns}}}
	var ips []ip
	for _, a := range lp.ips {
		ips = append(ips, ip{Address: netip.PrefixFrom(a, a.BitLen()).String()})
	}
	prev["ips"] = ips
	conf, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "lab", "type": bootcni.PluginName, "prevResult": prev})
	if err != nil {
		return nil, err
	}
	node, err := c.Lab.NetnsPath(netlab.Node(lp.node))
	if err != nil {
		return nil, err
	}
	run := exec.CommandContext(ctx, "ip", "netns", "exec", filepath.Base(node), plugin)
	run.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + lp.labName, "CNI_NETNS=" + netns,
		"CNI_IFNAME=eth0", "CNI_PATH=" + filepath.Dir(plugin), "CNI_ARGS=K8S_POD_NAMESPACE=" + sp.pod.Namespace + ";K8S_POD_NAME=" + sp.pod.Name}
	run.Stdin = strings.NewReader(string(conf))
	out, err := run.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s for pod %s: %w: %s", bootcni.PluginName, cmd, lp.key, err, out)
	}
	return out, nil
}

// HeldAddrs returns the addresses the boot hold holds in a node's table.
func (c *Cluster) HeldAddrs(node string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := c.Lab.InNode(node, func() error {
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		defer conn.CloseLasting()
		out, err = bootcni.Held(conn)
		return err
	})
	return out, err
}

// BootWindow configures RunBootWindow.
type BootWindow struct {
	// Node whose agent is not started yet (Config.NoAgents).
	Node string
	// Namespace of the pods and the policy (created).
	Namespace string
	// Rounds of probes before the agent starts; one every Interval.
	Rounds   int
	Interval time.Duration
}

// BootWindowResult is what RunBootWindow saw.
type BootWindowResult struct {
	// Rounds of probes made before the agent started.
	Rounds int
	// HeldBefore is what the hold held before the agent started: the
	// held pair's addresses, not those of Gone, a pod whose sandbox was
	// added and deleted (DEL twice) meanwhile.
	HeldBefore, Gone []netip.Addr
	// HeldAdmittedDenied counts the denied connections admitted between
	// pods started through the boot plugin before the agent's first sync
	// (the window as the plugin leaves it: 0).
	HeldAdmittedDenied int
	// UnheldAdmittedDenied counts the same for pods started without it
	// (the window as a node without the plugin has it).
	UnheldAdmittedDenied int
	// FirstSync is the time from the agent's start to its readiness.
	FirstSync time.Duration
	// After the agent's first sync: whether the denied connection of the
	// held pods is denied, their allowed one allowed (the hold gone),
	// what the hold still holds, and whether a pod started after it
	// through the plugin was left alone (not held) and can connect.
	DeniedAfter, AllowedAfter, LateAllowed bool
	HeldAfter                              []netip.Addr
}

// RunBootWindow reproduces a node after a reboot: a policy in the API
// denies ingress to app=server; the node's pods start (their namespaces,
// then their API objects) while no agent runs: a client and a server
// through the boot plugin (its ADD, as the runtime runs it), and another
// pair without it. Rounds of client -> server:80 connections then run in
// both pairs, the agent starts, and the connections are checked after its
// first sync. The node's agent must not have been started.
func (c *Cluster) RunBootWindow(ctx context.Context, bw BootWindow) (BootWindowResult, error) {
	var res BootWindowResult
	if a := c.Agent(bw.Node); a == nil || a.Running() {
		return res, fmt.Errorf("boot window: node %s must have an agent not started yet", bw.Node)
	}
	if err := c.EnsureNamespace(ctx, bw.Namespace, nil); err != nil {
		return res, err
	}
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: bw.Namespace, Name: "deny-server"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := c.ApplyPolicy(ctx, deny); err != nil {
		return res, err
	}
	pods := map[string]StartedPod{}
	for _, name := range []string{"held-client", "held-server", "unheld-client", "unheld-server"} {
		labels := map[string]string{"app": strings.TrimPrefix(strings.TrimPrefix(name, "held-"), "unheld-")}
		sp, err := c.StartPod(Pod{Namespace: bw.Namespace, Name: name, Labels: labels, Node: bw.Node})
		if err != nil {
			return res, err
		}
		if strings.HasPrefix(name, "held-") {
			if _, err := c.BootPlugin(ctx, "ADD", sp); err != nil {
				return res, err
			}
		}
		pods[name] = sp
	}
	for _, name := range []string{"held-client", "held-server", "unheld-client", "unheld-server"} {
		if _, err := c.PublishPod(ctx, pods[name]); err != nil {
			return res, err
		}
	}
	if err := c.bootPluginCheckDel(ctx, bw, pods["held-server"], &res); err != nil {
		return res, err
	}
	probe := func(from, to string) (bool, error) {
		ep, err := c.PodEndpoint(bw.Namespace + "/" + from)
		if err != nil {
			return false, err
		}
		return c.Lab.Probe(ctx, ep, c.PodIPs(bw.Namespace + "/" + to)[0], 80, netlab.TCP, 200*time.Millisecond)
	}
	for i := 0; i < bw.Rounds; i++ {
		for _, pair := range []struct {
			prefix string
			n      *int
		}{{"held-", &res.HeldAdmittedDenied}, {"unheld-", &res.UnheldAdmittedDenied}} {
			ok, err := probe(pair.prefix+"client", pair.prefix+"server")
			if err != nil {
				return res, err
			}
			if ok {
				*pair.n++
			}
		}
		res.Rounds++
		time.Sleep(bw.Interval)
	}
	return res, c.bootWindowAfter(ctx, bw, probe, &res)
}

// bootPluginCheckDel runs CHECK for a held pod, then ADD and DEL for a
// pod that goes before the agent comes (its sandbox torn down), and
// records what the hold then holds.
func (c *Cluster) bootPluginCheckDel(ctx context.Context, bw BootWindow, held StartedPod, res *BootWindowResult) error {
	if _, err := c.BootPlugin(ctx, "CHECK", held); err != nil {
		return err
	}
	gone, err := c.StartPod(Pod{Namespace: bw.Namespace, Name: "gone", Node: bw.Node})
	if err != nil {
		return err
	}
	for _, cmd := range []string{"ADD", "DEL", "DEL"} {
		if _, err := c.BootPlugin(ctx, cmd, gone); err != nil {
			return err
		}
	}
	res.Gone = gone.lp.ips
	res.HeldBefore, err = c.HeldAddrs(bw.Node)
	return err
}

// bootWindowAfter starts the agent and checks the held pods after its
// first sync.
func (c *Cluster) bootWindowAfter(ctx context.Context, bw BootWindow, probe func(from, to string) (bool, error), res *BootWindowResult) error {
	a := c.Agent(bw.Node)
	start := time.Now()
	if err := a.Start(); err != nil {
		return err
	}
	if err := a.WaitReady(ctx); err != nil {
		return err
	}
	res.FirstSync = time.Since(start)
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	var err error
	if res.HeldAfter, err = c.HeldAddrs(bw.Node); err != nil {
		return err
	}
	denied, err := probe("held-client", "held-server")
	if err != nil {
		return err
	}
	res.DeniedAfter = !denied
	if res.AllowedAfter, err = probe("held-server", "held-client"); err != nil {
		return err
	}
	late, err := c.StartPod(Pod{Namespace: bw.Namespace, Name: "late", Labels: map[string]string{"app": "late"}, Node: bw.Node})
	if err != nil {
		return err
	}
	if _, err := c.BootPlugin(ctx, "ADD", late); err != nil {
		return err
	}
	if _, err := c.PublishPod(ctx, late); err != nil {
		return err
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		return err
	}
	res.LateAllowed, err = probe("late", "held-client")
	return err
}
