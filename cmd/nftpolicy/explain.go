package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/slim"
)

const explainUsage = `usage:
  nftpolicy explain [--kubeconfig K] FROM TO [--port P] [--protocol TCP]   (live cluster)
  nftpolicy explain --scenario FILE FROM TO [--port P] [--protocol TCP]    (offline)
  nftpolicy explain --from-ruleset [--ruleset-file F] FROM TO [--port P]   (this node's kernel ruleset)

FROM and TO are NS/POD, an IP address, or node:NAME. The verdict is given per
direction with the deciding policy and rule; for a denial, the nearest misses:
the rules that would have allowed the connection and the one condition each
failed. -o json and yaml give every field. As a kubectl plugin
(kubectl-nftpolicy and nftpolicy on PATH): kubectl nftpolicy explain ...
The live form takes kubectl's connection flags (--context, --as, ...).

Exit status: 0 allowed; 1 denied (0 with --exit-code=false); 2 bad input
(flags, arguments, files, kubeconfig, an unknown pod); 3 the API server
cannot be reached or refuses the request.`

// ExplainResult is the output of `nftpolicy explain --output json`.
type ExplainResult struct {
	From          string          `json:"from"`
	To            string          `json:"to"`
	Source        string          `json:"source"`
	Destination   string          `json:"destination"`
	Protocol      string          `json:"protocol"`
	Port          uint16          `json:"port"`
	Allowed       bool            `json:"allowed"`
	Egress        bool            `json:"egress"`
	Ingress       bool            `json:"ingress"`
	EgressReason  string          `json:"egressReason"`
	IngressReason string          `json:"ingressReason"`
	Reason        string          `json:"reason"`
	NearestMiss   []evaluate.Miss `json:"nearestMiss"`
	// Staged is the verdict with the staged policies (nftpolicy.io/staged)
	// in force; nil when there are none.
	Staged *StagedVerdict `json:"staged,omitempty"`
	// Kernel is the trace through this node's ruleset (--from-ruleset).
	Kernel *Trace `json:"kernel,omitempty"`
}

type explainOptions struct {
	scenario, protocol, output, rulesetFile string
	fromRuleset, exitCode                   bool
	// port is an int, not a uint16, so that 0, negative and too large
	// values all get the same message (pflag's says "non-negative").
	port    int
	timeout time.Duration
	cluster cli.ClusterFlags
	budgets config.CostBudgets
}

// check validates the flags that need no cluster and returns the
// connection's protocol and port.
func (o *explainOptions) check() (compile.Protocol, uint16, error) {
	proto, ok := compile.ParseProtocol(strings.ToUpper(o.protocol))
	if !ok {
		return 0, 0, fmt.Errorf("--protocol %q: must be TCP, UDP or SCTP", o.protocol)
	}
	// Port 0 is no connection's destination: an answer for it would be
	// about a connection that cannot exist.
	if o.port < 1 || o.port > 65535 {
		return 0, 0, fmt.Errorf("--port %d: out of range 1-65535", o.port)
	}
	if o.timeout <= 0 {
		return 0, 0, fmt.Errorf("--timeout %v: must be positive", o.timeout)
	}
	if o.output != "text" && o.output != "json" && o.output != "yaml" {
		return 0, 0, fmt.Errorf("--output %q: must be text, json or yaml", o.output)
	}
	return proto, uint16(o.port), nil
}

