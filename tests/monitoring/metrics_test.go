package monitoring

import (
	"bufio"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/internal/lab"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBuiltBinary()
	os.Exit(code)
}

// TestMonitoredMetricsExist scrapes real agents in the lab and fails when
// a metric an alert or a dashboard panel uses is not one the agent
// serves. The agents run as install.yaml's (hybrid mode, deny log, DNS
// learner, staged log) plus --verify-rate, then in queue mode (the
// userspace decisions' metrics); the test creates pods, a policy
// and a staged policy, revokes flows and probes every pair, so that the
// labelled metrics of syncs, packets, denials, revocations, staged verdicts
// and verification get their first samples (exercised: the test fails without them).
//
// A labelled metric (a Vec, or a collector's Desc with variable labels)
// has no line in the exposition before its first labelled sample, and
// some only count faults (verdict disagreements, queue drops) that a
// healthy agent never has (the hybrid run has its table tampered with to
// get a verdict disagreement, but queue drops and connections of unknown
// pods are not provoked). Such a name is accepted only when the agent's
// own code declares it as a labelled metric (declaredVectors reads the Go
// source of cmd/ and pkg/); the test logs each one so accepted. A name
// that is neither served nor declared, a misspelling, fails.
func TestMonitoredMetricsExist(t *testing.T) {
	testenv.Require(t, "monitoring metrics test", testenv.Root("create network namespaces and run nftpolicy agents"))
	used := usedMetrics(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	served := map[string]bool{}
	for _, run := range []struct {
		mode   compile.Mode
		prefix string
		args   []string
		want   []string
	}{
		// --watch-table=false: the tampering must outlive the probes, and
		// an agent that watches its table repairs it at once.
		{compile.ModeHybrid, "npmonh", []string{"--verify-rate=1", "--watch-table=false"}, append(exercised, "nftpolicy_verdict_disagreements_total")},
		{compile.ModeQueue, "npmonq", nil, []string{"nftpolicy_queue_verdicts_total", "nftpolicy_queue_decision_seconds_bucket"}},
	} {
		t.Run(string(run.mode), func(t *testing.T) {
			c := cluster.Start(t, cluster.Config{Mode: run.mode, Prefix: run.prefix, AgentArgs: run.args})
			exercise(t, ctx, c)
			if run.mode == compile.ModeHybrid {
				tamper(t, c, "x/a", "y/a", "x/web ingress[0]")
			}
			for n := range scrapeUntil(t, ctx, c, run.want) {
				served[n] = true
			}
		})
	}
	if t.Failed() {
		return
	}
	declared, err := declaredVectors()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	var unexercised []string
	for _, n := range names {
		switch {
		case served[n]:
		case declared[n]:
			unexercised = append(unexercised, n)
		default:
			t.Errorf("%s: used by %s, but the agent serves no such metric", n, strings.Join(used[n], "; "))
		}
	}
	t.Logf("%d metrics used by the alerts and the dashboard; %d served by the agents; not sampled in this run, declared by the agent as labelled metrics: %s",
		len(names), len(names)-len(unexercised), strings.Join(unexercised, ", "))
}

// startFlows opens TCP and UDP flows from one pod to a flow server on the
// other (8080/TCP, 9090/UDP) that run until the test ends: a policy that
// denies them then has them revoked.
func startFlows(t *testing.T, ctx context.Context, c *cluster.Cluster, from, to string) {
	t.Helper()
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	srvPod, err := c.PodEndpoint(to)
	if err != nil {
		t.Fatal(err)
	}
	ip := c.PodIPs(to)[0]
	srv, err := lab.StartFlowServer(c.Lab, srvPod, ip)
	if err != nil {
		t.Fatal(err)
	}
	flowCtx, stop := context.WithCancel(ctx)
	t.Cleanup(srv.Close)
	t.Cleanup(stop) // before the server closes
	client, err := c.PodEndpoint(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.StartFlows(flowCtx, c.Lab, client, ip); err != nil {
		t.Fatal(err)
	}
}

// tamperRE finds the peer set of a rule in `nft list table`.
var tamperRE = regexp.MustCompile(`ip saddr @(\S+) .*comment "([^"]+)"`)

// tamper changes the table behind the agent's back, as the
// NftpolicyVerdictDisagreement alert's runbook says can happen: on the
// node of pod dst, it deletes pod src's IPv4 address from the peer set of
// the rule commented rule, so the kernel denies what the policy allows and
// the verifier (--verify-rate) counts a disagreement on the next probes.
func tamper(t *testing.T, c *cluster.Cluster, dst, src, rule string) {
	t.Helper()
	pod, err := c.Client.CoreV1().Pods(strings.Split(dst, "/")[0]).Get(context.Background(), strings.Split(dst, "/")[1], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := pod.Spec.NodeName
	var set string
	for _, m := range tamperRE.FindAllStringSubmatch(c.ListTable(node), -1) {
		if m[2] == rule {
			set = m[1]
		}
	}
	if set == "" {
		t.Fatalf("no rule %q with a peer set in the table of %s:\n%s", rule, node, c.ListTable(node))
	}
	addr := c.PodIPs(src)[0].String()
	if out, err := c.Lab.NodeExec(node, "nft", "delete", "element", "inet", "nftpolicy", set, "{ "+addr+" }"); err != nil {
		t.Fatalf("deleting %s from %s on %s: %v\n%s", addr, set, node, err, out)
	}
	t.Logf("tampered: deleted %s (%s) from set %s on %s", addr, src, set, node)
}

// exercised are labelled metrics that exercise must give their first
// samples: the test waits for them (the deny log and the verification
// samples are read after the probes), and fails without them.
var exercised = []string{
	"nftpolicy_denied_connections_total", "nftpolicy_verdicts_verified_total",
	"nftpolicy_policy_packets_total", "nftpolicy_sync_duration_seconds_bucket", "nftpolicy_staged_verdicts_total",
	"nftpolicy_revoked_flows_total",
}

// scrapeUntil scrapes every agent until the names of want are all served
// (at most 30 s) and returns the names served. It probes every pair again
// each 2 s meanwhile: an agent's NFLOG readers start after it is ready,
// so the kernel may have logged the first probes' denials to no one.
func scrapeUntil(t *testing.T, ctx context.Context, c *cluster.Cluster, want []string) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		served := map[string]bool{}
		for _, a := range c.Agents() {
			code, body, err := a.Get(ctx, cluster.MetricsAddr, "/metrics")
			if err != nil || code != http.StatusOK {
				t.Fatalf("scraping the agent of %s: status %d, %v", a.Node, code, err)
			}
			for n := range exposedNames(body) {
				served[n] = true
			}
		}
		var missing []string
		for _, n := range want {
			if !served[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return served
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the probes, the agents serve no sample of %s", strings.Join(missing, ", "))
		}
		time.Sleep(200 * time.Millisecond)
		if i%10 == 0 {
			if _, err := c.ProbeAll(ctx, cluster.ProbeOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// exercise creates two namespaces with pods on both nodes and flows from
// the db pod to the web pod, then a policy that admits only clients to the
// web pod on 80/TCP (the flows are revoked) and a staged one that would
// deny the clients' egress, and probes every pair (allowed and denied
// connections, deny log lines, staged verdicts, verified verdicts).
func exercise(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	nodes := c.Nodes()
	for _, ns := range []string{"x", "y"} {
		if err := c.EnsureNamespace(ctx, ns, map[string]string{"ns": ns}); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range []cluster.Pod{
		{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}},
		{Namespace: "x", Name: "b", Labels: map[string]string{"app": "db"}},
		{Namespace: "y", Name: "a", Labels: map[string]string{"app": "client"}},
		{Namespace: "y", Name: "b", Labels: map[string]string{"app": "other"}},
	} {
		p.Node = nodes[i%len(nodes)]
		if _, err := c.CreatePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	startFlows(t, ctx, c, "x/b", "x/a")
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	if _, err := c.ApplyPolicy(ctx, np); err != nil {
		t.Fatal(err)
	}
	// Staged: the clients' egress limited to port 81 would deny their
	// probes on 80 (nftpolicy_staged_verdicts_total{would="deny"}).
	port81 := intstr.FromInt32(81)
	staged := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "staged-egress", Annotations: map[string]string{"nftpolicy.io/staged": "true"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port81}}}},
		},
	}
	if _, err := c.ApplyPolicy(ctx, staged); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitProgrammed(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.ProbeAll(ctx, cluster.ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bad := m.Mismatches(); len(bad) > 0 {
		t.Fatalf("real packets disagree with the evaluator:\n%s", m.Report())
	}
	t.Logf("probed:\n%s", m.Grid())
}

// exposedNames returns the sample names and the metric family names
// (# HELP, # TYPE) of a text exposition.
func exposedNames(body string) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				out[f[0]] = true
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// vecConstructors are the client_golang constructors of labelled metrics;
// their first argument's Name is the metric's name.
var vecConstructors = map[string]string{
	"NewCounterVec": "counter", "NewGaugeVec": "gauge", "NewHistogramVec": "histogram", "NewSummaryVec": "summary",
}

// declaredVectors reads the Go source of the agent (cmd/ and pkg/, not
// tests) and returns the names of the labelled metrics it declares: the
// Name of each prometheus.New*Vec's options, and each prometheus.NewDesc
// with variable labels (a collector's); a histogram's or summary's sample
// names (_bucket, _sum, _count) with it.
func declaredVectors() (map[string]bool, error) {
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range []string{"../../cmd", "../../pkg"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if call, ok := n.(*ast.CallExpr); ok {
					declaredIn(call, out)
				}
				return true
			})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading the agent's source: %w", err)
		}
	}
	return out, nil
}

// declaredIn adds the labelled metric that call declares, if it is one.
func declaredIn(call *ast.CallExpr, out map[string]bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) == 0 {
		return
	}
	if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
		return
	}
	var name, kind string
	switch fn := sel.Sel.Name; {
	case vecConstructors[fn] != "":
		kind = vecConstructors[fn]
		name = optsName(call.Args[0])
	case fn == "NewDesc" && len(call.Args) >= 3:
		if id, ok := call.Args[2].(*ast.Ident); ok && id.Name == "nil" {
			return // no variable labels: always exposed once registered
		}
		kind = "desc"
		name = stringLit(call.Args[0])
	}
	if name == "" {
		return
	}
	out[name] = true
	if kind == "histogram" || kind == "summary" || kind == "desc" {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			out[name+s] = true
		}
	}
}

// optsName returns the Name field of a prometheus.*Opts composite literal.
func optsName(e ast.Expr) string {
	if u, ok := e.(*ast.UnaryExpr); ok {
		e = u.X
	}
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return ""
	}
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
			return stringLit(kv.Value)
		}
	}
	return ""
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

// TestDeclaredVectors checks the source reading the metrics test relies on:
// labelled metrics are found, unlabelled ones are not.
func TestDeclaredVectors(t *testing.T) {
	got, err := declaredVectors()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nftpolicy_verdict_disagreements_total", "nftpolicy_queue_held_dropped_total",
		"nftpolicy_nfqueue_dropped_packets_total", "nftpolicy_sync_duration_seconds_bucket"} {
		if !got[n] {
			t.Errorf("%s: not found as a labelled metric of the agent", n)
		}
	}
	for _, n := range []string{"nftpolicy_tracker_corrections_total", "nftpolicy_last_successful_sync_timestamp_seconds", "nftpolicy_verdict_disagreement_total"} {
		if got[n] {
			t.Errorf("%s: taken for a labelled metric", n)
		}
	}
}
