package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

const statusUsage = `usage: nftpolicy status [-n NS | -A] [KIND/NAME] [-o wide|json|yaml]

For each NetworkPolicy (of the namespace, or all with -A) and each
ClusterNetworkPolicy: on how many of the nodes that run an agent its current
version is in force, the longest change-to-enforced latency the nodes report,
and the warnings of nodes that enforce it fail-closed only. KIND is
networkpolicy (np) or clusternetworkpolicy (cnp). -o wide names the lagging
nodes and why. As a kubectl plugin: kubectl nftpolicy status ...`

const waitUsage = `usage: nftpolicy wait KIND/NAME [-n NS] [--for=programmed|deleted] [--timeout 30s]

Waits until every node that runs an agent enforces the policy's current
version (--for=programmed) or its deletion (--for=deleted). A node whose
agent is not ready counts as lagging: its kernel keeps the old program.
Exit 0 when done; 1 on timeout, naming the lagging nodes and why; 2 on bad
input. As a kubectl plugin: kubectl nftpolicy wait ...`

// clusterFlags are the flags every live-cluster command shares.
type clusterFlags struct {
	kubeconfig, namespace string
	agents                status.Agents
	timeout               time.Duration
}

func (f *clusterFlags) add(fs *pflag.FlagSet, timeoutHelp string) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVarP(&f.namespace, "namespace", "n", "", "namespace of NetworkPolicies (default: the kubeconfig context's)")
	fs.StringVar(&f.agents.Namespace, "agent-namespace", status.DefaultAgents.Namespace, "namespace of the agents' DaemonSet")
	fs.StringVar(&f.agents.Selector, "agent-selector", status.DefaultAgents.Selector, "label selector of the agents' pods")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, timeoutHelp)
}

// clients connects and fills the default namespace.
func (f *clusterFlags) clients() (status.Clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	if f.namespace == "" {
		ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).Namespace()
		if err != nil || ns == "" {
			ns = "default"
		}
		f.namespace = ns
	}
	cfg, err := clientConfig(f.kubeconfig)
	if err != nil {
		return status.Clients{}, err
	}
	var c status.Clients
	if c.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return c, err
	}
	if c.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return c, err
	}
	c.Policy, err = npaclient.NewForConfig(cfg)
	return c, err
}