func runExplain(args []string, stdout, stderr io.Writer) int {
	o := explainOptions{}
	fs := pflag.NewFlagSet("explain", pflag.ContinueOnError)
	fs.StringVar(&o.scenario, "scenario", "", "explain over a scenario file instead of a live cluster (docs/scenario-format.md)")
	o.cluster.AddConnection(fs)
	fs.BoolVar(&o.fromRuleset, "from-ruleset", false, "trace the connection through this node's kernel ruleset (nft -j list table inet nftpolicy) too")
	fs.StringVar(&o.rulesetFile, "ruleset-file", "", "with --from-ruleset: read the nft JSON listing from this file instead of running nft")
	fs.IntVar(&o.port, "port", 80, "destination port (1-65535)")
	fs.StringVar(&o.protocol, "protocol", "TCP", "TCP, UDP or SCTP")
	fs.StringVarP(&o.output, "output", "o", "text", "text, json or yaml")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "time limit for listing the cluster's objects")
	fs.BoolVar(&o.exitCode, "exit-code", true, "exit 1 when the connection is denied; false: exit 0")
	o.budgets = config.Default().CostBudgets
	o.budgets.AddFlags(fs)
	if code, ok := parseFlags(fs, args, stderr, explainUsage); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nftpolicy explain: "+format+"\n", a...)
		return exitBadInput
	}
	if fs.NArg() != 2 {
		return bad("want FROM and TO, got %d arguments (see --help)", fs.NArg())
	}
	proto, port, err := o.check()
	if err != nil {
		return bad("%v", err)
	}
	from, to := fs.Arg(0), fs.Arg(1)

	var in compile.Input
	modelless := false
	switch {
	case o.scenario != "":
		s, code := loadScenario(o.scenario, stderr)
		if s == nil {
			return code
		}
		in = s.Input("", nil, nil)
	case o.fromRuleset && o.cluster.Kubeconfig == "" && isAddr(from) && isAddr(to):
		// Addresses only: the kernel trace needs no cluster, and there is
		// no policy model to compare it with.
		modelless = true
	default:
		cfg, err := o.cluster.RESTConfig()
		if err != nil {
			return bad("loading client configuration: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		defer cancel()
		if in, err = liveInput(ctx, cfg); err != nil {
			fmt.Fprintf(stderr, "nftpolicy explain: %v\n", err)
			return exitUnreachable
		}
	}
	in.Budgets = compileBudgets(o.budgets)
	prog := compile.Build(in)
	src, dst, err := resolvePair(prog, from, to)
	if err != nil {
		return bad("%v", err)
	}
	ex := evaluate.Explain(prog, src, dst, proto, port)
	res := ExplainResult{From: from, To: to, Source: src.String(), Destination: dst.String(), Protocol: proto.String(), Port: port,
		Allowed: ex.Allowed, Egress: ex.Egress, Ingress: ex.Ingress, EgressReason: ex.EgressReason, IngressReason: ex.IngressReason,
		Reason: ex.Reason(), NearestMiss: ex.NearestMiss}
	res.Staged = stagedVerdict(in, prog, src, dst, proto, port)
	if o.fromRuleset {
		// A --ruleset-file that cannot be read or parsed is bad input
		// (exit 2), not a denial (1).
		failed := exitFailure
		if o.rulesetFile != "" {
			failed = exitBadInput
		}
		data, err := readRuleset(o.rulesetFile)
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy explain: %v\n", err)
			return failed
		}
		tr, err := TraceRuleset(data, src, dst, proto, port)
		if err != nil {
			fmt.Fprintf(stderr, "nftpolicy explain: %v\n", err)
			return failed
		}
		res.Kernel = &tr
		if modelless {
			ok := tr.Verdict == "accept"
			res.Allowed, res.Egress, res.Ingress = ok, ok, ok
			res.EgressReason, res.IngressReason, res.Reason = reasonNoModel, reasonNoModel, reasonNoModel
			res.NearestMiss = []evaluate.Miss{}
		}
	}
	if err := writeExplanation(stdout, &res, o.output); err != nil {
		fmt.Fprintf(stderr, "nftpolicy explain: writing: %v\n", err)
		return exitFailure
	}
	if !res.Allowed {
		return cli.FailCode(o.exitCode)
	}
	return exitOK
}

// writeExplanation prints r as text, one line of JSON, or YAML (the JSON
// field names).
func writeExplanation(w io.Writer, r *ExplainResult, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(r)
	case "yaml":
		return cli.PrintStructured(w, r, output)
	}
	printExplanation(w, r)
	return nil
}

// StagedVerdict is what a connection's verdict would be with the staged
// policies in force.
type StagedVerdict struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
}

// stagedVerdict decides the connection with in's staged policies in force,
// nil when in has none (its program equals prog).
func stagedVerdict(in compile.Input, prog *compile.Program, src, dst netip.Addr, proto compile.Protocol, port uint16) *StagedVerdict {
	in.EnforceStaged = true
	staged := compile.Build(in)
	if len(staged.Policies) == len(prog.Policies) && len(staged.ClusterPolicies) == len(prog.ClusterPolicies) {
		return nil
	}
	v := evaluate.Evaluate(staged, src, dst, proto, port)
	return &StagedVerdict{Allowed: v.Allowed, Reason: v.Reason()}
}

// reasonNoModel is the reason of a --from-ruleset answer without a cluster.
const reasonNoModel = "kernel ruleset only (no policy model: pass --kubeconfig or --scenario to compare)"

