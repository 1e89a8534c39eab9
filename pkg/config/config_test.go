package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// TestDecodeStrict: an unknown or misspelled field, at the top or nested, a
// field in the wrong case, a field given twice, a value of the wrong type
// and a wrong apiVersion or kind are errors that name the field.
func TestDecodeStrict(t *testing.T) {
	const head = "apiVersion: nftpolicy.io/v1alpha1\nkind: AgentConfiguration\n"
	for _, tc := range []struct{ name, data, want string }{
		{"unknown", head + "mdoe: queue\n", `unknown field "mdoe"`},
		{"nested", head + "denyLog:\n  enabeld: false\n", `unknown field "denyLog.enabeld"`},
		{"case", head + "Mode: queue\n", `unknown field "Mode"`},
		{"duplicate", head + "mode: queue\nmode: kernel\n", `"mode"`},
		{"type", head + "queue:\n  num: many\n", "queue.num"},
		{"range", head + "tunnel:\n  udpPorts: [70000]\n", "tunnel.udpPorts"},
		{"duration", head + "fullSyncPeriod: often\n", "often"},
		{"apiVersion", "apiVersion: nftpolicy.io/v1\nkind: AgentConfiguration\n", "apiVersion"},
		{"kind", "apiVersion: nftpolicy.io/v1alpha1\n", "kind"},
		{"not yaml", head + "mode: [\n", "decoding"},
	} {
		_, err := Decode([]byte(tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestDecodeKeepsDefaults: the fields a file gives replace the defaults,
// nested ones one by one; the others keep their defaults.
func TestDecodeKeepsDefaults(t *testing.T) {
	c, err := Decode([]byte(`apiVersion: nftpolicy.io/v1alpha1
kind: AgentConfiguration
mode: queue
fullSyncPeriod: 1h
denyLog:
  group: 200
tunnel:
  udpPorts: []
logging:
  verbosity: 3
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Mode = "queue"
	want.FullSyncPeriod.Duration = time.Hour
	want.DenyLog.Group = 200
	want.Tunnel.UDPPorts = []uint16{}
	want.Logging.Verbosity = 3
	if d := cmp.Diff(want, c); d != "" {
		t.Errorf("decoded (-want +got):\n%s", d)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

// TestDefaultIsValid: the defaults pass their own validation.
func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidate: each bad value is refused, naming the setting's path in
// the file and its flag.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		set  func(c *AgentConfiguration)
		want string
	}{
		{func(c *AgentConfiguration) { c.Mode = "enforce" }, "mode (--mode)"},
		{func(c *AgentConfiguration) { c.Queue.Variant = "nfq" }, "queue.variant (--queue-variant)"},
		{func(c *AgentConfiguration) { c.Metrics.Auth = "token" }, "metrics.auth (--metrics-auth)"},
		{func(c *AgentConfiguration) { c.Metrics.TLSCertFile = "/c" }, "metrics.tlsCertFile"},
		{func(c *AgentConfiguration) { c.Metrics.Auth, c.Metrics.TLSCertFile = MetricsAuthDelegated, "/c" }, "metrics.tlsPrivateKeyFile"},
		{func(c *AgentConfiguration) { c.LivenessTimeout.Duration = time.Second }, "livenessTimeout (--liveness-timeout)"},
		{func(c *AgentConfiguration) { c.CostBudgets.Policy = 0 }, "costBudgets.policy (--policy-cost-budget)"},
		{func(c *AgentConfiguration) { c.CostBudgets.Namespace = -1 }, "costBudgets.namespace (--namespace-cost-budget)"},
		{func(c *AgentConfiguration) { c.Queue.SourceRate = 0 }, "queue.sourceRate (--queue-source-rate)"},
		{func(c *AgentConfiguration) { c.UnknownPods.SourceBurst = 0 }, "unknownPods.sourceBurst (--unknown-pod-source-burst)"},
		{func(c *AgentConfiguration) { c.Tunnel.UDPPorts = []uint16{4789, 0} }, "tunnel.udpPorts[1]"},
		{func(c *AgentConfiguration) { c.Tunnel.Peers = []string{"nope"} }, "tunnel.peers[0]"},
		{func(c *AgentConfiguration) { c.DNS.Servers = []string{"10.0.0.1", "dns"} }, "dns.servers[1]"},
		{func(c *AgentConfiguration) { c.UnknownPods.PodCIDRs = []string{"10.0.0.1"} }, "unknownPods.podCIDRs[0]"},
		{func(c *AgentConfiguration) { c.DNS.Service = "kube-dns" }, "dns.service (--dns-service)"},
		{func(c *AgentConfiguration) { c.DNS.MaxTTL.Duration = time.Second }, "dns.maxTTL (--fqdn-max-ttl)"},
		{func(c *AgentConfiguration) { c.DNS.MaxNamesPerPod = -1 }, "dns.maxNamesPerPod (--fqdn-max-names-per-pod)"},
		{func(c *AgentConfiguration) { c.Verify.Rate = 1.5 }, "verify.rate (--verify-rate)"},
		{func(c *AgentConfiguration) { c.Verify.Rate, c.Verify.LogGroup = 0.5, 0 }, "verify.logGroup (--verify-log-group)"},
		{func(c *AgentConfiguration) { c.StagedLog.LinesPerSecond = -1 }, "stagedLog.linesPerSecond (--staged-log-lines-per-second)"},
		{func(c *AgentConfiguration) { c.DenyLog.FlowInterval.Duration = 0 }, "denyLog.flowInterval (--deny-log-flow-interval)"},
		{func(c *AgentConfiguration) { c.UnknownPods.Wait.Duration = 0 }, "unknownPods.wait (--unknown-pod-wait)"},
		{func(c *AgentConfiguration) { c.FullSyncPeriod.Duration = -time.Second }, "fullSyncPeriod (--full-sync-period)"},
		{func(c *AgentConfiguration) { c.Logging.Format = "xml" }, "logging.format"},
	} {
		c := Default()
		tc.set(c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %q", err, tc.want)
		}
	}
}

// flagValue returns a value other than v's for its flag, as flag text, and
// the field's value after the flag is set to it.
func flagValue(t *testing.T, v reflect.Value) (string, any) {
	t.Helper()
	switch x := v.Interface().(type) {
	case bool:
		return map[bool]string{true: "false", false: "true"}[x], !x
	case string:
		return "x", "x"
	case uint16:
		return "7", uint16(7)
	case uint32:
		return "7", uint32(7)
	case int:
		return "7", 7
	case float64:
		return "0.5", 0.5
	case []string:
		return "a,b", []string{"a", "b"}
	case []uint16:
		return "7,9", []uint16{7, 9}
	}
	if v.Type().Name() == "Duration" {
		f := v.Field(0)
		return "7s", reflect.ValueOf(7 * time.Second).Convert(f.Type()).Interface()
	}
	t.Fatalf("no test value for %s", v.Type())
	return "", nil
}

// TestFlagsSetTheirFields: each setting's flag (its flag tag) exists, and
// setting it changes that field and nothing else; every flag AddFlags adds
// is a setting's or the logging configuration's.
func TestFlagsSetTheirFields(t *testing.T) {
	c := Default()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	c.AddFlags(fs)
	seen := map[string]bool{}
	for _, f := range Fields() {
		if f.Flag == "" {
			t.Errorf("%s: no flag", f.Path)
			continue
		}
		seen[f.Flag] = true
		c := Default()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.AddFlags(fs)
		want := Default()
		fv := reflect.ValueOf(want).Elem().FieldByIndex(f.Index)
		text, val := flagValue(t, fv)
		if fv.Type().Name() == "Duration" {
			fv = fv.Field(0)
		}
		fv.Set(reflect.ValueOf(val))
		if err := fs.Parse([]string{"--" + f.Flag + "=" + text}); err != nil {
			t.Errorf("%s: %v", f.Path, err)
			continue
		}
		if d := cmp.Diff(want, c); d != "" {
			t.Errorf("--%s=%s (-want +got):\n%s", f.Flag, text, d)
		}
	}
	logging := map[string]bool{"logging-format": true, "log-flush-frequency": true, "v": true, "vmodule": true,
		"log-json-info-buffer-size": true, "log-json-split-stream": true, "log-text-info-buffer-size": true, "log-text-split-stream": true}
	fs.VisitAll(func(fl *pflag.Flag) {
		if !seen[fl.Name] && !logging[fl.Name] {
			t.Errorf("--%s sets no field of AgentConfiguration", fl.Name)
		}
	})
}

// TestPortsFlag: an empty --tunnel-udp-ports is no ports (not the
// defaults); ports past 65535 and 0 are refused.
func TestPortsFlag(t *testing.T) {
	parse := func(args ...string) ([]uint16, error) {
		c := Default()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.AddFlags(fs)
		err := fs.Parse(args)
		return c.Tunnel.UDPPorts, err
	}
	if p, err := parse("--tunnel-udp-ports="); err != nil || p == nil || len(p) != 0 {
		t.Errorf("empty: %#v %v", p, err)
	}
	if p, err := parse("--tunnel-udp-ports=1", "--tunnel-udp-ports=2,3"); err != nil || !reflect.DeepEqual(p, []uint16{1, 2, 3}) {
		t.Errorf("twice: %v %v", p, err)
	}
	for _, bad := range []string{"0", "65536", "x"} {
		if _, err := parse("--tunnel-udp-ports=" + bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