// parseRef reads KIND/NAME; ns is used for NetworkPolicies.
func parseRef(s, ns string) (status.PolicyRef, error) {
	kind, name, ok := strings.Cut(s, "/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return status.PolicyRef{}, fmt.Errorf("%q: want KIND/NAME, KIND networkpolicy (np) or clusternetworkpolicy (cnp)", s)
	}
	switch strings.ToLower(kind) {
	case "networkpolicy", "networkpolicies", "np", "netpol", "networkpolicy.networking.k8s.io":
		return status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: ns, Name: name}, nil
	case "clusternetworkpolicy", "clusternetworkpolicies", "cnp", "clusternetworkpolicy.policy.networking.k8s.io":
		return status.PolicyRef{Kind: status.KindClusterNetworkPolicy, Name: name}, nil
	}
	return status.PolicyRef{}, fmt.Errorf("kind %q: want networkpolicy (np) or clusternetworkpolicy (cnp)", kind)
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	var f clusterFlags
	var all bool
	var output string
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	f.add(fs, "time limit for the requests")
	fs.BoolVarP(&all, "all-namespaces", "A", false, "NetworkPolicies of every namespace")
	fs.StringVarP(&output, "output", "o", "", "wide, json or yaml (default: a table)")
	if code, ok := parseFlags(fs, args, stderr, statusUsage); !ok {
		return code
	}
	bad := func(err error) int {
		fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
		return exitBadInput
	}
	if fs.NArg() > 1 || !map[string]bool{"": true, "wide": true, "json": true, "yaml": true}[output] {
		return bad(errors.New("want at most one KIND/NAME and -o wide, json or yaml"))
	}
	c, err := f.clients()
	if err != nil {
		return bad(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	var targets []status.Target
	if fs.NArg() == 1 {
		ref, err := parseRef(fs.Arg(0), f.namespace)
		if err != nil {
			return bad(err)
		}
		t, _, err := status.Resolve(ctx, c, ref, false)
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
			return exitFailure
		}
		targets = []status.Target{t}
	} else {
		ns := f.namespace
		if all {
			ns = metav1.NamespaceAll
		}
		if targets, err = listTargets(ctx, c, ns); err != nil {
			fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
			return exitFailure
		}
	}
	cl, err := status.Gather(ctx, c, f.agents)
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
		return exitFailure
	}
	rows := make([]status.Row, len(targets))
	for i, t := range targets {
		rows[i] = cl.Evaluate(t)
	}
	if err := printRows(stdout, rows, output); err != nil {
		fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// listTargets lists the NetworkPolicies of ns (all: "") and every
// ClusterNetworkPolicy (none when their API is not served).
func listTargets(ctx context.Context, c status.Clients, ns string) ([]status.Target, error) {
	nps, err := c.Kube.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	var out []status.Target
	for i := range nps.Items {
		p := &nps.Items[i]
		out = append(out, status.Target{Ref: status.PolicyRef{Kind: status.KindNetworkPolicy, Namespace: p.Namespace, Name: p.Name},
			ResourceVersion: p.ResourceVersion, Generation: p.Generation})
	}
	cnps, err := c.Policy.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
	if err == nil {
		for i := range cnps.Items {
			p := &cnps.Items[i]
			out = append(out, status.Target{Ref: status.PolicyRef{Kind: status.KindClusterNetworkPolicy, Name: p.Name},
				ResourceVersion: p.ResourceVersion, Generation: p.Generation})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Ref.String() < out[j].Ref.String() })
	return out, nil
}

// printRows prints the table (wide: with the lagging nodes) or the rows
// as JSON or YAML.
func printRows(w io.Writer, rows []status.Row, output string) error {
	switch output {
	case "json", "yaml":
		b, err := json.MarshalIndent(rows, "", "  ")
		if err == nil && output == "yaml" {
			b, err = yaml.JSONToYAML(b)
		}
		if err == nil {
			_, err = fmt.Fprintln(w, strings.TrimSpace(string(b)))
		}
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "KIND\tPOLICY\tGENERATION\tNODES\tLATENCY\tWARNINGS"
	if output == "wide" {
		head += "\tLAGGING"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		name := r.Ref.Name
		if r.Ref.Namespace != "" {
			name = r.Ref.Namespace + "/" + name
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%d/%d\t%s\t%s", r.Ref.Kind, name, r.Generation, len(r.Programmed), r.Nodes,
			latencyText(r.Latency), orDash(strings.Join(r.Warnings, "; ")))
		if output == "wide" {
			var lag []string
			for _, l := range r.Lagging {
				lag = append(lag, l.Node+": "+l.Why)
			}
			line += "\t" + orDash(strings.Join(lag, "; "))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func latencyText(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(100 * time.Microsecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runWait(args []string, stdout, stderr io.Writer) int {
	var f clusterFlags
	var forWhat string
	fs := pflag.NewFlagSet("wait", pflag.ContinueOnError)
	f.add(fs, "give up after this long (exit 1)")
	fs.StringVar(&forWhat, "for", "programmed", "programmed or deleted")
	if code, ok := parseFlags(fs, args, stderr, waitUsage); !ok {
		return code
	}
	bad := func(err error) int {
		fmt.Fprintf(stderr, "nftpolicy wait: %v\n", err)
		return exitBadInput
	}
	if fs.NArg() != 1 || forWhat != "programmed" && forWhat != "deleted" {
		return bad(errors.New("want one KIND/NAME and --for=programmed or --for=deleted"))
	}
	c, err := f.clients()
	if err != nil {
		return bad(err)
	}
	ref, err := parseRef(fs.Arg(0), f.namespace)
	if err != nil {
		return bad(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	row, err := status.Wait(ctx, c, f.agents, ref, forWhat == "deleted")
	if err != nil {
		var lag *status.LaggingError
		if errors.As(err, &lag) {
			fmt.Fprintf(stderr, "nftpolicy wait: %s: timed out after %v: %v\n", ref, f.timeout, err)
		} else {
			fmt.Fprintf(stderr, "nftpolicy wait: %s: %v\n", ref, err)
		}
		return exitFailure
	}
	fmt.Fprintf(stdout, "%s %s on %d/%d nodes after %v (the agents' change-to-enforced latency: %s)\n",
		ref, forWhat, len(row.Programmed), row.Nodes, time.Since(start).Round(time.Millisecond), latencyText(row.Latency))
	for _, w := range row.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	return exitOK
}
