package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/nftpolicy/nftpolicy/pkg/cli"
	"github.com/nftpolicy/nftpolicy/pkg/scenario"
	"github.com/nftpolicy/nftpolicy/pkg/status"
)

const previewUsage = `usage:
  kubectl nftpolicy preview -f FILE [--delete] [--node NODE] [-n NS] [-o text|json|yaml]
  nftpolicy preview --local [-f FILE] [--delete] [-n NS] [-o text|json]   (in an agent's container)

Per node, the live connections whose verdict would change if FILE's
NetworkPolicies and ClusterNetworkPolicies were applied (new or changed, by
namespace/name), or deleted with --delete: "would cut" (allowed now, denied
then: the agent's connection revocation deletes exactly these) or "would
allow", with the deciding policy and rule. Nothing is applied.

Each node's agent answers for its node, from its conntrack table and the
domain names its pods resolved: the command runs 'nftpolicy preview --local'
in every agent pod through the API server (pods/exec), so it needs the RBAC
to exec into the agents' pods (--agent-namespace); the agents open no port
for it. --local reads FILE (default: standard input) and asks the agent of
its pod over the unix socket --socket (the agent's --preview-socket).`

// previewOptions are the flags of `nftpolicy preview`.
type previewOptions struct {
	cluster   cli.ClusterFlags
	file      string
	del       bool
	node      string
	output    string
	local     bool
	socket    string
	maxFlows  int
	container string
}

// previewStdin is read by --local without -f (a variable for tests).
var previewStdin io.Reader = os.Stdin

func runPreview(args []string, stdout, stderr io.Writer) int {
	var o previewOptions
	fs := pflag.NewFlagSet("preview", pflag.ContinueOnError)
	o.cluster.Add(fs, "time limit for the whole preview")
	fs.StringVarP(&o.file, "filename", "f", "", "the policies (YAML or JSON, documents separated by ---, as kubectl apply -f reads them); - for standard input")
	fs.BoolVar(&o.del, "delete", false, "preview deleting FILE's policies (by namespace/name) instead of applying them")
	fs.StringVar(&o.node, "node", "", "ask this node's agent only")
	fs.StringVarP(&o.output, "output", "o", "text", "text, json or yaml (the JSON's field names)")
	fs.BoolVar(&o.local, "local", false, "ask the agent of this pod (run in the agent's container; kubectl nftpolicy preview does that on every node)")
	fs.StringVar(&o.socket, "socket", defaultPreviewSocket, "with --local: the agent's --preview-socket")
	fs.IntVar(&o.maxFlows, "max-flows", defaultPreviewFlows, fmt.Sprintf("connections listed per node, at most %d (the others are counted)", maxPreviewFlows))
	fs.StringVar(&o.container, "agent-container", "nftpolicy", "the agents' container")
	if code, ok := parseFlags(fs, args, stderr, previewUsage); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nftpolicy preview: "+format+"\n", a...)
		return exitBadInput
	}
	switch {
	case fs.NArg() != 0:
		return bad("unexpected arguments %q (the policies come with -f FILE)", fs.Args())
	case o.output != "text" && o.output != "json" && o.output != "yaml":
		return bad("--output %q: must be text, json or yaml", o.output)
	case o.maxFlows <= 0 || o.maxFlows > maxPreviewFlows:
		return bad("--max-flows %d: must be 1 to %d", o.maxFlows, maxPreviewFlows)
	case !o.local && o.file == "":
		return bad("-f FILE is required")
	}
	data, err := readManifestFile(o.file)
	if err != nil {
		return bad("%v", err)
	}
	if o.local {
		return o.runLocal(data, stdout, stderr)
	}
	// Checked here too, so that a bad file is one error, not one per node
	// (the namespace only fills in NetworkPolicies that name none).
	if _, err := scenario.ParseManifest(data, metav1.NamespaceDefault); err != nil {
		return bad("%s: %v", o.file, err)
	}
	cfg, err := o.cluster.RESTConfig()
	if err != nil {
		return bad("%v", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return bad("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.cluster.Timeout)
	defer cancel()
	results, err := previewCluster(ctx, kube, o.cluster.Agents, o.node, o.localArgs(), data, spdyOrWebSocketExec(cfg, kube, o.container))
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy preview: %v\n", err)
		return exitUnreachable
	}
	if err := printPreview(stdout, results, o.output); err != nil {
		fmt.Fprintf(stderr, "nftpolicy preview: %v\n", err)
		return exitFailure
	}
	for _, r := range results {
		if r.Error != "" {
			return exitFailure
		}
	}
	return exitOK
}

// readManifestFile reads FILE; "-" or "" is standard input.
func readManifestFile(path string) ([]byte, error) {
	var r io.Reader = previewStdin
	if path != "" && path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, previewMaxRequest/2+1))
	if err != nil {
		return nil, err
	}
	if len(data) > previewMaxRequest/2 {
		return nil, fmt.Errorf("the policies exceed %d bytes", previewMaxRequest/2)
	}
	return data, nil
}

