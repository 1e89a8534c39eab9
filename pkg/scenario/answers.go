package scenario

import (
	"net/netip"

	"github.com/nftpolicy/nftpolicy/pkg/compile"
)

// ResolvedAnswers is a fixed record of what a scenario's pods resolved
// (its dnsAnswers): the evaluator's view of DNS learning when no agent
// learns (a evaluate.Resolver). TTLs do not expire it. The zero value knows
// nothing.
type ResolvedAnswers struct {
	byPod map[netip.Addr][]resolvedName
}

type resolvedName struct {
	name string
	ips  []netip.Addr
}

// NewResolvedAnswers indexes dnsAnswers by the addresses of the pods that
// resolved them. Answers of unknown pods or with unparsable addresses are
// skipped (Parse rejects them).
func NewResolvedAnswers(s *Scenario) *ResolvedAnswers {
	ra := &ResolvedAnswers{byPod: map[netip.Addr][]resolvedName{}}
	pods := map[string][]netip.Addr{}
	for i := range s.Pods {
		p := &s.Pods[i]
		pods[p.Key()] = append(pods[p.Key()], p.Addrs()...)
	}
	for _, a := range s.DNSAnswers {
		rn := resolvedName{name: compile.NormalizeDomain(a.Name)}
		for _, ip := range a.IPs {
			if x, err := netip.ParseAddr(ip); err == nil {
				rn.ips = append(rn.ips, x.Unmap())
			}
		}
		for _, pa := range pods[a.Pod] {
			ra.byPod[pa] = append(ra.byPod[pa], rn)
		}
	}
	return ra
}

// Resolved reports whether the pod at podAddr resolved a name matching one
// of the patterns to peer.
func (ra *ResolvedAnswers) Resolved(podAddr, peer netip.Addr, domains []compile.DomainPattern) bool {
	if ra == nil {
		return false
	}
	for _, rn := range ra.byPod[podAddr] {
		if !compile.DomainsMatch(domains, rn.name) {
			continue
		}
		for _, ip := range rn.ips {
			if ip == peer {
				return true
			}
		}
	}
	return false
}

// FQDNSeedElements are the elements a kernel harness writes into the fqdn
// sets of a program so that they hold what the scenario's pods resolved:
// set name -> elements "pod . address". Scenario harnesses use it to check
// the kernel against the evaluator, which does not expire scenario answers:
// seeds get a timeout that outlasts the probes, not the answers' TTLs.
func FQDNSeedElements(p *compile.Program, s *Scenario) map[string][]SeedElement {
	ra := NewResolvedAnswers(s)
	out := map[string][]SeedElement{}
	for _, fr := range p.FQDNRules() {
		for _, pid := range fr.Subjects {
			for _, pa := range p.Pods[pid].IPs {
				for _, rn := range ra.byPod[pa] {
					if !compile.DomainsMatch(fr.Domains, rn.name) {
						continue
					}
					for _, ip := range rn.ips {
						if ip.Is4() != pa.Is4() {
							continue
						}
						set := fr.Set(pa.Is4())
						out[set] = append(out[set], SeedElement{Pod: pa, Addr: ip})
					}
				}
			}
		}
	}
	return out
}

// SeedElement is one learned "pod address . peer address" element.
type SeedElement struct {
	Pod, Addr netip.Addr
}
