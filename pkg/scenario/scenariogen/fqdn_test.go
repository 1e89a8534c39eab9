package scenariogen

import (
	"testing"

	"github.com/nftpolicy/nftpolicy/pkg/scenario"
)

// TestDomainCoverage: some seeds get domainNames rules and answers, and the
// answers matter: some probe goes to an address a pod resolved.
func TestDomainCoverage(t *testing.T) {
	withRules, probed := 0, 0
	for seed := uint64(0); seed < 200; seed++ {
		s := Generate(seed)
		if len(s.DNSAnswers) == 0 {
			continue
		}
		withRules++
		ips := map[string]bool{}
		for _, a := range s.DNSAnswers {
			for _, ip := range a.IPs {
				ips[ip] = true
			}
		}
		for _, pr := range s.Probes {
			if ips[pr.To.IP] {
				probed++
				break
			}
		}
		if _, err := scenario.Parse(mustYAML(t, s)); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	t.Logf("seeds 0-199: %d with domainNames, %d probing a resolved address", withRules, probed)
	if withRules < 10 || probed < withRules/2 {
		t.Errorf("seeds 0-199: %d with domainNames, %d probing a resolved address", withRules, probed)
	}
}

func mustYAML(t *testing.T, s *scenario.Scenario) []byte {
	t.Helper()
	b, err := YAML(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
