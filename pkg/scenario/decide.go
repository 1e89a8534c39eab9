package scenario

import (
	"github.com/nftpolicy/nftpolicy/pkg/compile"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// Decide returns the verdict every probe of s should get: the evaluator's,
// on the program built from the whole cluster (no node's view), with
// domainNames peers matching what dnsAnswers say the pods resolved. It is
// what `nftpolicy eval` prints and what every harness holds real packets
// to. A probe whose addresses cannot be picked, which Parse rejects, gets
// the zero Verdict.
func (s *Scenario) Decide() []evaluate.Verdict {
	prog := compile.Build(s.Input("", nil, nil))
	resolved := NewResolvedAnswers(s)
	out := make([]evaluate.Verdict, len(s.Probes))
	for i, pr := range s.Probes {
		src, dst, err := s.ProbeAddrs(i)
		if err != nil {
			continue
		}
		out[i] = evaluate.EvaluateResolved(prog, resolved, src, dst, pr.ProbeProtocol(), uint16(pr.Port))
	}
	return out
}
