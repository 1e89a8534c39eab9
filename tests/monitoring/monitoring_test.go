// Package monitoring checks the monitoring kit of deploy/monitoring: the
// alert rules with the real promtool (hack/promtool.sh builds it; `promtool
// check rules` and the unit tests of deploy/monitoring/tests), the
// PrometheusRule against the plain rules file, the ServiceMonitor against
// install.yaml's metrics port and the Prometheus Operator's CRDs in a real
// API server (objects_test.go), and, against real agents in the lab, that
// every metric an alert or a dashboard panel uses exists
// (metrics_test.go).
package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/nftpolicy/nftpolicy/tests/internal/cluster"
	"github.com/nftpolicy/nftpolicy/tests/testenv"
)

const kitDir = "../../deploy/monitoring"

// promtoolBin returns the promtool that hack/promtool.sh built
// (NFTPOLICY_PROMTOOL overrides), or stops the test as testenv decides.
func promtoolBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NFTPOLICY_PROMTOOL"); p != "" {
		return p
	}
	out, err := exec.Command("bash", "../../hack/promtool.sh", "--built").Output()
	if err != nil {
		err = errors.New("needs promtool: bash hack/promtool.sh (make promtool) builds it")
	}
	testenv.Require(t, "monitoring rule tests", testenv.Err(err))
	return strings.TrimSpace(string(out))
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtoolBin(t), args...)
	cmd.Dir = kitDir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestPromtoolCheckRules: the rules parse, their expressions and templates
// are valid, and promtool's linter finds nothing.
func TestPromtoolCheckRules(t *testing.T) {
	t.Log(runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", "nftpolicy-alerts.yaml"))
}

// TestPromtoolTestRules runs the unit tests of every alert
// (deploy/monitoring/tests), and checks that each alert has at least one
// test in which it fires.
func TestPromtoolTestRules(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(kitDir, "tests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule tests in %s/tests (%v)", kitDir, err)
	}
	args := []string{"test", "rules"}
	fired := map[string]bool{}
	for _, f := range files {
		rel, _ := filepath.Rel(kitDir, f)
		args = append(args, rel)
		for _, a := range firingCases(t, f) {
			fired[a] = true
		}
	}
	t.Log(runPromtool(t, args...))
	for _, a := range alertNames(t) {
		if !fired[a] {
			t.Errorf("alert %s has no promtool test case in which it fires", a)
		}
	}
}

// TestDashboardQueriesParse checks every panel query of the dashboard with
// promtool: each becomes a recording rule of a temporary rules file
// (Grafana's $__rate_interval and $instance replaced by what they expand
// to), which `promtool check rules` parses.
func TestDashboardQueriesParse(t *testing.T) {
	dash := loadDashboard(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			expr := strings.NewReplacer("$__rate_interval", "2m", "$instance", ".*").Replace(tg.Expr)
			q, _ := json.Marshal(expr)
			fmt.Fprintf(&b, "      - record: dashboard:panel%d\n        expr: %s\n", n, q)
			n++
		}
	}
	if n == 0 {
		t.Fatal("the dashboard has no panel queries")
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, "check", "rules", path))
}

// firingCases lists the alerts a promtool test file expects to fire at
// least once.
func firingCases(t *testing.T, path string) []string {
	var doc struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, path, &doc)
	var out []string
	for _, tg := range doc.Tests {
		for _, c := range tg.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				out = append(out, c.Alertname)
			}
		}
	}
	return out
}

// ruleGroups is the part of a rules file these tests read.
type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	var g ruleGroups
	readYAML(t, filepath.Join(kitDir, "nftpolicy-alerts.yaml"), &g)
	if len(g.Groups) == 0 {
		t.Fatal("nftpolicy-alerts.yaml: no rule groups")
	}
	return g
}

func alertNames(t *testing.T) []string {
	var out []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

// TestPrometheusRuleMatchesRulesFile: prometheusrule.yaml carries exactly
// the groups of the plain rules file.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	var plain any
	readYAML(t, filepath.Join(kitDir, "nftpolicy-alerts.yaml"), &plain)
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       any    `yaml:"spec"`
	}
	readYAML(t, filepath.Join(kitDir, "prometheusrule.yaml"), &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("prometheusrule.yaml is %s %s", pr.APIVersion, pr.Kind)
	}
	if d := cmp.Diff(plain, pr.Spec); d != "" {
		t.Errorf("prometheusrule.yaml's spec differs from nftpolicy-alerts.yaml (-plain +PrometheusRule):\n%s", d)
	}
}

// TestRunbookPerAlert: every alert has summary, description and a
// runbook_url whose anchor is a section of docs/monitoring.md.
func TestRunbookPerAlert(t *testing.T) {
	doc, err := os.ReadFile("../../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "### ") {
			headings[strings.ToLower(strings.TrimSpace(line[4:]))] = true
		}
	}
	const prefix = "https://github.com/nftpolicy/nftpolicy/blob/main/docs/monitoring.md#"
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description are required", r.Alert)
			}
			url := r.Annotations["runbook_url"]
			if !strings.HasPrefix(url, prefix) || strings.TrimPrefix(url, prefix) != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want %s%s", r.Alert, url, prefix, strings.ToLower(r.Alert))
			}
			if !headings[strings.ToLower(r.Alert)] {
				t.Errorf("%s: docs/monitoring.md has no section ### %s", r.Alert, r.Alert)
			}
		}
	}
}

