package compile

import (
	"fmt"
	"net/netip"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// problems collects Problems for one policy.
type problems struct {
	policy  string
	cluster bool
	list    []Problem
}

func (p *problems) add(path *field.Path, format string, args ...any) {
	p.list = append(p.list, Problem{Cluster: p.cluster, Policy: p.policy, Field: path.String(), Message: fmt.Sprintf(format, args...)})
}

// parseSelector converts a label selector, reporting why it is unusable.
// A nil selector is reported as absent (ok=false, no problem): callers decide
// what absence means.
func (p *problems) parseSelector(path *field.Path, sel *metav1.LabelSelector) (labels.Selector, bool) {
	if sel == nil {
		return nil, false
	}
	errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, path)
	if len(errs) > 0 {
		for _, e := range errs {
			p.list = append(p.list, Problem{Cluster: p.cluster, Policy: p.policy, Field: e.Field, Message: e.ErrorBody()})
		}
		return nil, false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		p.add(path, "%v", err)
		return nil, false
	}
	return s, true
}

// port is a validated networkingv1.NetworkPolicyPort.
type port struct {
	proto Protocol
	// named is the port name; empty for numbered ports and protocol-only entries.
	named       string
	first, last uint16
}

// parsePort applies the API's defaulting (protocol TCP) and validation to one
// port entry.
func (p *problems) parsePort(path *field.Path, np networkingv1.NetworkPolicyPort) (port, bool) {
	out := port{proto: ProtoTCP, first: 0, last: 65535}
	if np.Protocol != nil {
		proto, ok := ParseProtocol(string(*np.Protocol))
		if !ok {
			p.add(path.Child("protocol"), "unsupported protocol %q: must be TCP, UDP or SCTP", *np.Protocol)
			return port{}, false
		}
		out.proto = proto
	}
	if np.Port == nil {
		if np.EndPort != nil {
			p.add(path.Child("endPort"), "may not be specified without port")
			return port{}, false
		}
		return out, true
	}
	if np.Port.Type == 1 { // intstr.String
		name := np.Port.StrVal
		if msgs := validation.IsValidPortName(name); len(msgs) > 0 {
			p.add(path.Child("port"), "invalid port name %q: %s", name, strings.Join(msgs, "; "))
			return port{}, false
		}
		if np.EndPort != nil {
			p.add(path.Child("endPort"), "may not be specified with a named port (%q)", name)
			return port{}, false
		}
		out.named = name
		return out, true
	}
	n := np.Port.IntVal
	if n < 1 || n > 65535 {
		p.add(path.Child("port"), "port %d out of range 1-65535", n)
		return port{}, false
	}
	out.first, out.last = uint16(n), uint16(n)
	if np.EndPort != nil {
		e := *np.EndPort
		if e < n || e > 65535 {
			p.add(path.Child("endPort"), "endPort %d must be between port %d and 65535", e, n)
			return port{}, false
		}
		out.last = uint16(e)
	}
	return out, true
}

// policyTypes applies the API's defaulting: Ingress always, Egress when the
// policy has egress rules. An unknown type isolates both directions, which
// is the reading that can only deny more.
func (p *problems) policyTypes(spec *networkingv1.NetworkPolicySpec) (ingress, egress bool) {
	if len(spec.PolicyTypes) == 0 {
		return true, len(spec.Egress) > 0
	}
	path := field.NewPath("spec", "policyTypes")
	if len(spec.PolicyTypes) > 2 {
		p.add(path, "may not have more than 2 entries")
	}
	for i, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			p.add(path.Index(i), "unsupported policy type %q: treated as isolating both directions", t)
			return true, true
		}
	}
	return ingress, egress
}

// ValidatePolicy reports the problems the compiler finds in a policy, the
// same checks the API server's validation makes for the fields NetworkPolicy
// semantics depend on. A scenario containing a policy with problems is
// rejected; a policy with problems met at run time is enforced safely.
func ValidatePolicy(np *networkingv1.NetworkPolicy) []Problem {
	c := newBuilder(Input{})
	pol := c.compilePolicyShape(np)
	pr := &problems{policy: pol.Key, list: pol.Problems}
	// The API server (v1.33+) also rejects CIDRs with host bits set. The
	// compiler masks them instead, so that objects stored under older rules
	// are still enforced; only validation insists on the canonical form.
	checkCanonical := func(path *field.Path, peers []networkingv1.NetworkPolicyPeer) {
		for i, peer := range peers {
			if peer.IPBlock == nil {
				continue
			}
			pp := path.Index(i).Child("ipBlock")
			for j, c := range append([]string{peer.IPBlock.CIDR}, peer.IPBlock.Except...) {
				f := pp.Child("cidr")
				if j > 0 {
					f = pp.Child("except").Index(j - 1)
				}
				if pfx, err := netip.ParsePrefix(c); err == nil && pfx.Masked() != pfx {
					pr.add(f, "%s must not have bits set beyond the prefix length (%s)", c, pfx.Masked())
				}
			}
		}
	}
	for i, r := range np.Spec.Ingress {
		checkCanonical(field.NewPath("spec", "ingress").Index(i).Child("from"), r.From)
	}
	for i, r := range np.Spec.Egress {
		checkCanonical(field.NewPath("spec", "egress").Index(i).Child("to"), r.To)
	}
	return pr.list
}
