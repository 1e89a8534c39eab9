package bench

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// TestStagedOtherConnInput: hybrid_staged_other measures staged policies
// that cannot change the bench's connections only if the ruleset of each
// node copies its other pod's connections and none of the bench pods'.
func TestStagedOtherConnInput(t *testing.T) {
	bench := []netip.Addr{clientIP, sameSrvIP, crossSrvIP}
	for i, node := range benchNodes {
		cfg := compile.RenderConfig{Mode: compile.ModeHybrid, StagedLogGroup: 101}
		cfg.Defaults()
		rs, err := compile.Render(compile.Build(stagedOtherConnInput(node, []netip.Addr{netip.MustParseAddr("192.168.0.1")})), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var staged []netip.Addr
		for name, s := range rs.Sets {
			if strings.HasPrefix(name, "staged-") {
				for _, e := range s.Elements {
					staged = append(staged, e.Addr)
				}
			}
		}
		if other := netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 200}); !slices.Contains(staged, other) {
			t.Errorf("%s: the staged subject sets %v lack the other pod %s", node, staged, other)
		}
		for _, ip := range bench {
			if slices.Contains(staged, ip) {
				t.Errorf("%s: bench pod %s is a staged subject (%v)", node, ip, staged)
			}
		}
	}
}
