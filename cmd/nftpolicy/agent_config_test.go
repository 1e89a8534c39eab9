package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/config"
	"github.com/nftpolicy/nftpolicy/pkg/controller"
	"github.com/nftpolicy/nftpolicy/pkg/denylog"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/fqdn"
	"github.com/nftpolicy/nftpolicy/pkg/queue"
	"github.com/nftpolicy/nftpolicy/pkg/staged"
	"github.com/nftpolicy/nftpolicy/pkg/verify"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: nftpolicy.io/v1alpha1\nkind: AgentConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAgentConfigFlagsOverFile: the file's settings replace the defaults,
// and a flag given on the command line replaces the file's setting, before
// or after --config; what neither names keeps its default.
func TestAgentConfigFlagsOverFile(t *testing.T) {
	file := writeConfig(t, "mode: queue\nfullSyncPeriod: 1h\ndenyLog:\n  group: 200\n  linesPerSecond: 9\ndns:\n  servers: [10.0.0.10]\n")
	for _, args := range [][]string{
		{"--mode=kernel", "--config", file, "--deny-log-group=300", "--dns-servers=10.0.0.53"},
		{"--config=" + file, "--deny-log-group", "300", "--mode", "kernel", "--dns-servers=10.0.0.53"},
	} {
		o := &agentOptions{}
		var stderr bytes.Buffer
		if code, ok := parseAgentArgs(o, args, &stderr, "usage"); !ok {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		want := config.Default()
		want.Mode = "kernel"                     // flag over file
		want.FullSyncPeriod.Duration = time.Hour // file
		want.DenyLog.Group = 300                 // flag over file
		want.DenyLog.LinesPerSecond = 9          // file
		want.DNS.Servers = []string{"10.0.0.53"} // flag over file, not appended
		if d := cmp.Diff(want, o.cfg); d != "" {
			t.Errorf("%v: effective configuration (-want +got):\n%s", args, d)
		}
		if o.mode != "kernel" || o.fullSyncPeriod != time.Hour || o.denyLog.group != 300 || o.denyLog.linesPerSec != 9 ||
			!slices.Equal(o.fqdn.servers, []string{"10.0.0.53"}) || o.newPod.wait != evaluate.DefaultUnknownPodWait {
			t.Errorf("%v: options not applied: %+v", args, o)
		}
	}
}

// TestAgentConfigBadInput: a misspelled field in the file, a file that
// cannot be read and a bad value (from the file or a flag) stop the agent
// with exit 2 before it starts, naming the field or flag.
func TestAgentConfigBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", writeConfig(t, "mode: queue\nqueue:\n  nmu: 7\n")}, `unknown field "queue.nmu"`},
		{[]string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}, "absent.yaml"},
		{[]string{"--config", writeConfig(t, "mode: enforce\n")}, "mode (--mode)"},
		{[]string{"--config", writeConfig(t, "livenessTimeout: 1s\n")}, "livenessTimeout (--liveness-timeout)"},
		{[]string{"--config", writeConfig(t, ""), "--queue-variant=nfq"}, "queue.variant (--queue-variant)"},
		{[]string{"--config", writeConfig(t, "costBudgets:\n  policy: 0\n")}, "costBudgets.policy (--policy-cost-budget)"},
	} {
		var stdout, stderr bytes.Buffer
		code := runAgent(tc.args, &stdout, &stderr)
		if code != exitBadInput || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, stderr.String(), exitBadInput, tc.want)
		}
	}
}

// TestAgentFlagsAreSettings: every flag of the agent is a setting of
// AgentConfiguration (or the logging configuration's), except the few
// that name this node and pod (config.CommandLineOnlyFlags, listed in
// docs/config.md).
func TestAgentFlagsAreSettings(t *testing.T) {
	settings := map[string]bool{}
	for _, f := range config.Fields() {
		settings[f.Flag] = true
	}
	logging := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	config.Default().AddFlags(logging)
	var agentOnlyFlags []string
	for _, f := range config.CommandLineOnlyFlags {
		agentOnlyFlags = append(agentOnlyFlags, f.Name)
	}
	o := &agentOptions{}
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	o.addFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if !settings[f.Name] && logging.Lookup(f.Name) == nil && !slices.Contains(agentOnlyFlags, f.Name) {
			t.Errorf("--%s: neither a setting of AgentConfiguration nor in config.CommandLineOnlyFlags", f.Name)
		}
	})
	for _, name := range agentOnlyFlags {
		if fs.Lookup(name) == nil {
			t.Errorf("config.CommandLineOnlyFlags names --%s, which the agent does not have", name)
		}
	}
}

