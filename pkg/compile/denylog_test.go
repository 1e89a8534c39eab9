package compile_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/knftables"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// denyLogInput is the deny-and-allow golden scenario on node-1 plus an Admin
// Deny rule and a Baseline Deny rule that apply to x's pods.
func denyLogInput(t *testing.T, extra ...string) compile.Input {
	t.Helper()
	in := scenariotest.GoldenInput(t, "testdata/golden/deny-and-allow.yaml")
	in.ClusterPolicies = append(in.ClusterPolicies,
		ct.CNP("no-dns-out", "Admin", 10, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")),
			ct.CNPEgress(ct.CNPRule("no-dns", "Deny", ct.ToNetworks("192.0.2.53/32")).On(ct.Proto("UDP", 53)))),
		ct.CNP("default-closed", "Baseline", 100, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")),
			ct.CNPEgress(ct.CNPRule("", "Deny", ct.ToNamespaces(ct.Sel())))),
	)
	for _, name := range extra {
		in.ClusterPolicies = append(in.ClusterPolicies,
			ct.CNP(name, "Admin", 1, ct.NamespacesSubject(ct.Sel("kubernetes.io/metadata.name", "x")),
				ct.CNPIngress(ct.CNPRule("deny-y", "Deny", ct.ToNamespaces(ct.Sel("kubernetes.io/metadata.name", "y"))))))
	}
	return in
}

func renderDump(t *testing.T, rs *compile.Ruleset) string {
	t.Helper()
	fake := knftables.NewFake(knftables.InetFamily, compile.TableName)
	tx := fake.NewTransaction()
	rs.AddTo(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("ruleset does not load into the fake: %v", err)
	}
	return fake.Dump()
}

var (
	gotoDeny  = regexp.MustCompile(`goto (deny-(d[a-z0-9]+))`)
	logPrefix = regexp.MustCompile(`counter log prefix "(d[a-z0-9]+)" group 7`)
)

