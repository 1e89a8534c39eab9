package e2e

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
	ct "github.com/nftpolicy/nftpolicy/pkg/compile/compiletest"
	"github.com/nftpolicy/nftpolicy/pkg/evaluate"
)

// Disagreement is a probe whose real packets did not get the expected
// verdict, with what `nftpolicy explain` says of that flow
// (evaluate.Explain on the program the expected verdict came from): the
// deciding reason per direction and, for a denied one, the nearest misses.
// hack/compare.sh lists them for either enforcer (issue 30).
type Disagreement struct {
	// Enforcer names what enforced ("kube-network-policies", "hybrid mode").
	Enforcer string
	// Where names the probe: the case and step, or the seed and probe.
	Where string
	// Flow is "from -> to proto/port" as the caller names the ends.
	Flow string
	// Want is the expected verdict, Got what real packets did.
	Want, Got bool
	// Explanation is the evaluator's, with its nearest misses.
	Explanation evaluate.Explanation
}

// ExplainDisagreement explains the flow src -> dst (proto, port) on prog,
// as `nftpolicy explain` does, for a probe that got got instead of want.
func ExplainDisagreement(prog *compile.Program, enforcer, where, flow string, src, dst netip.Addr, proto compile.Protocol, port uint16, want, got bool) Disagreement {
	return Disagreement{Enforcer: enforcer, Where: where, Flow: flow, Want: want, Got: got,
		Explanation: evaluate.Explain(prog, src, dst, proto, port)}
}

// String is the disagreement on one line: what was expected and seen,
// then the explanation (egress and ingress with their reasons, the
// nearest misses).
func (d Disagreement) String() string {
	var b strings.Builder
	ex := d.Explanation
	fmt.Fprintf(&b, "%s: %s: %s: want %s, real packets %s; explain: %s (egress %s: %s; ingress %s: %s)",
		d.Enforcer, d.Where, d.Flow, ct.VerdictWord(d.Want), ct.VerdictWord(d.Got), ct.VerdictWord(ex.Allowed),
		ct.VerdictWord(ex.Egress), ex.EgressReason, ct.VerdictWord(ex.Ingress), ex.IngressReason)
	for _, m := range ex.NearestMiss {
		fmt.Fprintf(&b, "; nearest miss: %s %s: %s: %s", m.DirectionName, m.Rule, m.Condition, m.Detail)
	}
	return b.String()
}

// DisagreementPrefix starts each line of ListDisagreements; hack/compare.sh
// collects the lines by it.
const DisagreementPrefix = "compare_disagreement: "

// ListDisagreements writes one DisagreementPrefix line per disagreement.
func ListDisagreements(w io.Writer, ds []Disagreement) error {
	for _, d := range ds {
		if _, err := fmt.Fprintln(w, DisagreementPrefix+d.String()); err != nil {
			return err
		}
	}
	return nil
}