// TestServiceMonitorMatchesInstall: the Service selects install.yaml's
// agent pods and targets the port its metrics.bindAddress names (its
// ConfigMap's agent configuration, or a flag in the DaemonSet's args), and
// the ServiceMonitor scrapes that port over HTTPS with a bearer token.
func TestServiceMonitorMatchesInstall(t *testing.T) {
	objs := yamlDocs(t, filepath.Join(kitDir, "servicemonitor.yaml"))
	install := yamlDocs(t, "../../install.yaml")
	ds := findKind(t, install, "DaemonSet")
	svc := findKind(t, objs, "Service")
	sm := findKind(t, objs, "ServiceMonitor")
	podLabels := dig(ds, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range dig(svc, "spec", "selector").(map[string]any) {
		if podLabels[k] != v {
			t.Errorf("Service selector %s=%v does not select the DaemonSet's pods (labels %v)", k, v, podLabels)
		}
	}
	args := dig(ds, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"].([]any)
	cfg, err := cluster.InstallAgentConfig()
	if err != nil {
		t.Fatal(err)
	}
	bind := cfg.Metrics.BindAddress
	for _, a := range args {
		if s, _ := a.(string); strings.HasPrefix(s, "--metrics-bind-address=") {
			bind = strings.TrimPrefix(s, "--metrics-bind-address=")
		}
	}
	port := dig(svc, "spec", "ports").([]any)[0].(map[string]any)
	if want := ":" + itoa(port["targetPort"]); bind != want {
		t.Errorf("install.yaml's agent listens on %q, the Service targets %s", bind, want)
	}
	for k, v := range dig(sm, "spec", "selector", "matchLabels").(map[string]any) {
		if dig(svc, "metadata", "labels").(map[string]any)[k] != v {
			t.Errorf("ServiceMonitor selector %s=%v does not select the Service", k, v)
		}
	}
	ep := dig(sm, "spec", "endpoints").([]any)[0].(map[string]any)
	if ep["port"] != port["name"] || ep["scheme"] != "https" || ep["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoint %v: want port %v, scheme https, a bearer token", ep, port["name"])
	}
	if name := dig(svc, "metadata", "name"); name != "nftpolicy-agent" {
		t.Errorf("the Service is %v: the rules select job=\"nftpolicy-agent\" (the job label is the Service's name)", name)
	}
}

func itoa(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []map[string]any
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("%s: %v", path, err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
}

func findKind(t *testing.T, objs []map[string]any, kind string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == kind {
			return o
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}

func dig(m map[string]any, path ...string) any {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[p]
	}
	return v
}

// metricRE finds the metric names of a PromQL expression: the agent's
// (nftpolicy_) and the Go and process collectors' it registers. Label
// values such as job="nftpolicy-agent" do not match (a hyphen).
var metricRE = regexp.MustCompile(`(?:^|[^A-Za-z0-9_:])((?:nftpolicy|process|go)_[A-Za-z0-9_]+)`)

// exprMetrics returns the metric names in expr.
func exprMetrics(expr string) []string {
	var out []string
	for _, m := range metricRE.FindAllStringSubmatch(expr, -1) {
		out = append(out, m[1])
	}
	return out
}

// usedMetrics maps each metric name the alert rules and the dashboard's
// panels (and template variables) use to where they use it.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	add := func(expr, where string) {
		for _, n := range exprMetrics(expr) {
			used[n] = append(used[n], where)
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			add(r.Expr, "alert "+r.Alert+r.Record)
		}
	}
	dash := loadDashboard(t)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			add(tg.Expr, "panel "+p.Title)
		}
	}
	for _, v := range dash.Templating.List {
		add(v.Definition, "variable $"+v.Name)
	}
	for _, w := range used {
		sort.Strings(w)
	}
	return used
}

// dashboard is the part of the Grafana dashboard these tests read.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var dash dashboard
	data, err := os.ReadFile(filepath.Join(kitDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	return dash
}

// TestExprMetrics checks the extraction the metrics test relies on.
func TestExprMetrics(t *testing.T) {
	got := exprMetrics(`histogram_quantile(0.99, sum by (le) (rate(nftpolicy_programming_latency_seconds_bucket{job="nftpolicy-agent"}[5m])))` +
		` > 1 and process_resident_memory_bytes>go_gc_gomemlimit_bytes or foo_nftpolicy_x`)
	want := []string{"nftpolicy_programming_latency_seconds_bucket", "process_resident_memory_bytes", "go_gc_gomemlimit_bytes"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("exprMetrics (-want +got):\n%s", d)
	}
	used := usedMetrics(t)
	for _, n := range []string{"nftpolicy_verdict_disagreements_total", "nftpolicy_tracker_corrections_total", "nftpolicy_build_info"} {
		if len(used[n]) == 0 {
			t.Errorf("%s: not found in the rules or the dashboard", n)
		}
	}
}