func TestDenyLogRendering(t *testing.T) {
	prog := compile.Build(denyLogInput(t))
	rs, err := compile.Render(prog, compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7, DenyLogRate: 5, DenyLogBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	dump := renderDump(t, rs)

	checkGoldenFile(t, "testdata/golden/cnp-deny.hybrid-denylog.nft", dump)

	// Every policy drop is a goto to a deny chain; every deny chain logs
	// its own id, which the ruleset's table and DenyIDs(prog) both resolve.
	// (The source check drops spoofed packets, and the per-source share
	// chains what exceeds a source's share of the queue or of the log: no
	// policy's denials.)
	for _, m := range regexp.MustCompile(`(?m)^add rule inet nftpolicy (\S+) .* drop$`).FindAllStringSubmatch(dump, -1) {
		switch c := m[1]; {
		case strings.HasPrefix(c, "deny-"), c == compile.ChainDenyLogLimits, c == compile.ChainQueueHeld, c == compile.ChainQueueShare, c == compile.ChainPrerouting:
		default:
			t.Errorf("a drop rule outside the deny chains remains: %s", m[0])
		}
	}
	targets := map[string]bool{}
	for _, m := range gotoDeny.FindAllStringSubmatch(dump, -1) {
		targets[m[2]] = true
	}
	logged := map[string]bool{}
	for _, m := range logPrefix.FindAllStringSubmatch(dump, -1) {
		logged[m[1]] = true
	}
	if len(targets) != 4 {
		t.Errorf("want 4 denials (two v1 combinations, two ClusterNetworkPolicy Deny rules), got %v", targets)
	}
	if diff := cmp.Diff(targets, logged); diff != "" {
		t.Errorf("deny chains jumped to and deny chains that log differ:\n%s", diff)
	}
	if diff := cmp.Diff(rs.DenyIDs, compile.DenyIDs(prog)); diff != "" {
		t.Errorf("Ruleset.DenyIDs and DenyIDs(program) differ:\n%s", diff)
	}
	for id, info := range rs.DenyIDs {
		if !targets[id] {
			t.Errorf("DenyIDs has %s (%s), which no rule jumps to", id, info)
		}
		if info.ID() != id {
			t.Errorf("DenyIDs[%s].ID() = %s", id, info.ID())
		}
	}
	want := compile.DenyInfo{Kind: compile.DenyKindClusterNetworkPolicy, Policy: "no-dns-out", Tier: compile.TierAdmin, Rule: "no-dns", Direction: compile.Egress}
	if got, ok := rs.DenyIDs[want.ID()]; !ok || got != want {
		t.Errorf("DenyIDs[%s] = %+v, %v; want %+v", want.ID(), got, ok, want)
	}
	if !strings.Contains(dump, "add rule inet nftpolicy "+compile.DenyChainName(want.ID())+" counter jump "+compile.ChainDenyLogLimits) {
		t.Errorf("deny chain of %s does not pass the deny log's limits", want)
	}
	for _, limit := range []string{
		"update @denylog-sources-v4 { ip saddr limit rate over 5/second burst 10 packets } counter drop",
		"update @denylog-sources-v6 { ip6 saddr limit rate over 5/second burst 10 packets } counter drop",
		fmt.Sprintf("limit rate over %d/second burst %d packets counter drop", compile.DefaultDenyLogTotalRate, compile.DefaultDenyLogTotalBurst),
	} {
		if !strings.Contains(dump, "add rule inet nftpolicy "+compile.ChainDenyLogLimits+" "+limit) {
			t.Errorf("the deny log's limits lack %q", limit)
		}
	}

	// Ids depend only on what they describe: another policy leaves the
	// existing deny chains' names and rules as they were.
	rs2, err := compile.Render(compile.Build(denyLogInput(t, "another")), compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7, DenyLogRate: 5, DenyLogBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	for id := range rs.DenyIDs {
		name := compile.DenyChainName(id)
		if diff := cmp.Diff(rs.Chains[name], rs2.Chains[name], cmpopts.IgnoreUnexported(compile.Chain{})); diff != "" {
			t.Errorf("chain %s changed when a policy was added:\n%s", name, diff)
		}
	}
	if len(rs2.DenyIDs) != len(rs.DenyIDs)+1 {
		t.Errorf("adding one Deny rule: %d ids, want %d", len(rs2.DenyIDs), len(rs.DenyIDs)+1)
	}

	// Off: no deny chain, no table, plain drops.
	off, err := compile.Render(prog, compile.RenderConfig{Mode: compile.ModeHybrid})
	if err != nil {
		t.Fatal(err)
	}
	if off.DenyIDs != nil || strings.Contains(renderDump(t, off), "deny-d") {
		t.Errorf("deny log off still renders deny chains or ids: %v", off.DenyIDs)
	}
	// Queue mode drops in userspace: nothing to log in the kernel.
	q, err := compile.Render(prog, compile.RenderConfig{Mode: compile.ModeQueue, DenyLogGroup: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.DenyIDs) != 0 {
		t.Errorf("queue mode renders deny ids %v", q.DenyIDs)
	}
}

func TestDenyLogConfig(t *testing.T) {
	cfg := compile.RenderConfig{DenyLogGroup: 3}
	cfg.Defaults()
	if cfg.DenyLogRate != compile.DefaultDenyLogRate || cfg.DenyLogBurst != compile.DefaultDenyLogBurst {
		t.Errorf("defaults: rate %d burst %d", cfg.DenyLogRate, cfg.DenyLogBurst)
	}
	cfg.DenyLogBurst = 0
	if err := cfg.Validate(); err == nil {
		t.Error("burst 0 with a log group: want an error")
	}
	off := compile.RenderConfig{}
	off.Defaults()
	if off.DenyLogRate != 0 || off.Validate() != nil {
		t.Errorf("deny log off: rate %d, validate %v", off.DenyLogRate, off.Validate())
	}
}
