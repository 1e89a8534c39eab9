package compile

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// DomainPattern is one entry of a ClusterNetworkPolicy domainNames peer,
// normalized: lower case, no trailing dot. The API (network-policy-api
// v0.3.0, type DomainName): an exact name matches only itself; "*.suffix"
// matches every name with one or more whole labels before ".suffix", and
// not "suffix" itself. DNS names compare case-insensitively, and a trailing
// dot (the fully qualified spelling) changes nothing.
type DomainPattern struct {
	// Suffix is the name, or for a wildcard what follows "*.".
	Suffix string
	// Wildcard is true for "*.suffix".
	Wildcard bool
}

// String returns the pattern as the API spells it, normalized.
func (p DomainPattern) String() string {
	if p.Wildcard {
		return "*." + p.Suffix
	}
	return p.Suffix
}

// Matches reports whether a normalized name (NormalizeDomain) matches.
func (p DomainPattern) Matches(name string) bool {
	if !p.Wildcard {
		return name == p.Suffix
	}
	// At least one whole label before the suffix: "x.suffix", never
	// "suffix" and never "xsuffix".
	return len(name) > len(p.Suffix)+1 && strings.HasSuffix(name, p.Suffix) && name[len(name)-len(p.Suffix)-1] == '.'
}

// domainNameRE is the CRD's validation pattern of DomainName.
var domainNameRE = regexp.MustCompile(`^(\*\.)?([a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-Z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`)

// ParseDomainPattern validates a domainNames entry with the CRD's pattern
// (which admits no bare top-level name, no "*" inside a label and no "*"
// anywhere but as the first label) and normalizes it.
func ParseDomainPattern(s string) (DomainPattern, error) {
	if len(s) > 253+2 || !domainNameRE.MatchString(s) {
		return DomainPattern{}, fmt.Errorf("%q is not a domain name or a \"*.\" wildcard followed by one (at least two labels; \"*\" only as the whole first label)", s)
	}
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		return DomainPattern{Suffix: NormalizeDomain(rest), Wildcard: true}, nil
	}
	return DomainPattern{Suffix: NormalizeDomain(s)}, nil
}

// NormalizeDomain lower-cases a DNS name and drops its trailing dot, the
// form patterns compare against.
func NormalizeDomain(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// DomainsMatch reports whether a normalized name matches any pattern.
func DomainsMatch(ps []DomainPattern, name string) bool {
	for _, p := range ps {
		if p.Matches(name) {
			return true
		}
	}
	return false
}

// clusterDomainPeer compiles a domainNames peer into the rule's patterns.
// The API allows domainNames in Accept rules only: in a Deny or Pass rule
// (which the CRD rejects) the rule fails closed.
func clusterDomainPeer(r *ClusterRule, path *field.Path, names []npav1beta1.DomainName, failPart func(*field.Path, string, ...any)) {
	if r.Action != ActionAccept {
		failPart(path, "domainNames peers are allowed in Accept rules only")
		return
	}
	if len(names) == 0 {
		failPart(path, "must list at least one domain name")
		return
	}
	for i, n := range names {
		p, err := ParseDomainPattern(string(n))
		if err != nil {
			failPart(path.Index(i), "%v", err)
			continue
		}
		r.Domains = append(r.Domains, p)
	}
}

// sortDomains sorts a rule's patterns and drops repeated ones, once all its
// peers are compiled.
func sortDomains(ps []DomainPattern) []DomainPattern {
	sort.Slice(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.Suffix != b.Suffix {
			return a.Suffix < b.Suffix
		}
		return !a.Wildcard && b.Wildcard
	})
	return slices.Compact(ps)
}

// FQDNRule is an egress rule with domainNames peers as DNS learning sees
// it: which local pods it applies to, what names it admits, and the kernel
// sets (hybrid and kernel modes) that hold "pod address . learned address"
// for it.
type FQDNRule struct {
	Policy ClusterPolicyID
	// Index is the rule's position in spec.egress.
	Index   int
	Rule    *ClusterRule
	Domains []DomainPattern
	// Subjects are the local pods the policy applies to, in pod order.
	Subjects []PodID
	// SetV4 and SetV6 name the rule's learned-address sets.
	SetV4, SetV6 string
}

// Set returns the rule's set for an address family.
func (r *FQDNRule) Set(v4 bool) string {
	if v4 {
		return r.SetV4
	}
	return r.SetV6
}

// domainsKey is the patterns as the API spells them, comma-separated.
func domainsKey(domains []DomainPattern) string {
	names := make([]string, len(domains))
	for i, d := range domains {
		names[i] = d.String()
	}
	return strings.Join(names, ",")
}

// FQDNRules lists the egress rules with domainNames peers that apply to a
// local pod, in policy order then rule order.
func (p *Program) FQDNRules() []FQDNRule {
	var out []FQDNRule
	for id := range p.ClusterPolicies {
		cp := &p.ClusterPolicies[id]
		if len(cp.Subjects) == 0 {
			continue
		}
		for i := range cp.Egress {
			r := &cp.Egress[i]
			if r.Disabled || len(r.Domains) == 0 {
				continue
			}
			out = append(out, FQDNRule{Policy: ClusterPolicyID(id), Index: i, Rule: r, Domains: r.Domains, Subjects: cp.Subjects,
				SetV4: FQDNSetName(cp, i, true), SetV6: FQDNSetName(cp, i, false)})
		}
	}
	return out
}
