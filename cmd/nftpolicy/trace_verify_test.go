package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
	"github.com/nftpolicy/nftpolicy/pkg/scenario/scenariotest"
)

// With runtime verification sampling every decision, the kernel loads
// the ruleset and the trace of explain --from-ruleset agrees with the
// evaluator; at 100% it may end at a rule's sampled copy (nft lists the
// copy's family check as the address's implicit dependency), which has
// the rule's verdict and comment, and then names no denial by the
// sample's id.
func TestTraceWithVerification(t *testing.T) {
	prog := compile.Build(scenariotest.GoldenInput(t, "../../pkg/compile/testdata/golden/cluster-tiers.yaml"))
	listing := kernelListing(t, prog, compile.RenderConfig{Mode: compile.ModeHybrid, DenyLogGroup: 7, SkipUnknownPods: true,
		Verify: compile.VerifyConfig{Group: 9, PerMillion: compile.VerifyPerMillion}})
	if !strings.Contains(string(listing), `"prefix": "v`) && !strings.Contains(string(listing), `"prefix":"v`) {
		t.Fatal("no sampled rule in the kernel's listing")
	}
	var addrs []netip.Addr
	for i := range prog.Pods {
		addrs = append(addrs, prog.Pods[i].IPs...)
	}
	addrs = append(addrs, netip.MustParseAddr("192.0.2.1"))
	for _, na := range prog.NodeAddrs {
		addrs = append(addrs, na...)
	}
	for _, src := range addrs {
		for _, dst := range addrs {
			if src.Is4() != dst.Is4() {
				continue
			}
			for _, port := range []uint16{80, 10250} {
				tr, err := TraceRuleset(listing, src, dst, compile.ProtoTCP, port)
				if err != nil {
					t.Fatalf("%s -> %s: %v", src, dst, err)
				}
				v := evaluate.Evaluate(prog, src, dst, compile.ProtoTCP, port)
				if (tr.Verdict == "accept") != v.Allowed {
					t.Errorf("%s -> %s %d: kernel %s (%v), evaluator %v (%s)", src, dst, port, tr.Verdict, tr.Steps, v.Allowed, v.Reason())
				}
				if compile.IsVerifyID(tr.DenyID) || (tr.Verdict == "drop" && (tr.DenyID == "" || tr.Comment == "")) {
					t.Errorf("%s -> %s %d: deny id %q, deciding rule %q", src, dst, port, tr.DenyID, tr.Comment)
				}
			}
		}
	}
}