// runLocal asks this pod's agent and prints its answer.
func (o *previewOptions) runLocal(data []byte, stdout, stderr io.Writer) int {
	ns := o.cluster.ExplicitNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.cluster.Timeout)
	defer cancel()
	res, err := askPreview(ctx, o.socket, previewRequest{Manifest: string(data), Namespace: ns, Delete: o.del, MaxFlows: o.maxFlows})
	if err != nil {
		fmt.Fprintf(stderr, "nftpolicy preview: %v\n", err)
		return exitFailure
	}
	if err := printPreview(stdout, []PreviewResult{*res}, o.output); err != nil {
		fmt.Fprintf(stderr, "nftpolicy preview: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// localArgs is the command run in each agent's container: the image's
// binary (install.yaml's ENTRYPOINT) with --local, answering in JSON.
func (o *previewOptions) localArgs() []string {
	args := []string{"/nftpolicy", "preview", "--local", "-o", "json", "-n", o.cluster.Namespace(),
		"--max-flows", strconv.Itoa(o.maxFlows), "--timeout", o.cluster.Timeout.String()}
	if o.del {
		args = append(args, "--delete")
	}
	return args
}

// coreClient is the part of a clientset preview uses: the agents' pods
// and their exec subresource.
type coreClient interface {
	CoreV1() corev1client.CoreV1Interface
}

// podExec runs argv in pod's agent container with stdin, returning its
// standard output and error.
type podExec func(ctx context.Context, pod status.AgentPod, argv []string, stdin []byte) (stdout, stderr []byte, err error)

// previewCluster asks the agent pod of every node (or of node only),
// a few at a time, and returns their answers sorted by node; a node that
// could not be asked has Error set.
func previewCluster(ctx context.Context, kube coreClient, agents status.Agents, node string, argv []string, data []byte, exec podExec) ([]PreviewResult, error) {
	list, err := kube.CoreV1().Pods(agents.Namespace).List(ctx, metav1.ListOptions{LabelSelector: agents.Selector})
	if err != nil {
		return nil, fmt.Errorf("listing the agents' pods: %w", err)
	}
	pods := make([]status.AgentPod, 0, len(list.Items))
	for i := range list.Items {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&list.Items[i])
		if err != nil {
			return nil, fmt.Errorf("reading pod %s/%s: %w", list.Items[i].Namespace, list.Items[i].Name, err)
		}
		if p := status.AgentPodOf(&unstructured.Unstructured{Object: m}); p.Phase == string(corev1.PodRunning) && (node == "" || p.Node == node) {
			pods = append(pods, p)
		}
	}
	byNode := status.AgentPodsByNode(pods)
	if len(byNode) == 0 {
		if node != "" {
			return nil, fmt.Errorf("no running agent pod on node %s (namespace %s, selector %s)", node, agents.Namespace, agents.Selector)
		}
		return nil, fmt.Errorf("no running agent pod (namespace %s, selector %s)", agents.Namespace, agents.Selector)
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	results := make([]PreviewResult, len(nodes))
	sem := make(chan struct{}, previewParallel)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = askPod(ctx, byNode[n], argv, data, exec)
		}()
	}
	wg.Wait()
	return results, nil
}

