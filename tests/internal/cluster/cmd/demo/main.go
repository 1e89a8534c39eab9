// Command demo shows nftpolicy at work without a cluster: a real
// kube-apiserver and etcd, two nodes made of network namespaces, one real
// `nftpolicy agent` per node, and a 3x3 grid of pods. It prints the
// connectivity matrix before and after applying sample policies, the
// ruleset of node-1 and the evaluator's reasons for a few blocked
// connections, then tears everything down. hack/demo.sh runs it (as root,
// after hack/tools.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
)

func main() { os.Exit(run()) }

func run() int {
	policies := flag.String("policies", "hack/demo/policies.yaml", "NetworkPolicies to apply (kubectl apply -f)")
	clusterPolicies := flag.String("cluster-policies", "hack/demo/cluster-policies.yaml",
		"ClusterNetworkPolicies to apply next, after installing their CRD (empty: none)")
	mode := flag.String("mode", string(compile.ModeHybrid), "agent mode: hybrid, queue or kernel")
	showTable := flag.Bool("table", true, "print `nft list table inet nftpolicy` of node-1")
	verbose := flag.Bool("v", false, "print the harness' progress lines")
	flag.Parse()
	m, err := compile.ParseMode(*mode)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 2
	}
	for _, f := range []string{*policies, *clusterPolicies} {
		if _, err := os.Stat(f); f != "" && err != nil {
			fmt.Fprintf(os.Stderr, "demo: %v\n", err)
			return 2
		}
	}
	// Ctrl-C cancels what is in progress; the cleanups still run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tb := cluster.NewProgramTB("demo")
	tb.Verbose = *verbose
	if err := tb.Run(func(tb *cluster.ProgramTB) { demo(ctx, tb, m, *policies, *clusterPolicies, *showTable) }); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, tb *cluster.ProgramTB, mode compile.Mode, policies, clusterPolicies string, showTable bool) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	fmt.Printf("nftpolicy demo: a real kube-apiserver + etcd, nodes node-1 and node-2 as network namespaces,\n"+
		"one `nftpolicy agent` process per node (%s mode), authenticated with install.yaml's ServiceAccount.\n\n", mode)
	var teardown time.Time
	// Cleanups run last-registered first: this one after Start's.
	tb.Cleanup(func() {
		if !teardown.IsZero() {
			fmt.Printf("Done in %v (teardown %v).\n", time.Since(began).Round(100*time.Millisecond), time.Since(teardown).Round(100*time.Millisecond))
		}
	})
	// The agents look for the ClusterNetworkPolicy CRD every second instead
	// of every 30: the demo installs it half-way.
	c := cluster.Start(tb, cluster.Config{Mode: mode, AgentArgs: []string{"--cluster-policy-check-period", "1s"}})
	tb.Cleanup(func() {
		teardown = time.Now()
		fmt.Printf("\nTearing down: agents (SIGTERM), network namespaces, API server and etcd.\n")
	})
	version := "?"
	if v, err := c.Client.Discovery().ServerVersion(); err == nil {
		version = v.GitVersion
	}
	fmt.Printf("kube-apiserver %s, nodes and agents up in %v.\n", version, time.Since(began).Round(100*time.Millisecond))

	for _, ns := range []string{"x", "y", "z"} {
		if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
			tb.Fatal(err)
		}
	}
	placed := map[string][]string{}
	for _, ns := range []string{"x", "y", "z"} {
		for _, name := range []string{"a", "b", "c"} {
			p, err := c.CreatePod(ctx, cluster.Pod{Namespace: ns, Name: name, Labels: map[string]string{"pod": name}})
			if err != nil {
				tb.Fatal(err)
			}
			placed[p.Spec.NodeName] = append(placed[p.Spec.NodeName], fmt.Sprintf("%s/%s %s", ns, name, p.Status.PodIP))
		}
	}
	fmt.Printf("Pods, labelled pod=a|b|c, serving 80/TCP:\n")
	for _, n := range c.Nodes() {
		fmt.Printf("  %s: %s\n", n, strings.Join(placed[n], ", "))
	}

	matrix := func(title string) *cluster.Matrix {
		m, err := c.Verify(ctx, cluster.ProbeOptions{Port: 80})
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Printf("\n%s\n(new TCP connections to port 80, rows: from, columns: to; '.' connected, 'X' blocked)\n\n%s", title, m.Grid())
		fmt.Printf("Real packets agree with the evaluator on all %d connections.\n", len(m.Cells()))
		return m
	}
	matrix("Connectivity BEFORE any policy:")

	apply := func(file string) {
		fmt.Printf("\n$ kubectl apply -f %s\n", file)
		out, err := c.Env.Kubectl(tb, "apply", "-f", file)
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Print(out)
		waitApplied(ctx, tb, c, file)
	}
	apply(policies)
	after := matrix("Connectivity AFTER the NetworkPolicies:")
	if clusterPolicies != "" {
		fmt.Printf("\nInstalling the ClusterNetworkPolicy CRD (network-policy-api v0.3.0, standard channel).\n")
		if err := c.InstallClusterPolicyCRD(ctx, "standard"); err != nil {
			tb.Fatal(err)
		}
		apply(clusterPolicies)
		after = matrix("Connectivity AFTER the ClusterNetworkPolicies too (Admin tier first, then NetworkPolicies, then Baseline):")
	}

	fmt.Printf("\n$ kubectl nftpolicy status -A\n%s", nftpolicyCLI(ctx, tb, c, "status", "-A"))

	if showTable {
		fmt.Printf("\n$ ip netns exec <node-1> nft list table inet %s\n%s", compile.TableName, c.ListTable("node-1"))
	}

	fmt.Printf("\nWhy some connections are blocked (the evaluator's reasons, as `nftpolicy eval` gives them):\n")
	// One example per cause: the reason with the pods' names taken out.
	seen := map[string]bool{}
	for _, cell := range after.Cells() {
		cause := strings.ReplaceAll(strings.ReplaceAll(cell.Reason, cell.From, ""), cell.To, "")
		if cell.Eval || seen[cause] || len(seen) == 5 {
			continue
		}
		seen[cause] = true
		fmt.Printf("  %s -> %s: %s\n", cell.From, cell.To, cell.Reason)
	}
}

// waitApplied runs `nftpolicy wait` for each policy of file: it returns
// once both nodes enforce it, and says after how long.
func waitApplied(ctx context.Context, tb *cluster.ProgramTB, c *cluster.Cluster, file string) {
	out, err := c.Env.Kubectl(tb, "get", "-f", file, "-o", `jsonpath={range .items[*]}{.kind}/{.metadata.name} {.metadata.namespace}{"\n"}{end}`)
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		ref, ns, _ := strings.Cut(line, " ")
		args := []string{"wait", strings.ToLower(ref), "--timeout=60s"}
		if ns != "" {
			args = append(args, "-n", ns)
		}
		fmt.Printf("$ kubectl nftpolicy %s\n%s", strings.Join(args, " "), nftpolicyCLI(ctx, tb, c, args...))
	}
}

// nftpolicyCLI runs the kubectl plugin's binary as the cluster's administrator
// and returns its output; a failure ends the demo.
func nftpolicyCLI(ctx context.Context, tb *cluster.ProgramTB, c *cluster.Cluster, args ...string) string {
	bin, err := cluster.PluginBinary()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", c.Env.AdminKubeconfig)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("nftpolicy %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
