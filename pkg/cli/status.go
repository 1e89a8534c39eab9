package cli

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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/nftpolicy/nftpolicy/pkg/status"
)

const statusUsage = `usage: kubectl nftpolicy status [-n NS | -A] [KIND/NAME] [-o text|wide|json|yaml]

For each NetworkPolicy (of the namespace, or all with -A) and each
ClusterNetworkPolicy: on how many of the nodes that run an agent its current
version is in force, the longest change-to-enforced latency the nodes report,
and the warnings of nodes that enforce it fail-closed only. KIND is
networkpolicy (np) or clusternetworkpolicy (cnp). -o wide names the lagging
nodes and why; json and yaml give every field (a list of rows).

` + ExitCodes

const waitUsage = `usage: kubectl nftpolicy wait KIND/NAME [-n NS] [--for=programmed|delete] [--timeout 30s] [-o text|json|yaml]

Waits until every node that runs an agent enforces the policy's current
version (--for=programmed) or its deletion (--for=delete, or deleted). A
node whose agent is not ready counts as lagging: its kernel keeps the old
program. On timeout it names the lagging nodes and why.

` + ExitCodes

// outputs are the -o values of the commands that print rows.
var outputs = map[string]bool{"": true, "text": true, "wide": true, "json": true, "yaml": true}

// ParseRef reads KIND/NAME; ns is used for NetworkPolicies.
func ParseRef(s, ns string) (status.PolicyRef, error) {
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

// Status runs `status`.
func Status(args []string, stdout, stderr io.Writer) int {
	var f ClusterFlags
	var all bool
	var output string
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	f.Add(fs, "time limit for the requests")
	fs.BoolVarP(&all, "all-namespaces", "A", false, "NetworkPolicies of every namespace")
	fs.StringVarP(&output, "output", "o", "text", "text, wide, json or yaml")
	if code, ok := ParseFlags(fs, args, stderr, statusUsage); !ok {
		return code
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "nftpolicy status: %v\n", err)
		return code
	}
	if fs.NArg() > 1 || !outputs[output] {
		return fail(ExitBadInput, errors.New("want at most one KIND/NAME and -o text, wide, json or yaml"))
	}
	c, err := f.Clients()
	if err != nil {
		return fail(ExitBadInput, err)
	}
	ns := f.Namespace()
	ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
	defer cancel()
	var targets []status.Target
	if fs.NArg() == 1 {
		ref, err := ParseRef(fs.Arg(0), ns)
		if err != nil {
			return fail(ExitBadInput, err)
		}
		t, _, err := status.Resolve(ctx, c, ref, false)
		if err != nil {
			return fail(resolveErrorCode(err), err)
		}
		targets = []status.Target{t}
	} else {
		if all {
			ns = metav1.NamespaceAll
		}
		if targets, err = listTargets(ctx, c, ns); err != nil {
			return fail(ExitUnreachable, err)
		}
	}
	cl, err := status.Gather(ctx, c, f.Agents)
	if err != nil {
		return fail(ExitUnreachable, err)
	}
	rows := make([]status.Row, len(targets))
	for i, t := range targets {
		rows[i] = cl.Evaluate(t)
	}
	if err := printRows(stdout, rows, output); err != nil {
		return fail(ExitFailure, err)
	}
	return ExitOK
}

// resolveErrorCode: a policy that does not exist is bad input; any other
// error is the API server's.
func resolveErrorCode(err error) int {
	if errors.Is(err, status.ErrNotFound) {
		return ExitBadInput
	}
	return APIErrorCode(err)
}

// listTargets lists the NetworkPolicies of ns (all: "") and every
// ClusterNetworkPolicy (none when their API is not served).
func listTargets(ctx context.Context, c status.Clients, ns string) ([]status.Target, error) {
	nps, err := c.Dynamic.Resource(status.NetworkPoliciesGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	out := targetsOf(status.KindNetworkPolicy, nps)
	if cnps, err := c.Dynamic.Resource(status.ClusterNetworkPoliciesGVR).List(ctx, metav1.ListOptions{}); err == nil {
		out = append(out, targetsOf(status.KindClusterNetworkPolicy, cnps)...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Ref.String() < out[j].Ref.String() })
	return out, nil
}

// targetsOf are the current versions of a list's policies of kind.
func targetsOf(kind string, l *unstructured.UnstructuredList) []status.Target {
	out := make([]status.Target, 0, len(l.Items))
	for i := range l.Items {
		p := &l.Items[i]
		out = append(out, status.Target{Ref: status.PolicyRef{Kind: kind, Namespace: p.GetNamespace(), Name: p.GetName()},
			ResourceVersion: p.GetResourceVersion(), Generation: p.GetGeneration()})
	}
	return out
}

// PrintStructured prints v as indented JSON or as YAML (the same field
// names); it is every command's -o json and -o yaml.
func PrintStructured(w io.Writer, v any, output string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil && output == "yaml" {
		b, err = yaml.JSONToYAML(b)
	}
	if err == nil {
		_, err = fmt.Fprintln(w, strings.TrimSpace(string(b)))
	}
	return err
}

// printRows prints the table (wide: with the lagging nodes) or the rows
// as JSON or YAML.
func printRows(w io.Writer, rows []status.Row, output string) error {
	if output == "json" || output == "yaml" {
		return PrintStructured(w, rows, output)
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