// previewParallel is how many agents are asked at once: each preview
// costs its agent a program build and a conntrack dump, the API server an
// exec stream.
const previewParallel = 8

// askPod runs the preview in one agent pod and decodes its answer.
func askPod(ctx context.Context, pod status.AgentPod, argv []string, data []byte, exec podExec) PreviewResult {
	fail := func(err error) PreviewResult {
		return PreviewResult{Node: pod.Node, Error: fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err)}
	}
	out, errOut, err := exec(ctx, pod, argv, data)
	if err != nil {
		if msg := strings.TrimSpace(string(errOut)); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return fail(err)
	}
	var res []PreviewResult // printPreview's JSON: one node's
	if err := json.Unmarshal(out, &res); err != nil {
		return fail(fmt.Errorf("decoding its answer: %w", err))
	}
	if len(res) != 1 || res[0].Node != pod.Node {
		return fail(fmt.Errorf("it answered %d results, not one for node %s", len(res), pod.Node))
	}
	return res[0]
}

// spdyOrWebSocketExec execs through the API server as kubectl exec does:
// over WebSocket, or SPDY where the server or a proxy cannot upgrade to it.
func spdyOrWebSocketExec(cfg *rest.Config, kube coreClient, container string) podExec {
	return func(ctx context.Context, pod status.AgentPod, argv []string, stdin []byte) ([]byte, []byte, error) {
		req := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
		if err != nil {
			return nil, nil, err
		}
		ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
		if err != nil {
			return nil, nil, err
		}
		exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
		if err != nil {
			return nil, nil, err
		}
		var stdout, stderr bytes.Buffer
		err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: bytes.NewReader(stdin), Stdout: &stdout, Stderr: &stderr})
		return stdout.Bytes(), stderr.Bytes(), err
	}
}

// printPreview prints the nodes' answers: per node a summary line and its
// connections, or all of them as JSON or YAML.
func printPreview(w io.Writer, results []PreviewResult, output string) error {
	if output == "yaml" {
		return cli.PrintStructured(w, results, output)
	}
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(w, "node %s: ERROR: %s\n", r.Node, r.Error)
			continue
		}
		summary := fmt.Sprintf("%d would cut, %d would allow", r.Cut, r.Allow)
		if r.Cut == 0 && r.Allow == 0 {
			summary = "no live connection would change"
		}
		fmt.Fprintf(w, "node %s: %s (pod addresses affected: %d, conntrack entries read: %d, %v)\n", r.Node, summary,
			r.AffectedAddresses, r.DumpedEntries, time.Duration(r.DurationSeconds*float64(time.Second)).Round(time.Microsecond))
		for _, f := range r.Flows {
			change, decided := "would cut", f.Policy+": "+f.Reason
			if f.Change == "allow" {
				change, decided = "would allow", f.Reason
			}
			fmt.Fprintf(w, "  %-11s  %s %s -> %s  %s\n", change, f.Protocol, f.Source, f.Destination, decided)
		}
		if more := r.Cut + r.Allow - len(r.Flows); more > 0 {
			fmt.Fprintf(w, "  and %d more\n", more)
		}
		if r.Cut > 0 && !r.Revocation {
			fmt.Fprintln(w, "  note: connection revocation is off on this node (--revoke-connections=false): these keep flowing until they end")
		}
		for _, warn := range r.Warnings {
			fmt.Fprintf(w, "  warning: %s\n", warn)
		}
	}
	return nil
}