func isAddr(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

func verdictText(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}

func printExplanation(w io.Writer, r *ExplainResult) {
	fmt.Fprintf(w, "%s (%s) -> %s (%s) %s %d: %s\n", r.From, r.Source, r.To, r.Destination, r.Protocol, r.Port, strings.ToUpper(verdictText(r.Allowed)))
	if r.Reason == reasonNoModel {
		fmt.Fprintln(w, "  "+reasonNoModel)
		printTrace(w, r)
		return
	}
	fmt.Fprintf(w, "  egress:  %s: %s\n", verdictText(r.Egress), r.EgressReason)
	fmt.Fprintf(w, "  ingress: %s: %s\n", verdictText(r.Ingress), r.IngressReason)
	if !r.Allowed {
		if len(r.NearestMiss) == 0 {
			fmt.Fprintln(w, "nearest misses: none (no rule of the deciding policies is one change away)")
		} else {
			fmt.Fprintln(w, "nearest misses:")
		}
		for _, m := range r.NearestMiss {
			fmt.Fprintf(w, "  %s %s: %s: %s\n", m.DirectionName, m.Rule, m.Condition, m.Detail)
			fmt.Fprintf(w, "    would allow: %s\n", changeText(m.Change))
		}
	}
	if st := r.Staged; st != nil {
		fmt.Fprintf(w, "with the staged policies in force: %s: %s\n", verdictText(st.Allowed), st.Reason)
	}
	printTrace(w, r)
	if r.Kernel != nil && (r.Kernel.Verdict == "accept") != r.Allowed {
		fmt.Fprintln(w, "WARNING: the kernel ruleset and the policy model disagree")
	}
}

func printTrace(w io.Writer, r *ExplainResult) {
	if r.Kernel != nil {
		fmt.Fprintf(w, "kernel ruleset: %s\n", verdictText(r.Kernel.Verdict == "accept"))
		for _, s := range r.Kernel.Steps {
			fmt.Fprintf(w, "  %s\n", s)
		}
		if r.Kernel.Comment != "" {
			fmt.Fprintf(w, "  deciding rule: chain %s, handle %s: %s\n", r.Kernel.Chain, r.Kernel.Rule, r.Kernel.Comment)
		}
	}
}

func changeText(c evaluate.Change) string {
	switch {
	case c.Port != 0 || c.Protocol != 0:
		return fmt.Sprintf("connecting to %s %d", c.ProtocolName, c.Port)
	case c.Pod != "" || c.Namespace != "":
		what := "pod " + c.Pod
		if c.Namespace != "" {
			what = "namespace " + c.Namespace
		}
		var parts []string
		for k, v := range c.SetLabels {
			parts = append(parts, "label "+k+"="+v)
		}
		for _, k := range c.RemoveLabels {
			parts = append(parts, "no label "+k)
		}
		return what + " with " + strings.Join(parts, ", ")
	case c.Remote.IsValid():
		return "the remote end at " + c.Remote.String()
	}
	return "nothing"
}

// resolvePair resolves both ends to addresses of one family, IPv4 first.
func resolvePair(p *compile.Program, from, to string) (netip.Addr, netip.Addr, error) {
	a, err := resolveEndpoint(p, from)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	b, err := resolveEndpoint(p, to)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	for _, x := range a {
		for _, y := range b {
			if x.Is4() == y.Is4() {
				return x, y, nil
			}
		}
	}
	return netip.Addr{}, netip.Addr{}, fmt.Errorf("%s and %s share no address family", from, to)
}

// resolveEndpoint reads NS/POD, an IP address, or node:NAME.
func resolveEndpoint(p *compile.Program, s string) ([]netip.Addr, error) {
	if name, ok := strings.CutPrefix(s, "node:"); ok {
		addrs := p.NodeAddrs[name]
		if len(addrs) == 0 {
			return nil, fmt.Errorf("%s: no such node, or it has no addresses", s)
		}
		return addrs, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if !strings.Contains(s, "/") {
		return nil, fmt.Errorf("%q: want NS/POD, an IP address or node:NAME", s)
	}
	id, ok := p.PodByKey(s)
	if !ok {
		return nil, fmt.Errorf("pod %s: not found, or it has no IP, uses the host network or has finished (policies do not apply to it)", s)
	}
	return p.Pods[id].IPs, nil
}

// liveInput lists what the agent's informers watch, transformed as they
// transform it, for a cluster-wide program.
func liveInput(ctx context.Context, cfg *rest.Config) (compile.Input, error) {
	cfg.UserAgent = "nftpolicy-explain"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return compile.Input{}, err
	}
	var in compile.Input
	opts := metav1.ListOptions{ResourceVersion: "0"}
	nss, err := client.CoreV1().Namespaces().List(ctx, opts)
	if err != nil {
		return in, fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range nss.Items {
		in.Namespaces = append(in.Namespaces, transformed[*corev1.Namespace](&nss.Items[i]))
	}
	pods, err := client.CoreV1().Pods("").List(ctx, opts)
	if err != nil {
		return in, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		in.Pods = append(in.Pods, transformed[*corev1.Pod](&pods.Items[i]))
	}
	nps, err := client.NetworkingV1().NetworkPolicies("").List(ctx, opts)
	if err != nil {
		return in, fmt.Errorf("listing networkpolicies: %w", err)
	}
	for i := range nps.Items {
		in.Policies = append(in.Policies, transformed[*networkingv1.NetworkPolicy](&nps.Items[i]))
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, opts)
	if err != nil {
		return in, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		in.Nodes = append(in.Nodes, transformed[*corev1.Node](&nodes.Items[i]))
	}
	npa, err := npaclient.NewForConfig(cfg)
	if err != nil {
		return in, err
	}
	cnps, err := npa.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, opts)
	switch {
	case apierrors.IsNotFound(err):
		// The ClusterNetworkPolicy CRD is not installed: NetworkPolicy only.
	case err != nil:
		return in, fmt.Errorf("listing clusternetworkpolicies: %w", err)
	default:
		for i := range cnps.Items {
			in.ClusterPolicies = append(in.ClusterPolicies, transformed[*npav1beta1.ClusterNetworkPolicy](&cnps.Items[i]))
		}
	}
	return in, nil
}

// transformed applies the agent's informer transform, so that the program
// is built from exactly what the agent keeps of each object.
func transformed[T any](obj T) T {
	out, err := slim.Transform(obj)
	if err != nil {
		return obj
	}
	if t, ok := out.(T); ok {
		return t
	}
	return obj
}