// TestConfigDefaultsMatchPackages: the configuration's defaults (pkg/config
// imports nothing of the kernel side, so it states them) are the defaults
// of the packages that read them when a value is left zero.
func TestConfigDefaultsMatchPackages(t *testing.T) {
	c := config.Default()
	for name, pair := range map[string][2]any{
		"queue.maxLength":              {c.Queue.MaxLength, uint32(queue.DefaultMaxQueueLen)},
		"queue.count":                  {c.Queue.Count, uint16(queuesPerCPU)},
		"queue.sourceRate":             {c.Queue.SourceRate, uint32(compile.DefaultQueueSourceRate)},
		"queue.sourceBurst":            {c.Queue.SourceBurst, uint32(compile.DefaultQueueSourceBurst)},
		"tunnel.udpPorts":              {c.Tunnel.UDPPorts, compile.DefaultTunnelUDPPorts},
		"mode":                         {c.Mode, string(compile.ModeHybrid)},
		"programRefreshDelay":          {c.ProgramRefreshDelay.Duration, controller.DefaultProgramRefreshDelay},
		"clusterPolicyCheckPeriod":     {c.ClusterPolicyCheckPeriod.Duration, controller.DefaultClusterPolicyCheckPeriod},
		"livenessTimeout minimum":      {config.MinLivenessTimeout, controller.MinHealthBudget},
		"costBudgets.policy":           {c.CostBudgets.Policy, compile.DefaultPolicyBudget},
		"costBudgets.namespace":        {c.CostBudgets.Namespace, compile.DefaultNamespaceBudget},
		"costBudgets.clusterPolicy":    {c.CostBudgets.ClusterPolicy, compile.DefaultClusterPolicyBudget},
		"denyLog.group":                {c.DenyLog.Group, uint16(denylog.DefaultGroup)},
		"denyLog.kernelRate":           {c.DenyLog.KernelRate, uint32(compile.DefaultDenyLogRate)},
		"denyLog.kernelTotalRate":      {c.DenyLog.KernelTotalRate, uint32(compile.DefaultDenyLogTotalRate)},
		"denyLog.flowInterval":         {c.DenyLog.FlowInterval.Duration, denylog.DefaultFlowInterval},
		"denyLog.linesPerSecond":       {c.DenyLog.LinesPerSecond, denylog.DefaultLinesPerSec},
		"stagedLog.group":              {c.StagedLog.Group, uint16(staged.DefaultGroup)},
		"stagedLog.kernelRate":         {c.StagedLog.KernelRate, uint32(compile.DefaultStagedLogRate)},
		"stagedLog.kernelTotalRate":    {c.StagedLog.KernelTotalRate, uint32(compile.DefaultStagedLogTotalRate)},
		"stagedLog.flowInterval":       {c.StagedLog.FlowInterval.Duration, denylog.DefaultFlowInterval},
		"stagedLog.linesPerSecond":     {c.StagedLog.LinesPerSecond, denylog.DefaultLinesPerSec},
		"verify.logGroup":              {c.Verify.LogGroup, uint16(verify.DefaultGroup)},
		"verify.kernelRate":            {c.Verify.KernelRate, uint32(compile.DefaultVerifySourceRate)},
		"unknownPods.wait":             {c.UnknownPods.Wait.Duration, evaluate.DefaultUnknownPodWait},
		"unknownPods.sourceRate":       {c.UnknownPods.SourceRate, uint32(compile.DefaultHeldSourceRate)},
		"unknownPods.sourceBurst":      {c.UnknownPods.SourceBurst, uint32(compile.DefaultHeldSourceBurst)},
		"dns.minTTL":                   {c.DNS.MinTTL.Duration, fqdn.DefaultMinTTL},
		"dns.maxTTL":                   {c.DNS.MaxTTL.Duration, fqdn.DefaultMaxTTL},
		"dns.maxNamesPerPod":           {c.DNS.MaxNamesPerPod, fqdn.DefaultMaxNamesPerPod},
		"dns.maxAddressesPerPod":       {c.DNS.MaxAddressesPerPod, fqdn.DefaultMaxAddrsPerPod},
		"dns.queryTimeout":             {c.DNS.QueryTimeout.Duration, fqdn.DefaultQueryTimeout},
		"previewSocket (install.yaml)": {"/run/nftpolicy-preview/preview.sock", defaultPreviewSocket},
	} {
		if d := cmp.Diff(pair[1], pair[0]); d != "" {
			t.Errorf("%s: config default differs from the package's (-package +config):\n%s", name, d)
		}
	}
}

// TestConfigzServesEffectiveConfig: /configz is the effective
// configuration as JSON that decodes back into it; it is read-only.
func TestConfigzServesEffectiveConfig(t *testing.T) {
	c := config.Default()
	c.Mode, c.Metrics.TLSCertFile = "queue", "/etc/tls/cert.pem"
	h, err := configzHandler(c)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	got, err := config.Decode(body)
	if err != nil {
		t.Fatalf("/configz does not decode as an AgentConfiguration: %v\n%s", err, body)
	}
	if d := cmp.Diff(c, got); d != "" {
		t.Errorf("/configz (-want +got):\n%s", d)
	}
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: status %d, want 405", resp.StatusCode)
	}
}
